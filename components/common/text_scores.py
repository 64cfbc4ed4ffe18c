"""A text classifier's validation scores, as both text trainers write them.

`validation_result` scores probabilities at the fixed threshold and at thresholds tuned on
the same rows; `per_label_summary` is the per-label file beside the model. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from components.common.metrics import multi_label_metrics, single_label_metrics, tune_thresholds

MULTI_LABEL = "multi_label"  # the task name the text preparation step writes (its contract)


def validation_result(truth: np.ndarray, probs: np.ndarray, labels: Sequence[str], task: str,
           threshold: float) -> dict[str, Any]:
    """Validation results: at the fixed threshold and, multi-label, at tuned thresholds.

    Args:
        truth: 0/1 label matrix, shape (rows, labels).
        probs: The model's probabilities, the same shape.
        labels: Label names in column order.
        task: MULTI_LABEL or SINGLE_LABEL.
        threshold: The fixed multi-label threshold (ignored for single-label).

    Returns:
        `{"task", "labels", "split": "validation", "threshold", "fixed", "tuned",
        "tuned_thresholds"}`; "fixed" and "tuned" are `multi_label_metrics` results
        (single-label: "fixed" is `single_label_metrics`', the others None).
    """
    if task == MULTI_LABEL:
        fixed = multi_label_metrics(truth, probs, labels, threshold)
        tuned_thresholds = tune_thresholds(truth, probs)
        tuned = multi_label_metrics(truth, probs, labels, tuned_thresholds)
        return {"task": task, "labels": list(labels), "split": "validation", "threshold": threshold,
                "fixed": fixed, "tuned": tuned,
                "tuned_thresholds": dict(zip(labels, tuned_thresholds.tolist()))}
    fixed = single_label_metrics(truth.argmax(axis=1), probs, labels)
    return {"task": task, "labels": list(labels), "split": "validation", "threshold": None,
            "fixed": fixed, "tuned": None, "tuned_thresholds": None}


def per_label_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The per-label JSON: precision, recall, F1, accuracy and support of each label
    at the fixed threshold, with the tuned threshold's figures beside them, plus
    micro and macro F1 (single-label: per class, micro F1 = accuracy).
    """
    fixed, tuned = result["fixed"], result.get("tuned")
    if result["task"] == MULTI_LABEL:
        per = {}
        for name, v in fixed["per_label"].items():
            t = tuned["per_label"][name]
            per[name] = {k: v[k] for k in ("precision", "recall", "f1", "accuracy", "support")}
            per[name].update({"tuned_threshold": t["threshold"], "tuned_precision": t["precision"],
                              "tuned_recall": t["recall"], "tuned_f1": t["f1"],
                              "tuned_accuracy": t["accuracy"]})
        return {"split": result["split"], "threshold": result["threshold"], "labels": per,
                "micro_f1": fixed["micro_f1"], "macro_f1": fixed["macro_f1"],
                "tuned_micro_f1": tuned["micro_f1"], "tuned_macro_f1": tuned["macro_f1"]}
    matrix = np.asarray(fixed["confusion_matrix"]["matrix"])
    n = matrix.sum()
    per = {}
    for i, (name, v) in enumerate(fixed["per_class"].items()):
        tn = n - matrix[i].sum() - matrix[:, i].sum() + matrix[i, i]
        per[name] = {k: v[k] for k in ("precision", "recall", "f1", "support")}
        per[name]["accuracy"] = float((matrix[i, i] + tn) / n)
    return {"split": result["split"], "threshold": None, "labels": per,
            "micro_f1": fixed["accuracy"], "macro_f1": fixed["macro_f1"]}


def validation_scalars(result: dict[str, Any]) -> dict[str, float]:
    """The console's training scalars from a text trainer's result (`metrics.json`)."""
    fixed = result["fixed"]
    if result["task"] == MULTI_LABEL:
        scalars = {"valid_micro_f1": fixed["micro_f1"], "valid_macro_f1": fixed["macro_f1"],
                   "valid_tuned_micro_f1": result["tuned"]["micro_f1"],
                   "valid_tuned_macro_f1": result["tuned"]["macro_f1"]}
    else:
        scalars = {"valid_accuracy": fixed["accuracy"], "valid_macro_f1": fixed["macro_f1"]}
    seconds = result["run"]["classifier_epoch_seconds"]
    scalars["classifier_epochs"] = len(seconds)
    scalars["classifier_restarts"] = len(result["run"].get("restarts", []))
    if seconds:
        scalars["classifier_epoch_seconds"] = sum(seconds) / len(seconds)
    return {name: float(value) for name, value in scalars.items()}


def labels_info(result: dict[str, Any], text_column: str, threshold: float,
                **extra: Any) -> dict[str, Any]:
    """The `labels.json` a text trainer writes beside its model, from its validation result.

    Evaluation, prediction and serving read the labels and decision rule from it, whichever
    trainer wrote it.

    Args:
        result: `validation_result`'s output (labels, task, tuned thresholds).
        text_column: The training CSV's text column (a request may name it).
        threshold: The multi-label decision threshold (None is written for single-label).
        **extra: What the trainer adds about its model (arch, language, max length, ...).
    """
    return {
        "labels": list(result["labels"]),
        "task": result["task"],
        "threshold": threshold if result["task"] == MULTI_LABEL else None,
        "thresholds": result["tuned_thresholds"],
        "text_column": text_column,
        **extra,
    }

