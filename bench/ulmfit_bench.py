"""From scratch vs from a language model made with the LM pipeline, on real text, per seed.

    python bench/ulmfit_bench.py [--corpus debian|debian-sections|docstrings] [--seeds 1,2,3]
        [--output runs/ulmfit] [--lm-assets DIR] [--lm-epochs N]
        [--model-config '{"emb_sz": 200, "n_hid": 512, "n_layers": 2}']
        [--epochs 12] [--monitor f1_score] [--fine-tune-epochs 2] [--batch-size 32]
        [--drop-mult 0.3] [--lm-corpus task|english] [--man-characters 8000000]

Pretraining (skipped with `--lm-assets`, an earlier run's): `run_local lm` on an offline
corpus much larger than the task, the task's own texts held out. `debian`: Debian's
one-line package descriptions labelled by `works-with` debtags (`tools.datamakers.debian_corpus`),
pretrained on every other package's description (`write_lm_corpus`); `debian-sections`:
the same packages labelled by archive section; `docstrings`: the standard library's
docstrings, 7 packages as labels (`tools.datamakers.docstring_corpus`), pretrained on its
other docstrings plus a sample of the installed packages' (`write_source_corpus`).
`--lm-corpus english`: one LM for all three (`write_english_corpus`, with the manual pages
of `tools.datamakers.manpage_corpus`). `--task CSV --text-column COL`: your own labelled CSV
from the LM of `--lm-assets` (keep its texts out of that LM's corpus yourself).

Then per seed (the split, the initialisation, the batch order) the text pipeline twice at
the same epochs, batch and monitor: `--pretrained false --lm-epochs 0` with the LM's
architecture, and `--pretrained true --lm-assets <assets>` (`--fine-tune-epochs` of LM
fine-tuning first). Prints per seed test micro / macro F1 of both, TF-IDF + logistic
regression and the constant answer, CPU seconds per epoch; then the LM's held-out
perplexity, accuracy and tokens. Writes `<output>/results.json`; the weights stay under
the output folder: this script is the record of how they were made.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402

from bench.text_seeds import run_seed  # noqa: E402
from components.common.storage import read_json  # noqa: E402
from pipelines import run_local  # noqa: E402
from tools.datamakers import debian_corpus, docstring_corpus, manpage_corpus  # noqa: E402

# Packages of the installed environment whose docstrings are generated API references
# (cloud clients), left out of the docstring LM corpus: repetitive, and most of its bulk.
GENERATED_DOCS = ("google", "kubernetes")
LM_ARCH = '{"emb_sz": 200, "n_hid": 512, "n_layers": 2}'


def _docstring_lm_corpus(folder: str, task: str, max_characters: int) -> dict:
    """Docstrings of the standard library and installed packages, the task's held out."""
    return docstring_corpus.write_source_corpus(
        folder, exclude=GENERATED_DOCS, hold_out=pd.read_csv(task)["text"].tolist(),
        # the interpreter's site-packages: the project venv's, under .venv/bin/python
        roots=[sysconfig.get_paths()["purelib"]], max_characters=max_characters)


def write_english_corpus(folder: str, max_characters: int, man_characters: int) -> dict:
    """One LM corpus (.txt files in `folder`) of apt's descriptions, docstrings and manual
    pages, every task's texts held out: an LM made from it may start any of the three."""
    index = debian_corpus.read_index()
    descriptions, held_out = debian_corpus.lm_corpus_texts(index)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "debian.descriptions.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(descriptions) + "\n")
    counts = {"debian": {"documents": len(descriptions), "held_out": held_out,
                         "characters": sum(map(len, descriptions))}}
    task = os.path.join(folder, os.pardir, "docstrings-held-out.csv")
    docstring_corpus.write_docstring_corpus(task)
    counts["docstrings"] = _docstring_lm_corpus(folder, task, max_characters)
    counts["manpages"] = manpage_corpus.write_manpage_corpus(
        folder, hold_out_sources=debian_corpus.task_sources(index),
        max_characters=man_characters)
    return counts


