"""Cheap classical models scored on the same split as the deep model, beside it.

A deep model that scores below TF-IDF + logistic regression (text) or a linear model on
downscaled pixels (images), fitted in seconds on the same training split, wastes the GPU
money spent on it; a model at the level of a constant answer (every label, the majority
class) has learnt nothing. Each evaluation reports both next to its own figures, with the
same metric names (`metrics.scalar_summary` flattens them for the console), and the
registration gate may require beating them (`beats`).

Pure logic over arrays and texts: scikit-learn only, no TensorFlow, no fastai.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from components.common.metrics import multi_label_metrics, single_label_metrics, tune_thresholds

TFIDF = "tfidf_logreg"
PIXELS = "pixels_logreg"
EVERY_LABEL = "every_label"
MAJORITY = "majority_class"
# Inverse regularisation strengths tried; the one best on the validation split is kept.
C_GRID = (1.0, 10.0, 100.0)
# The metric names a baseline entry carries (those of the deep model's result it sits beside).
HEADLINE = {"multi_label": ("micro_f1", "macro_f1", "micro_precision", "micro_recall",
                            "subset_accuracy", "hamming_loss"),
            "single_label": ("accuracy", "micro_f1", "macro_f1", "weighted_f1")}


def _headline(result: dict[str, Any]) -> dict[str, Any]:
    numbers = {k: result[k] for k in HEADLINE[result["task"]] if k in result}
    if result.get("tuned"):
        numbers["tuned_micro_f1"] = result["tuned"]["micro_f1"]
        numbers["tuned_macro_f1"] = result["tuned"]["macro_f1"]
    return numbers


def constant_scores(train_truth: np.ndarray, n: int, task: str) -> np.ndarray:
    """Scores of the constant answer: every label (multi-label), the majority class."""
    k = train_truth.shape[1]
    if task == "multi_label":
        return np.ones((n, k))
    return np.tile(np.eye(k)[np.argmax(train_truth.sum(axis=0))], (n, 1))


def score(truth: np.ndarray, probs: np.ndarray, labels: Sequence[str], task: str,
          threshold: float | None = None, valid: tuple[np.ndarray, np.ndarray] | None = None,
          ) -> dict[str, Any]:
    """The headline metrics of `probs`, named as the deep model's (`HEADLINE`).

    Args:
        truth: 0/1 matrix (n, k) (one-hot for single-label).
        probs: Scores (n, k).
        labels: Label or class names.
        task: "multi_label" or "single_label".
        threshold: Multi-label fixed threshold.
        valid: Multi-label: `(truth, probs)` of the validation split, on which per-label
            thresholds are tuned (`tuned_*` figures), as the deep model's are.
    """
    if task == "multi_label":
        result = multi_label_metrics(truth, probs, labels, threshold)
        if valid is not None:
            result["tuned"] = multi_label_metrics(truth, probs, labels, tune_thresholds(*valid))
    else:
        result = single_label_metrics(truth.argmax(axis=1), probs, labels)
    return _headline(result)


def fit_logistic(train_x, train_truth: np.ndarray, valid_x, valid_truth: np.ndarray,
                 task: str, seed: int = 0):
    """Logistic regression (one-vs-rest per label for multi-label), C chosen on validation.

    Returns:
        `(model, C)`: a fitted scikit-learn classifier whose `predict_proba` gives (n, k).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    multi = task == "multi_label"
    best = None
    for c in C_GRID:
        linear = LogisticRegression(C=c, max_iter=2000, random_state=seed)
        if multi:
            # A label no training row has is a constant "no": OneVsRest handles it.
            model = OneVsRestClassifier(linear).fit(train_x, train_truth)
            probs = model.predict_proba(valid_x)
            quality = multi_label_metrics(valid_truth, probs, [str(i) for i in range(
                probs.shape[1])], tune_thresholds(valid_truth, probs))["micro_f1"]
        else:
            model = linear.fit(train_x, train_truth.argmax(axis=1))
            probs = _class_probs(model, valid_x, train_truth.shape[1])
            quality = float((probs.argmax(axis=1) == valid_truth.argmax(axis=1)).mean())
        if best is None or quality > best[0]:
            best = (quality, model, c)
    return best[1], best[2]


