"""A text classifier's validation scores as both trainers write them, and the answer that
ignores the text (`constant_answer`), which a classifier starts at and is judged against."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from components.common.metrics import multi_label_metrics, single_label_metrics, tune_thresholds
from components.common.storage import write_json_atomically
from components.prepare_text.contract import MULTI_LABEL
from components.text_common.contract import LABELS_FILE, PER_LABEL_FILE, TRAINING_METRICS_FILE


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
        `{"task", "labels", "split", "threshold", "fixed", "tuned", "tuned_thresholds"}`
        (single-label: "fixed" from `single_label_metrics`, the tuned ones None).
    """
    head = {"task": task, "labels": list(labels), "split": "validation"}
    if task == MULTI_LABEL:
        tuned_thresholds = tune_thresholds(truth, probs)
        return {**head, "threshold": threshold,
                "fixed": multi_label_metrics(truth, probs, labels, threshold),
                "tuned": multi_label_metrics(truth, probs, labels, tuned_thresholds),
                "tuned_thresholds": dict(zip(labels, tuned_thresholds.tolist()))}
    fixed = single_label_metrics(truth.argmax(axis=1), probs, labels)
    return {**head, "threshold": None, "fixed": fixed, "tuned": None, "tuned_thresholds": None}


def per_label_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The per-label JSON: each label's figures at the fixed threshold and at its tuned one,
    micro and macro F1 (single-label: per class, micro F1 = accuracy)."""
    fixed, tuned = result["fixed"], result.get("tuned")
    if result["task"] == MULTI_LABEL:
        per = {name: {**{k: v[k] for k in ("precision", "recall", "f1", "accuracy", "support")},
                      **{f"tuned_{k}": tuned["per_label"][name][k]
                         for k in ("threshold", "precision", "recall", "f1", "accuracy")}}
               for name, v in fixed["per_label"].items()}
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
    """The `labels.json` a text trainer writes beside its model: labels and decision rule.

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


def write_result_files(model_dir: str, result: dict[str, Any], text_column: str,
                       threshold: float, **model: Any) -> None:
    """Writes a text model folder's labels.json (`labels_info`, with the trainer's `model`
    facts), metrics.json (`result`) and per_label_metrics.json."""
    for name, value in ((LABELS_FILE, labels_info(result, text_column, threshold, **model)),
                        (TRAINING_METRICS_FILE, result),
                        (PER_LABEL_FILE, per_label_summary(result))):
        write_json_atomically(os.path.join(model_dir, name), value, sort_keys=False)


def _label_rates(truth, multi_label: bool) -> np.ndarray:
    """Each label's training frequency clipped to [1e-3, 1 - 1e-3] (a softmax's summing to 1)."""
    rates = np.clip(np.asarray(truth, dtype=float).mean(axis=0), 1e-3, 1 - 1e-3)
    return rates if multi_label else rates / rates.sum()


def frequency_bias(truth: np.ndarray, task: str) -> np.ndarray:
    """Output-layer biases under which a classifier predicts each label's training frequency
    (a new head says 0.5 and spends epochs learning that labels are rare): their log-odds
    (log-priors for softmax).

    Args:
        truth: 0/1 label matrix of the training split, shape (rows, labels).
        task: MULTI_LABEL or single-label.
    """
    rates = _label_rates(truth, task == MULTI_LABEL)
    return np.log(rates / (1 - rates)) if task == MULTI_LABEL else np.log(rates)


# "Learnt nothing": the stage's best validation loss is not this much below the loss of the
# constant answer, and its best score is within SCORE_MARGIN of the constant answer's.
LOSS_MARGIN = 0.02
SCORE_MARGIN = 0.02


def constant_answer(valid_truth, train_truth, multi_label: bool, threshold: float,
                    ) -> dict[str, float]:
    """Validation loss and macro F1 of a model that predicts each label's training frequency
    (cut at `threshold`, or the majority class), where the classifier starts.

    Args:
        valid_truth: 0/1 label matrix of the validation split (rows, labels).
        train_truth: The same of the training split.
        multi_label: Sigmoid per label (True) or softmax over classes.
        threshold: Multi-label decision threshold.
    """
    truth = np.asarray(valid_truth, dtype=float)
    rates = _label_rates(train_truth, multi_label)
    if multi_label:
        loss = -(truth * np.log(rates) + (1 - truth) * np.log(1 - rates)).mean()
        predicted = rates >= threshold
    else:
        loss = -(truth * np.log(rates)).sum(axis=1).mean()
        predicted = np.arange(len(rates)) == rates.argmax()
    # A label always predicted: precision positives / rows, recall 1.
    positives = truth.sum(axis=0)
    with np.errstate(invalid="ignore"):
        f1 = np.where(predicted & (positives > 0), 2 * positives / (len(truth) + positives), 0.0)
    return {"valid_loss": float(loss), "f1_score": float(f1.mean())}


def learnt_nothing(rows: list[Mapping[str, Any]], constant: Mapping[str, float],
                   ) -> str | None:
    """Why a classifier's epochs show no learning (best loss and best `f1_score` both within
    the margins of the constant answer's), or None.

    Args:
        rows: The classifier's history rows (`valid_loss`, `f1_score`).
        constant: `constant_answer`'s figures.
    """
    losses = [r["valid_loss"] for r in rows if finite(r.get("valid_loss"))]
    scores = [r["f1_score"] for r in rows if finite(r.get("f1_score"))]
    if not losses:
        return "no finite validation loss in any epoch"
    best_loss, best_score = min(losses), max(scores, default=0.0)
    if best_loss < constant["valid_loss"] * (1 - LOSS_MARGIN):
        return None
    if best_score > constant["f1_score"] + SCORE_MARGIN:
        return None
    return (f"best valid_loss {best_loss:.4f} vs {constant['valid_loss']:.4f} and best "
            f"f1_score {best_score:.4f} vs {constant['f1_score']:.4f} for predicting the "
            "label frequencies")


def finite(value: Any) -> bool:
    """Whether `value` is a finite number (not None, NaN or infinite)."""
    return isinstance(value, (int, float)) and value == value and abs(value) != float("inf")
