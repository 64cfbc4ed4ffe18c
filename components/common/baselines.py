"""Cheap classical models scored on the same split as the deep model, beside it.

TF-IDF + logistic regression (text) or a linear model on pixels (images), and the constant
answer (every label, the majority class), with the deep model's metric names; the
registration gate may require beating them (`beats`). scikit-learn only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from components.common.metrics import (
    markdown_rows,
    multi_label_metrics,
    single_label_metrics,
    tune_thresholds,
)

TFIDF = "tfidf_logreg"
PIXELS = "pixels_logreg"
EVERY_LABEL = "every_label"
MAJORITY = "majority_class"
# Inverse regularisation strengths tried; the one best on the validation split is kept.
C_GRID = (1.0, 10.0, 100.0)
# The metric names a baseline entry carries, as the deep model's result it sits beside.
HEADLINE = {"multi_label": ("micro_f1", "macro_f1", "micro_precision", "micro_recall",
                            "subset_accuracy", "hamming_loss"),
            "single_label": ("accuracy", "micro_f1", "macro_f1", "weighted_f1")}


def _score(truth: np.ndarray, probs: np.ndarray, labels: Sequence[str], task: str,
           threshold: float | None, valid: tuple | None = None) -> dict[str, Any]:
    """The headline metrics of `probs` (`HEADLINE`, and `tuned_*` when `valid` is given)."""
    if task == "multi_label":
        result = multi_label_metrics(truth, probs, labels, threshold)
        if valid is not None:
            result["tuned"] = multi_label_metrics(truth, probs, labels, tune_thresholds(*valid))
    else:
        result = single_label_metrics(truth.argmax(axis=1), probs, labels)
    numbers = {k: result[k] for k in HEADLINE[task] if k in result}
    if result.get("tuned"):
        numbers["tuned_micro_f1"] = result["tuned"]["micro_f1"]
        numbers["tuned_macro_f1"] = result["tuned"]["macro_f1"]
    return numbers


def _class_probs(model, x, k: int) -> np.ndarray:
    """(n, k) probabilities, zero for classes the training split never had."""
    out = np.zeros((x.shape[0], k))
    out[:, model.classes_] = model.predict_proba(x)
    return out


def _fit_logistic(train, valid, task: str, seed: int):
    """`(probabilities of features, C)`: logistic regression (one-vs-rest per label for
    multi-label), C chosen on validation."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    best = None
    for c in C_GRID:
        linear = LogisticRegression(C=c, max_iter=2000, random_state=seed)
        if task == "multi_label":
            # A label no training row has is a constant "no": OneVsRest handles it.
            probs = OneVsRestClassifier(linear).fit(*train).predict_proba
            found = probs(valid[0])
            quality = multi_label_metrics(valid[1], found, [str(i) for i in range(
                found.shape[1])], tune_thresholds(valid[1], found))["micro_f1"]
        else:
            model = linear.fit(train[0], train[1].argmax(axis=1))
            probs = functools.partial(_class_probs, model, k=train[1].shape[1])
            quality = float((probs(valid[0]).argmax(axis=1) == valid[1].argmax(axis=1)).mean())
        if best is None or quality > best[0]:
            best = (quality, probs, c)
    return best[1], best[2]