def write_task_and_corpus(name: str, folder: str, max_characters: int,
                          ) -> tuple[str, str, str, dict]:
    """`(task CSV, its text column, LM corpus path, counts)` of a named corpus."""
    os.makedirs(folder, exist_ok=True)
    if name in ("debian", "debian-sections"):
        task = os.path.join(folder, f"{name}.csv")
        by = "section" if name == "debian-sections" else "works-with"
        counts = {"task": debian_corpus.write_debian_corpus(task, by=by)}
        corpus = os.path.join(folder, "debian-lm.csv")
        counts["lm_corpus"] = debian_corpus.write_lm_corpus(corpus)
        return task, "description", corpus, counts
    task = os.path.join(folder, "docstrings.csv")
    counts = {"task": docstring_corpus.write_docstring_corpus(task)}
    corpus = os.path.join(folder, "lm-corpus")
    counts["lm_corpus"] = _docstring_lm_corpus(corpus, task, max_characters)
    return task, "text", corpus, counts


def pretrain(corpus: str, output: str, args) -> dict:
    """The LM pipeline on the corpus; lm_metrics.json of the assets it wrote."""
    flags = ["lm", "--data", corpus, "--output", output, "--lang", "en",
             "--epochs", str(args.lm_epochs), "--batch-size", "32", "--min-freq", "3",
             "--max-vocab", str(args.max_vocab), "--model-config", args.model_config]
    if corpus.endswith(".csv"):
        flags += ["--text-column", "text"]
    assert run_local.main(flags) == 0
    return read_lm(read_json(os.path.join(output, "summary.json"))["artifacts"]["lm_assets"])


def read_lm(assets: str) -> dict:
    return {"assets": assets, **read_json(os.path.join(assets, "lm_metrics.json"))}


