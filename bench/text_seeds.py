"""A text pipeline over several seeds on real text, next to the baselines of each split.

    python bench/text_seeds.py [--pipeline text|transformer] [--corpus docstrings|debian|FILE.csv]
        [--text-column C] [--seeds 1,2,3] [--output DIR] [--over-every-label M] [--over-tfidf M]
        [-- <run_local flags, e.g. --pretrained false>]

Each seed is one `python -m pipelines.run_local <pipeline>` run (the seed draws the split,
the initialisation and the batch order), scored beside TF-IDF + logistic regression and
predicting every label. Prints one row per seed (micro/macro F1 of the model and of each
baseline, restarts, CPU seconds per classifier epoch) and the worst margins; exits 1 when a
seed misses a margin asked for (`--over-every-label`, `--over-tfidf`). Measurements, not
tests: the recipes and what each gave are in docs/measurements.md. Corpora (offline):
`docstrings` (tools.datamakers.docstring_corpus), `debian` (tools.datamakers.debian_corpus).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.common.storage import read_json  # noqa: E402
from pipelines import run_local  # noqa: E402
from tools.datamakers import debian_corpus, docstring_corpus  # noqa: E402


def corpus_csv(name: str, folder: str) -> tuple[str, str]:
    """`(csv path, text column)` of a named corpus written into `folder`, or a given CSV."""
    if name == "docstrings":
        path = os.path.join(folder, "docstrings.csv")
        docstring_corpus.write_docstring_corpus(path)
        return path, "text"
    if name == "debian":
        path = os.path.join(folder, "debian.csv")
        debian_corpus.write_debian_corpus(path)
        return path, "description"
    return name, ""


def run_seed(pipeline: str, data: str, text_column: str, seed: int, output: str,
             flags: list[str]) -> dict:
    """One run_local run of `pipeline` (text or transformer); its summary.json."""
    args = [pipeline, "--data", data, "--output", output, "--seed", str(seed)]
    if text_column:
        args += ["--text-column", text_column]
    if run_local.main(args + flags) != 0:
        raise SystemExit(f"seed {seed} failed; see {output}")
    return read_json(os.path.join(output, "summary.json"))


def row(seed: int, summary: dict) -> dict:
    """The figures printed for one seed."""
    metrics, baseline, training = summary["metrics"], summary["baseline"], summary["training"]
    seconds = training["classifier_epoch_seconds"]
    constant = "every_label" if "every_label" in baseline else "majority_class"
    return {"seed": seed, "micro_f1": metrics["micro_f1"], "macro_f1": metrics["macro_f1"],
            "tfidf_micro_f1": baseline["tfidf_logreg"]["micro_f1"],
            "tfidf_macro_f1": baseline["tfidf_logreg"]["macro_f1"],
            "constant_micro_f1": baseline[constant]["micro_f1"],
            "restarts": len(training.get("restarts", [])),
            "epoch_seconds": sum(seconds) / len(seconds) if seconds else float("nan")}


def margins(rows: list[dict], over_every_label: float | None = None,
            over_tfidf: float | None = None) -> tuple[float, float, list[str]]:
    """(worst micro F1 margin over every label, worst over TF-IDF, the gates missed).

    Args:
        rows: One `row()` per seed.
        over_every_label: The least margin over predicting every label asked of every seed.
        over_tfidf: The margin over TF-IDF every seed must exceed (0: a tie misses it).
    """
    over_constant = min(r["micro_f1"] - r["constant_micro_f1"] for r in rows)
    to_tfidf = min(r["micro_f1"] - r["tfidf_micro_f1"] for r in rows)
    missed = []
    if over_every_label is not None and not over_constant >= over_every_label:
        missed.append(f"over every label {over_constant:+.3f} < {over_every_label:+.3f}")
    if over_tfidf is not None and not to_tfidf > over_tfidf:
        missed.append(f"over TF-IDF {to_tfidf:+.3f} < {over_tfidf:+.3f}")
    return over_constant, to_tfidf, missed


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", choices=("text", "transformer"), default="text")
    parser.add_argument("--corpus", default="docstrings")
    parser.add_argument("--text-column", default="")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--output", default="")
    parser.add_argument("--over-every-label", type=float, default=None,
                        help="exit 1 when a seed's micro F1 is not this far above every label")
    parser.add_argument("--over-tfidf", type=float, default=None,
                        help="exit 1 when a seed's micro F1 is not above TF-IDF's by more")
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    output = args.output or tempfile.mkdtemp(prefix="text_seeds_")
    os.makedirs(output, exist_ok=True)
    data, column = corpus_csv(args.corpus, output)
    rows = [row(seed, run_seed(args.pipeline, data, args.text_column or column, seed,
                               os.path.join(output, f"seed{seed}"), flags))
            for seed in (int(s) for s in args.seeds.split(","))]
    print(f"\n{args.pipeline} pipeline on {args.corpus}, flags {flags or 'none (defaults)'}; "
          f"outputs under {output}")
    print("seed  micro_f1 macro_f1 | tfidf micro/macro | every-label micro | restarts "
          "| s/epoch")
    for r in rows:
        print(f"{r['seed']:>4}  {r['micro_f1']:.3f}    {r['macro_f1']:.3f}    | "
              f"{r['tfidf_micro_f1']:.3f} / {r['tfidf_macro_f1']:.3f}     | "
              f"{r['constant_micro_f1']:.3f}             | {r['restarts']:>8} | "
              f"{r['epoch_seconds']:.1f}")
    over_constant, to_tfidf, missed = margins(rows, args.over_every_label, args.over_tfidf)
    print(f"worst micro F1 over predicting every label: {over_constant:+.3f}; "
          f"worst against TF-IDF: {to_tfidf:+.3f}")
    if missed:
        print("missed: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