def text_baselines(train: tuple[Sequence[str], np.ndarray], valid: tuple[Sequence[str], np.ndarray],
                   test: tuple[Sequence[str], np.ndarray], labels: Sequence[str], task: str,
                   threshold: float | None = None, seed: int = 0) -> dict[str, Any]:
    """TF-IDF (word 1-2 grams) + logistic regression and the constant answer, on `test`.

    Args:
        train: `(texts, truth)` of the training split; truth is 0/1 (n, k).
        valid: The same for the validation split (picks C and multi-label thresholds).
        test: The same for the evaluated split.
        labels: Label or class names.
        task: "multi_label" or "single_label".
        threshold: Multi-label fixed threshold (the deep model's).
        seed: Seed of the solver.

    Returns:
        `{TFIDF: {...metrics, "C"}, EVERY_LABEL or MAJORITY: {...metrics}}`.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, max_features=200_000)
    train_x = vectorizer.fit_transform([str(t) for t in train[0]])
    valid_x = vectorizer.transform([str(t) for t in valid[0]])
    test_x = vectorizer.transform([str(t) for t in test[0]])
    return linear_and_constant(TFIDF, (train_x, train[1]), (valid_x, valid[1]),
                               (test_x, test[1]), labels, task, threshold, seed)


def linear_and_constant(name: str, train, valid, test, labels: Sequence[str], task: str,
                        threshold: float | None = None, seed: int = 0) -> dict[str, Any]:
    """`text_baselines` on features already made: `name` (e.g. TFIDF, PIXELS) keys the
    linear model's entry; each split is `(features, truth)`."""
    probs, c = _fit_logistic(train, valid, task, seed)
    multi = task == "multi_label"
    linear = _score(test[1], probs(test[0]), labels, task, threshold,
                    valid=(valid[1], probs(valid[0])) if multi else None)
    linear["C"] = c
    n, k = test[1].shape
    # The constant answer: every label, or the training split's majority class.
    constant = (np.ones((n, k)) if multi
                else np.tile(np.eye(k)[np.argmax(train[1].sum(axis=0))], (n, 1)))
    constant = _score(test[1], constant, labels, task, 0.5 if threshold is None else threshold)
    return {name: linear, EVERY_LABEL if multi else MAJORITY: constant}


def markdown_table(result: dict[str, Any]) -> str:
    """The model beside each baseline in `result["baseline"]`, a Markdown section ("" if none)."""
    if not result.get("baseline"):
        return ""
    names = [k for k in HEADLINE[result["task"]] if k in result]
    deep = dict(result)
    if result.get("tuned"):
        names.append("tuned_micro_f1")
        deep["tuned_micro_f1"] = result["tuned"]["micro_f1"]
    rows = [[name, *(f"{numbers[n]:.4f}" if n in numbers else "" for n in names)]
            for name, numbers in [("this model", deep), *result["baseline"].items()]]
    return "\n".join(["", "## Baselines on the same split", "",
                      *markdown_rows(["model", *names], rows)]) + "\n"


# What each constant answer is, in words.
CONSTANT_ANSWERS = {MAJORITY: "always answering the majority class",
                    EVERY_LABEL: "answering every label for every example"}


def no_better_than_constant(value: float | None, baseline: Mapping[str, Mapping[str, Any]],
                            metric: str) -> str | None:
    """Why a model is no better than the constant answer on `metric`, or None when it is.

    Args:
        value: The model's `metric` on the evaluated split (None or NaN: not above).
        baseline: An evaluation's `baseline` section (`linear_and_constant`).
        metric: The metric compared, e.g. "accuracy" or "micro_f1".

    Returns:
        E.g. "accuracy 0.400 is not above the 0.400 of always answering the majority
        class"; None when above, or when no constant answer has `metric`.
    """
    for name, words in CONSTANT_ANSWERS.items():
        constant = (baseline or {}).get(name, {}).get(metric)
        if constant is None:
            continue
        if isinstance(value, (int, float)) and value > constant:
            return None
        shown = f"{value:.3f}" if isinstance(value, (int, float)) else str(value)
        return f"{metric} {shown} is not above the {constant:.3f} of {words}"
    return None


def beats(result: dict[str, Any], metric: str) -> tuple[bool, str]:
    """Whether the deep model's `metric` beats every baseline's in `result["baseline"]`.

    Returns:
        `(beats, reason)`; a result without baselines or without `metric` in them fails,
        with the reason naming what is missing.
    """
    baseline = result.get("baseline") or {}
    if not baseline:
        return False, "the evaluation has no baseline to compare with"
    value = result.get(metric)
    for name, numbers in baseline.items():
        if metric not in numbers:
            return False, f"baseline {name} has no {metric}"
        if not value > numbers[metric]:
            return False, f"{metric} = {value!r} <= {name}'s {numbers[metric]!r}"
    best = max(numbers[metric] for numbers in baseline.values())
    return True, f"{metric} = {value!r} > every baseline (best {best!r})"