def classifier(data: str, column: str, output: str, seed: int, args, extra: list[str]) -> dict:
    """One text pipeline run (`text_seeds.run_seed`): the test scores, the baselines, the
    training record."""
    summary = run_seed("text", data, column, seed, output, [
        "--lang", "en", "--epochs", str(args.epochs), "--monitor", args.monitor,
        "--batch-size", str(args.batch_size), "--drop-mult", str(args.drop_mult), *extra])
    run = read_json(os.path.join(summary["artifacts"]["model"], "metrics.json"))["run"]
    return {"metrics": summary["metrics"], "baseline": summary["baseline"], "run": run}


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def seed_row(seed: int, scratch: dict, pretrained: dict) -> dict:
    baseline = scratch["baseline"]
    return {
        "seed": seed,
        "scratch": {k: scratch["metrics"][k] for k in ("micro_f1", "macro_f1")},
        "from_lm": {k: pretrained["metrics"][k] for k in ("micro_f1", "macro_f1")},
        "tfidf": {k: baseline["tfidf_logreg"][k] for k in ("micro_f1", "macro_f1")},
        # the constant answer: every label (multi-label) or the majority class (single-label)
        "constant": {k: baseline.get("every_label", baseline.get("majority_class"))[k]
                     for k in ("micro_f1", "macro_f1")},
        "cpu_seconds_per_epoch": {
            "scratch": _mean(scratch["run"]["classifier_epoch_cpu_seconds"]),
            "from_lm": _mean(pretrained["run"]["classifier_epoch_cpu_seconds"])},
        "lm_discarded": pretrained["run"]["lm_discarded"],
        "vocab_size": {"scratch": scratch["run"]["vocab_size"],
                       "from_lm": pretrained["run"]["vocab_size"]},
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=("debian", "debian-sections", "docstrings"),
                        default="debian")
    parser.add_argument("--task", default="",
                        help="your own labelled CSV in place of --corpus (needs --lm-assets)")
    parser.add_argument("--text-column", default="text", help="with --task: the text column")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--output", default="runs/ulmfit")
    parser.add_argument("--lm-assets", default="",
                        help="assets of an earlier run of this bench: skip pretraining")
    parser.add_argument("--lm-epochs", type=int, default=6, help="language model pretraining")
    parser.add_argument("--model-config", default=LM_ARCH, help="the LM's AWD_LSTM sizes")
    parser.add_argument("--max-vocab", type=int, default=15000)
    parser.add_argument("--max-characters", type=int, default=4_000_000,
                        help="docstrings: size of the LM corpus")
    parser.add_argument("--lm-corpus", choices=("task", "english"), default="task",
                        help="pretrain on the task's own kind of text (above), or on all "
                             "three sources plus the manual pages, every task held out")
    parser.add_argument("--man-characters", type=int, default=8_000_000,
                        help="english: characters of manual pages")
    parser.add_argument("--fine-tune-epochs", type=int, default=2,
                        help="LM fine-tuning on the task's texts (the text pipeline's lm_epochs)")
    parser.add_argument("--epochs", type=int, default=12, help="classifier epochs, both runs")
    parser.add_argument("--monitor", default="f1_score",
                        help="the metric whose best epoch each run keeps, both runs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--drop-mult", type=float, default=0.3,
                        help="AWD-LSTM dropout multiplier of both classifiers (the trainer's 0.3)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = os.path.abspath(args.output)
    if args.task:
        if not args.lm_assets:
            parser.error("--task needs --lm-assets: an LM whose corpus left the task's texts out")
        task, column, counts = args.task, args.text_column, {"task": args.task, "lm_corpus": "-"}
        args.corpus = os.path.basename(args.task)
    else:
        task, column, corpus, counts = write_task_and_corpus(args.corpus, out,
                                                             args.max_characters)
        if args.lm_corpus == "english" and not args.lm_assets:
            corpus = os.path.join(out, "english-lm")
            counts["lm_corpus"] = write_english_corpus(corpus, args.max_characters,
                                                       args.man_characters)
    lm = read_lm(args.lm_assets) if args.lm_assets else \
        pretrain(corpus, os.path.join(out, "lm"), args)
    arch = {k: lm["run"]["arch_config"][k] for k in ("emb_sz", "n_hid", "n_layers")}

    rows = []
    for seed in seeds:
        scratch = classifier(task, column, os.path.join(out, f"seed{seed}", "scratch"), seed,
                             args, ["--pretrained", "false", "--lm-epochs", "0",
                                    "--model-config", json.dumps(arch)])
        pretrained = classifier(task, column, os.path.join(out, f"seed{seed}", "from-lm"), seed,
                                args, ["--pretrained", "true", "--lm-assets", lm["assets"],
                                       "--lm-epochs", str(args.fine_tune_epochs)])
        rows.append(seed_row(seed, scratch, pretrained))
    forward = lm["directions"]["forward"]
    record = {"corpus": args.corpus, "counts": counts, "args": vars(args), "seeds": rows,
              "lm": {"assets": lm["assets"], "perplexity": lm["perplexity"],
                     "accuracy": lm["accuracy"], "tokens": lm["tokens"],
                     "vocab_size": lm["vocab_size"], "arch": arch,
                     "parameters": lm["run"]["parameters"], "epochs": forward["epochs"],
                     "epoch_seconds": forward["epoch_seconds"],
                     "epoch_cpu_seconds": forward.get("epoch_cpu_seconds")}}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(record, f, indent=1)
    print_record(record)
    return 0


def print_record(record: dict) -> None:
    lm, counts = record["lm"], record["counts"]
    print(f"\n{record['corpus']}: task {counts['task']}; LM corpus {counts['lm_corpus']}")
    cpu = lm["epoch_cpu_seconds"] or []
    print(f"LM {lm['arch']} ({lm['parameters'] / 1e6:.1f}M parameters, vocabulary "
          f"{lm['vocab_size']}): {lm['tokens']['train']} training tokens, {lm['epochs']} "
          f"epochs; held-out perplexity {lm['perplexity']:.1f}, next-token accuracy "
          f"{lm['accuracy']:.3f}; CPU s/epoch {_mean(cpu):.0f} (wall "
          f"{_mean(lm['epoch_seconds']):.0f})")
    print(f"{'seed':>4} | {'scratch':>13} | {'from the LM':>13} | {'TF-IDF':>13} | "
          f"{'constant':>13} | CPU s/epoch scratch, LM")
    for row in record["seeds"]:
        cells = [f"{row[k]['micro_f1']:.3f} / {row[k]['macro_f1']:.3f}"
                 for k in ("scratch", "from_lm", "tfidf", "constant")]
        seconds = row["cpu_seconds_per_epoch"]
        print(f"{row['seed']:>4} | " + " | ".join(f"{c:>13}" for c in cells) +
              f" | {seconds['scratch']:.2f}, {seconds['from_lm']:.2f}")
    wins = sum(r["from_lm"]["micro_f1"] > r["scratch"]["micro_f1"] for r in record["seeds"])
    print(f"micro F1 (/ macro): from the LM beats from scratch on {wins} of "
          f"{len(record['seeds'])} seeds")


if __name__ == "__main__":
    sys.exit(main())
