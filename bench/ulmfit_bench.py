"""From scratch vs from a language model made with the LM pipeline, on real text, side by side.

    python bench/ulmfit_bench.py [--lm-epochs 6] [--epochs 6] [--output runs/ulmfit]
        [--model-config '{"emb_sz": 100, "n_hid": 256, "n_layers": 2}']

The task: the standard library's docstrings, 7 packages as labels
(pipelines.docstring_corpus). The language model's corpus: every other docstring of the
standard library, the task's texts held out (`write_source_corpus(hold_out=...)`), trained
with `run_local lm`. Then the text pipeline twice at the same classifier epochs and batch:
`--pretrained false --lm-epochs 0` and `--pretrained true --lm-assets <those assets>`.
Prints test micro/macro F1 of both, the every-label baseline, LM perplexity and CPU seconds
per epoch. Several minutes on a laptop CPU; not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from components.common.metrics import multi_label_metrics  # noqa: E402
from pipelines import docstring_corpus, run_local  # noqa: E402


def _classifier(data: str, output: str, epochs: int, extra: list[str]) -> dict:
    args = ["text", "--data", data, "--output", output, "--lang", "en", "--epochs", str(epochs),
            "--batch-size", "32", *extra]
    assert run_local.main(args) == 0
    with open(os.path.join(output, "summary.json")) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="runs/ulmfit")
    parser.add_argument("--lm-epochs", type=int, default=6, help="language model pretraining")
    parser.add_argument("--fine-tune-epochs", type=int, default=2,
                        help="LM fine-tuning on the task's texts (the text pipeline's lm_epochs)")
    parser.add_argument("--epochs", type=int, default=6, help="classifier epochs, both runs")
    parser.add_argument("--model-config", default='{"emb_sz": 100, "n_hid": 256, "n_layers": 2}')
    args = parser.parse_args(argv)
    out = os.path.abspath(args.output)
    task = os.path.join(out, "docstrings.csv")
    counts = docstring_corpus.write_docstring_corpus(task)
    texts = pd.read_csv(task)["text"].tolist()
    corpus = os.path.join(out, "lm-corpus")
    corpus_counts = docstring_corpus.write_source_corpus(corpus, hold_out=texts)

    assert run_local.main(["lm", "--data", corpus, "--output", os.path.join(out, "lm"),
                           "--lang", "en", "--epochs", str(args.lm_epochs), "--batch-size", "32",
                           "--min-freq", "2", "--model-config", args.model_config]) == 0
    with open(os.path.join(out, "lm", "summary.json")) as f:
        lm = json.load(f)
    scratch = _classifier(task, os.path.join(out, "scratch"), args.epochs,
                          ["--pretrained", "false", "--lm-epochs", "0",
                           "--model-config", args.model_config])
    pretrained = _classifier(task, os.path.join(out, "pretrained"), args.epochs,
                             ["--pretrained", "true", "--lm-assets", lm["artifacts"]["lm_assets"],
                              "--lm-epochs", str(args.fine_tune_epochs)])

    labels = scratch["preparation"]["labels"]
    test = pd.read_csv(os.path.join(scratch["artifacts"]["dataset"], "test.csv"))
    every = multi_label_metrics(test[labels].to_numpy(), np.ones((len(test), len(labels))),
                                labels, 0.5)
    print(f"\ntask: {counts['rows']} rows, {len(labels)} labels; LM corpus: "
          f"{corpus_counts['files']} files, {corpus_counts['characters']} characters, "
          f"{corpus_counts['held_out']} task paragraphs held out")
    print(f"LM: perplexity {lm['metrics']['perplexity']:.1f}, accuracy "
          f"{lm['metrics']['accuracy']:.3f}, {lm['metrics']['tokens']['train']} train tokens, "
          f"s/epoch {np.mean(lm['training']['epoch_seconds']['forward']):.1f}")
    print(f"every label: micro F1 {every['micro_f1']:.3f}, macro {every['macro_f1']:.3f}")
    for name, run in (("from scratch", scratch), ("from the LM", pretrained)):
        metrics, training = run["metrics"], run["training"]
        print(f"{name:>13}: test micro F1 {metrics['micro_f1']:.3f}, macro "
              f"{metrics['macro_f1']:.3f} (tuned {metrics['tuned_micro_f1']:.3f} / "
              f"{metrics['tuned_macro_f1']:.3f}); classifier s/epoch "
              f"{np.mean(training['classifier_epoch_seconds']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
