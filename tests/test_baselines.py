"""Cheap baselines beside every score (components.common.baselines), on real text."""

import numpy as np
import pandas as pd
import pytest

from components.common import baselines
from components.common.metrics import multi_label_metrics, scalar_summary
from tools.datamakers import docstring_corpus


@pytest.fixture(scope="module")
def docstrings(tmp_path_factory):
    """The standard library's docstrings, split 60/15/25 by row position (a fixed shuffle)."""
    path = tmp_path_factory.mktemp("docs") / "docs.csv"
    docstring_corpus.write_docstring_corpus(str(path))
    frame = pd.read_csv(path).sample(frac=1.0, random_state=0).reset_index(drop=True)
    labels = list(docstring_corpus.LABELS)
    n = len(frame)
    cut = [0, int(n * 0.6), int(n * 0.75), n]
    return [(frame.text[a:b].tolist(), frame[labels][a:b].to_numpy())
            for a, b in zip(cut, cut[1:])], labels


def test_tfidf_beats_the_constant_answer_on_real_multi_label_text(docstrings):
    (train, valid, test), labels = docstrings
    result = baselines.text_baselines(train, valid, test, labels, "multi_label", threshold=0.3)
    assert set(result) == {"tfidf_logreg", "every_label"}
    every = multi_label_metrics(test[1], np.ones(test[1].shape), labels, 0.3)
    assert result["every_label"]["micro_f1"] == pytest.approx(every["micro_f1"])
    linear = result["tfidf_logreg"]
    # about 0.75 on this corpus; predicting every label about 0.26
    assert linear["micro_f1"] > every["micro_f1"] + 0.35, result
    assert linear["tuned_micro_f1"] > every["micro_f1"] + 0.35
    assert linear["C"] in baselines.C_GRID
    # the deep model's metric names, so the two sit side by side
    assert set(baselines.HEADLINE["multi_label"]) <= set(linear)


def test_single_label_gets_the_majority_class_and_an_accuracy(docstrings):
    (train, valid, test), labels = docstrings

    def one_label(split):
        return split[0], np.eye(len(labels))[split[1].argmax(axis=1)]

    result = baselines.text_baselines(one_label(train), one_label(valid), one_label(test),
                                      labels, "single_label")
    truth = one_label(test)[1].argmax(axis=1)
    majority = np.bincount(one_label(train)[1].argmax(axis=1)).argmax()
    assert result["majority_class"]["accuracy"] == pytest.approx((truth == majority).mean())
    assert result["tfidf_logreg"]["accuracy"] > result["majority_class"]["accuracy"] + 0.4


def test_console_scalars_and_the_gate_comparison():
    result = {"task": "multi_label", "num_examples": 3, "micro_f1": 0.7, "macro_f1": 0.6,
              "per_label": {}, "baseline": {
                  "tfidf_logreg": {"micro_f1": 0.65, "macro_f1": 0.62, "C": 10.0},
                  "every_label": {"micro_f1": 0.3, "macro_f1": 0.28}}}
    scalars = scalar_summary(result)
    assert scalars["baseline_micro_f1"] == 0.65 and scalars["every_label_macro_f1"] == 0.28
    assert "baseline_C" not in scalars
    assert baselines.beats(result, "micro_f1")[0]
    beaten, reason = baselines.beats(result, "macro_f1")
    assert not beaten and "tfidf_logreg" in reason
    assert not baselines.beats({**result, "baseline": {}}, "micro_f1")[0]


def test_a_model_no_better_than_the_constant_answer_is_named_with_both_scores():
    majority = {baselines.MAJORITY: {"accuracy": 0.4, "macro_f1": 0.19},
                baselines.PIXELS: {"accuracy": 0.7}}
    assert baselines.no_better_than_constant(0.41, majority, "accuracy") is None
    for value in (0.4, 0.2, float("nan"), None):
        why = baselines.no_better_than_constant(value, majority, "accuracy")
        assert why.startswith("accuracy ") and why.endswith(
            "is not above the 0.400 of always answering the majority class")
    every = {baselines.EVERY_LABEL: {"micro_f1": 0.35}}
    assert baselines.no_better_than_constant(0.0, every, "micro_f1") == (
        "micro_f1 0.000 is not above the 0.350 of answering every label for every example")
    # no constant answer scored with that metric (or no baseline at all): nothing to say
    assert baselines.no_better_than_constant(0.0, majority, "micro_f1") is None
    assert baselines.no_better_than_constant(0.0, {}, "accuracy") is None


@pytest.mark.parametrize("kind, metrics, baseline, warned", [
    ("image", {"accuracy": 0.4, "macro_f1": 0.19}, {"majority_class": {
        "accuracy": 0.4, "macro_f1": 0.19}, "pixels_logreg": {"accuracy": 0.6, "macro_f1": 0.5}},
     "accuracy 0.400 is not above the 0.400 of always answering the majority class"),
    ("image", {"accuracy": 0.9, "macro_f1": 0.88}, {"majority_class": {
        "accuracy": 0.4, "macro_f1": 0.19}}, None),
    ("text", {"micro_f1": 0.5, "macro_f1": 0.3}, {"majority_class": {
        "accuracy": 0.5, "micro_f1": 0.5, "macro_f1": 0.22}},
     "micro_f1 0.500 is not above the 0.500 of always answering the majority class"),
    ("transformer", {"micro_f1": 0.2, "macro_f1": 0.1}, {"every_label": {
        "micro_f1": 0.35, "macro_f1": 0.3}},
     "micro_f1 0.200 is not above the 0.350 of answering every label for every example"),
])
def test_every_familys_headline_says_when_the_model_is_no_better_than_the_constant_answer(
        kind, metrics, baseline, warned):
    from pipelines import run_local

    summary = {"metrics": {**metrics, "per_label": {"a": {"support": 5}}}, "baseline": baseline}
    lines = run_local.headline(kind, summary).splitlines()
    assert lines[0].startswith(f"{kind} pipeline: test ")
    if warned is None:
        assert len(lines) == 1
    else:
        assert lines[1:] == [f"warning: the model is no better than the constant answer "
                             f"({warned})"]