def _class_probs(model, x, k: int) -> np.ndarray:
    """(n, k) probabilities, zero for classes the training split never had."""
    out = np.zeros((x.shape[0], k))
    out[:, model.classes_] = model.predict_proba(x)
    return out


def predict(model, x, task: str, k: int) -> np.ndarray:
    """`fit_logistic`'s model applied to `x`: (n, k) probabilities."""
    return model.predict_proba(x) if task == "multi_label" else _class_probs(model, x, k)


def text_baselines(train: tuple[Sequence[str], np.ndarray], valid: tuple[Sequence[str], np.ndarray],
                   test: tuple[Sequence[str], np.ndarray], labels: Sequence[str], task: str,
                   threshold: float | None = None, seed: int = 0) -> dict[str, Any]:
    """TF-IDF + logistic regression and the constant answer, scored on `test`.

    TF-IDF over word unigrams and bigrams (sublinear term frequency) of the training
    texts; logistic regression with C picked on the validation split; multi-label
    thresholds: `threshold` and, as for the deep model, tuned per label on validation.

    Args:
        train: `(texts, truth)` of the training split; truth is 0/1 (n, k).
        valid: The same for the validation split.
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
    """Logistic regression on features already made, and the constant answer, on `test`.

    Args:
        name: Key of the linear model's entry (e.g. TFIDF, PIXELS).
        train: `(features, truth)` of the training split.
        valid: The same for the validation split (C and multi-label thresholds).
        test: The same for the evaluated split.
        labels: Label or class names.
        task: "multi_label" or "single_label".
        threshold: Multi-label fixed threshold.
        seed: Seed of the solver.
    """
    k = len(labels)
    model, c = fit_logistic(train[0], train[1], valid[0], valid[1], task, seed)
    valid_probs = predict(model, valid[0], task, k)
    linear = score(test[1], predict(model, test[0], task, k), labels, task, threshold,
                   valid=(valid[1], valid_probs) if task == "multi_label" else None)
    linear["C"] = c
    constant = score(test[1], constant_scores(train[1], test[1].shape[0], task), labels, task,
                     threshold if threshold is not None else 0.5)
    return {name: linear, EVERY_LABEL if task == "multi_label" else MAJORITY: constant}


def markdown_table(result: dict[str, Any]) -> str:
    """The model beside each baseline in `result["baseline"]`, a Markdown section ("" if none)."""
    if not result.get("baseline"):
        return ""
    names = [k for k in HEADLINE[result["task"]] if k in result]
    deep = dict(result)
    if result.get("tuned"):
        names.append("tuned_micro_f1")
        deep["tuned_micro_f1"] = result["tuned"]["micro_f1"]
    rows = [["this model", *(f"{deep[n]:.4f}" for n in names)]]
    for name, numbers in result["baseline"].items():
        rows.append([name, *(f"{numbers[n]:.4f}" if n in numbers else "" for n in names)])
    lines = ["", "## Baselines on the same split", "",
             "| model | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# What each constant answer is, in words.
CONSTANT_ANSWERS = {MAJORITY: "always answering the majority class",
                    EVERY_LABEL: "answering every label for every example"}


def no_better_than_constant(value: float | None, baseline: Mapping[str, Mapping[str, Any]],
                            metric: str) -> str | None:
    """Why a model is no better than the constant answer on `metric`, or None when it is.

    The constant answer (`constant_scores`: the majority class, or every label) is the
    baseline entry MAJORITY or EVERY_LABEL of an evaluation; a model whose `metric` is not
    above that entry's has learnt nothing the evaluation can see. Every family's run
    summary says so through this (`pipelines.run_local.headline`).

    Args:
        value: The model's `metric` on the evaluated split (None or NaN: not above).
        baseline: An evaluation's `baseline` section (`linear_and_constant`).
        metric: The metric compared, e.g. "accuracy" or "micro_f1".

    Returns:
        E.g. "accuracy 0.400 is not above the 0.400 of always answering the majority
        class"; None when the model is above it, or the evaluation scored no constant
        answer with `metric`.
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
