"""The text classifier on real text: the standard library's docstrings (pipelines.docstring_corpus).

The demo CSV's templated reviews are learnt by anything; real prose is not. This is the
user's own command from the issue that found the collapse (a classifier from scratch, no
language model, 6 epochs, batch 32), and it must beat the trivial answer clearly.
"""

import json

import numpy as np
import pandas as pd
import pytest

from components.common.metrics import multi_label_metrics
from pipelines import docstring_corpus, run_local


@pytest.mark.slow
def test_from_scratch_classifier_clearly_beats_predicting_every_label(tmp_path):
    corpus = tmp_path / "docs.csv"
    docstring_corpus.write_docstring_corpus(str(corpus))
    out = tmp_path / "run"
    assert run_local.main(["text", "--data", str(corpus), "--output", str(out), "--lang", "en",
                           "--pretrained", "false", "--lm-epochs", "0", "--epochs", "6",
                           "--batch-size", "32"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    metrics, labels = summary["metrics"], summary["preparation"]["labels"]
    test = pd.read_csv(f"{summary['artifacts']['dataset']}/test.csv")
    truth = test[labels].to_numpy()
    every = multi_label_metrics(truth, np.ones(truth.shape), labels, 0.5)
    assert metrics["num_examples"] == len(test)
    # the collapse this guards against scored 0.0 (no label) or the baseline (every label)
    assert metrics["micro_f1"] > every["micro_f1"] + 0.1, (metrics, every["micro_f1"])
    assert metrics["macro_f1"] > every["macro_f1"] + 0.1
    assert metrics["tuned_micro_f1"] > every["micro_f1"] + 0.25
    found = summary["training"]["found_learning_rates"]["classifier"]
    assert 1e-4 <= found["used"] <= 5e-2
