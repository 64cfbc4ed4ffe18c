"""Classification metrics as JSON-ready dicts (no NaN), shared by evaluators and trainers:
`sklearn.metrics` with `zero_division=0`; macro averages count every class given, absent
ones too; the predicted class is the argmax. scikit-learn is imported where it computes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.common.storage import read_json, write_json_atomically, write_text_atomically

# What every evaluation step writes into its output folder.
EVALUATION_FILE = "metrics.json"
REPORT_FILE = "report.md"

ROC_MAX_POINTS = 200  # keeps the ROC curve in KFP metadata and metrics.json small
DEFAULT_THRESHOLD_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))  # 0.05..0.95, has 0.5
REPORT_MAX_MATRIX_CLASSES = 30  # a bigger confusion matrix is unreadable as a Markdown table


def _check_names(names: Sequence[str], k: int, what: str) -> list[str]:
    names = [str(n) for n in names]
    if len(names) != k:
        raise ValueError(f"got {len(names)} {what} names for {k} probability columns")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} names must be unique, got {names}")
    return names


def _per_name(names: list[str], **columns: np.ndarray) -> dict[str, dict[str, Any]]:
    """{name: {column: value}}: `support` and `predicted` as int, the rest as float."""
    return {name: {key: (int if key in ("support", "predicted") else float)(values[i])
                   for key, values in columns.items()}
            for i, name in enumerate(names)}


def roc_curve(positive: np.ndarray, scores: np.ndarray,
              max_points: int = ROC_MAX_POINTS) -> dict[str, Any] | None:
    """The ROC curve of scores against binary truth, thinned evenly along its length, and its
    area (before the thinning); the first threshold is 1.0 (or just above a top score >= 1)
    instead of scikit-learn's infinity, which JSON rejects.

    Args:
        positive: Boolean truth, shape (n,).
        scores: Scores of the positive class, shape (n,).
        max_points: Most points kept in the curve (at least 2).

    Returns:
        `{"fpr", "tpr", "thresholds", "auc"}`, or None when only one class is present.
    """
    from sklearn import metrics

    positive = np.asarray(positive, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    n_pos = int(positive.sum())
    if n_pos == 0 or n_pos == positive.size:
        return None
    fpr, tpr, thresholds = metrics.roc_curve(positive, scores)
    auc = float(metrics.auc(fpr, tpr))  # what roc_auc_score computes, without a second curve
    top = thresholds[1]
    thresholds[0] = 1.0 if top < 1.0 else np.nextafter(top, np.inf)

    if fpr.size > max_points:
        # Even spacing along the curve's length keeps its shape where it bends.
        length = np.r_[0, np.cumsum(np.hypot(np.diff(fpr), np.diff(tpr)))]
        targets = np.linspace(0, length[-1], max(2, max_points))
        keep = np.unique(np.r_[0, np.searchsorted(length, targets), fpr.size - 1])
        keep = keep[keep < fpr.size]
        fpr, tpr, thresholds = fpr[keep], tpr[keep], thresholds[keep]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist(), "thresholds": thresholds.tolist(),
            "auc": auc}


def single_label_metrics(y_true: np.ndarray, y_prob: np.ndarray,
                         class_names: Sequence[str]) -> dict[str, Any]:
    """Metrics of a classifier that picks one class per example.

    Args:
        y_true: True class indices, shape (n,), in 0..k-1.
        y_prob: Class probabilities (or any scores), shape (n, k).
        class_names: The k class names, in index order.

    Returns:
        `task`, `num_examples`, `classes`, `accuracy`, `micro_f1` (the accuracy, so one
        name gates both tasks), macro precision/recall/F1, `weighted_f1`, `per_class`,
        `confusion_matrix` (rows true); for k == 2 `positive_class`, `roc_auc`, `roc`.

    Raises:
        ValueError: Shapes disagree, there are no examples, or a label is out of range.
    """
    from sklearn.metrics import confusion_matrix, precision_recall_fscore_support

    y_true = np.asarray(y_true).astype(np.int64).reshape(-1)
    y_prob = np.asarray(y_prob, dtype=np.float64)
    if y_prob.ndim != 2 or y_prob.shape[0] != y_true.shape[0]:
        raise ValueError(f"y_prob must be (n, k) with n = len(y_true) = {y_true.size}, "
                         f"got shape {y_prob.shape}")
    n, k = y_prob.shape
    names = _check_names(class_names, k, "class")
    if n == 0:
        raise ValueError("no examples to evaluate")
    if k < 2:
        raise ValueError(f"a classifier needs at least 2 classes, got {k}")
    if y_true.min() < 0 or y_true.max() >= k:
        raise ValueError(f"labels must be in 0..{k - 1}, got {y_true.min()}..{y_true.max()}")
    if not np.isfinite(y_prob).all():
        raise ValueError("y_prob holds NaN or infinite values")

    y_pred = y_prob.argmax(axis=1)
    # labels= keeps every class, absent ones included, in index order (matrix rows: true).
    matrix = confusion_matrix(y_true, y_pred, labels=np.arange(k))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=np.arange(k), zero_division=0)
    predicted = matrix.sum(axis=0)
    accuracy = float(np.trace(matrix) / n)

    result: dict[str, Any] = {
        "task": "single_label", "num_examples": int(n), "classes": names,
        "accuracy": accuracy, "micro_f1": accuracy,
        "macro_precision": float(precision.mean()), "macro_recall": float(recall.mean()),
        "macro_f1": float(f1.mean()), "weighted_f1": float(np.average(f1, weights=support)),
        "per_class": _per_name(names, precision=precision, recall=recall, f1=f1,
                               support=support, predicted=predicted),
        "confusion_matrix": {"labels": names, "matrix": matrix.tolist()},
    }
    if k == 2:
        roc = roc_curve(y_true == 1, y_prob[:, 1])
        result["positive_class"] = names[1]
        result["roc_auc"] = roc["auc"] if roc else None
        result["roc"] = roc
    return result


def _multi_label_inputs(y_true, y_prob) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true)
    y_prob = np.asarray(y_prob, dtype=np.float64)
    if y_true.ndim != 2 or y_true.shape != y_prob.shape:
        raise ValueError(f"y_true and y_prob must both be (n, k), got {y_true.shape} "
                         f"and {y_prob.shape}")
    if y_true.shape[0] == 0:
        raise ValueError("no examples to evaluate")
    if not np.isin(y_true, (0, 1)).all():
        raise ValueError("y_true must hold only 0 and 1")
    if not np.isfinite(y_prob).all():
        raise ValueError("y_prob holds NaN or infinite values")
    return y_true.astype(bool), y_prob


def _label_scores(truth: np.ndarray, pred: np.ndarray, average: str | None) -> tuple:
    """scikit-learn's precision, recall, F1 and support of 0/1 label matrices (n, k)."""
    from sklearn.metrics import precision_recall_fscore_support

    if truth.shape[1] == 1:  # one column reads as a binary target: two classes, not one label
        truth, pred, labels = truth[:, 0], pred[:, 0], [1]
    else:
        labels = None
    return precision_recall_fscore_support(truth.astype(np.int8), pred.astype(np.int8),
                                           labels=labels, average=average, zero_division=0)


def multi_label_metrics(y_true: np.ndarray, y_prob: np.ndarray, label_names: Sequence[str],
                        threshold: float | Sequence[float] | np.ndarray = 0.5) -> dict[str, Any]:
    """Metrics of a classifier that gives each label its own yes/no.

    Args:
        y_true: 0/1 truth, shape (n, k).
        y_prob: Per-label probabilities, shape (n, k).
        label_names: The k label names, in column order.
        threshold: A label is predicted at probability >= this; one, or one per label.

    Returns:
        `task`, `num_examples`, `labels`, `thresholds`, micro and macro
        precision/recall/F1, `subset_accuracy`, `hamming_loss` and `per_label`.

    Raises:
        ValueError: Shapes disagree, y_true is not 0/1, or there are no examples.
    """
    from sklearn.metrics import accuracy_score, hamming_loss

    truth, y_prob = _multi_label_inputs(y_true, y_prob)
    n, k = truth.shape
    names = _check_names(label_names, k, "label")
    thresholds = np.broadcast_to(np.asarray(threshold, dtype=np.float64), (k,)).copy()
    pred = y_prob >= thresholds
    precision, recall, f1, support = _label_scores(truth, pred, None)
    micro_p, micro_r, micro_f1, _ = _label_scores(truth, pred, "micro")
    predicted = pred.sum(axis=0)
    accuracy = (truth == pred).mean(axis=0)
    return {
        "task": "multi_label", "num_examples": int(n), "labels": names,
        "thresholds": thresholds.tolist(),
        "micro_precision": float(micro_p), "micro_recall": float(micro_r),
        "micro_f1": float(micro_f1),
        "macro_precision": float(precision.mean()), "macro_recall": float(recall.mean()),
        "macro_f1": float(f1.mean()),
        "subset_accuracy": float(accuracy_score(truth, pred)),
        "hamming_loss": float(hamming_loss(truth, pred)),
        "per_label": _per_name(names, precision=precision, recall=recall, f1=f1,
                               accuracy=accuracy, support=support, predicted=predicted,
                               threshold=thresholds),
    }


def tune_thresholds(y_true: np.ndarray, y_prob: np.ndarray,
                    grid: Sequence[float] | np.ndarray | None = None) -> np.ndarray:
    """Per-label thresholds that maximise each label's F1 (tune on validation data).

    Args:
        y_true: 0/1 truth, shape (n, k).
        y_prob: Per-label probabilities, shape (n, k).
        grid: Candidate thresholds; default 0.05, 0.10, ..., 0.95.

    Returns:
        Thresholds, shape (k,); among equal F1s the one nearest 0.5 (then the higher),
        so a label without positives keeps 0.5.
    """
    truth, y_prob = _multi_label_inputs(y_true, y_prob)
    grid = np.unique(np.asarray(DEFAULT_THRESHOLD_GRID if grid is None else grid,
                                dtype=np.float64))
    if grid.size == 0:
        raise ValueError("the threshold grid is empty")
    # Counted in numpy: scikit-learn per threshold measured 12x slower.
    positives = truth.sum(axis=0)
    f1 = np.empty((grid.size, truth.shape[1]))
    for i, t in enumerate(grid):
        pred = y_prob >= t
        tp, denominator = (truth & pred).sum(axis=0), positives + pred.sum(axis=0)
        # scikit-learn's F1 with zero_division=0: 2tp / (2tp + fp + fn), 0 where nothing counts.
        f1[i] = np.divide(2 * tp, denominator, out=np.zeros(tp.shape), where=denominator > 0)
    # Candidates within float noise of the best, ranked by distance to 0.5, then higher first.
    preference = np.lexsort((-grid, np.round(np.abs(grid - 0.5), 9)))
    good = np.isclose(f1[preference], f1.max(axis=0), rtol=0, atol=1e-12)
    return grid[preference][good.argmax(axis=0)]


def scalar_summary(result: dict[str, Any], max_per_class: int = 20) -> dict[str, float]:
    """Headline numbers of a result as flat scalars (KFP `Metrics.log_metric`).

    Args:
        result: From `single_label_metrics` or `multi_label_metrics`; its baselines
            follow as `baseline_<metric>` and `<constant answer>_<metric>`.
        max_per_class: Add `f1_<name>` per class when there are at most this many.

    Returns:
        Metric name to value; values that are None (e.g. AUC of one-class data) are left out.
    """
    if result["task"] == "single_label":
        keys = ("accuracy", "macro_f1", "weighted_f1", "macro_precision", "macro_recall",
                "roc_auc")
        per = result["per_class"]
    else:
        keys = ("micro_f1", "macro_f1", "micro_precision", "micro_recall",
                "subset_accuracy", "hamming_loss")
        per = result["per_label"]
    scalars = {"num_examples": float(result["num_examples"])}
    scalars.update({k: float(result[k]) for k in keys if result.get(k) is not None})
    if len(per) <= max_per_class:
        for name, values in per.items():
            key = "f1_" + re.sub(r"\W+", "_", name).strip("_")
            while key in scalars:  # two names that reduce to the same key
                key += "_"
            scalars[key] = float(values["f1"])
    if result.get("tuned"):  # multi-label: F1 at the thresholds tuned on validation
        scalars["tuned_micro_f1"] = float(result["tuned"]["micro_f1"])
        scalars["tuned_macro_f1"] = float(result["tuned"]["macro_f1"])
    for name, numbers in (result.get("baseline") or {}).items():
        prefix = "baseline" if name.endswith("_logreg") else name
        scalars.update({f"{prefix}_{k}": float(v) for k, v in numbers.items() if k != "C"})
    return scalars


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_rows(header: list[str], rows: list[list[Any]]) -> list[str]:
    """The lines of a Markdown table, its number columns right-aligned."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def markdown_report(result: dict[str, Any], title: str) -> str:
    """A Markdown report of a result: headline numbers, per-class table, confusion matrix.

    Args:
        result: From `single_label_metrics` or `multi_label_metrics`.
        title: The report's heading.

    Returns:
        Markdown text.
    """
    f = "{:.4f}".format
    lines = [f"# {title}", ""]
    context = [f"{key}: `{result[key]}`" for key in ("split", "model_dir", "dataset_dir")
               if result.get(key)]
    if context:
        lines += ["- " + c for c in context] + [""]
    lines.append(f"**Examples:** {result['num_examples']}  ")
    single = result["task"] == "single_label"
    headline = (([("Accuracy", "accuracy")], [("Macro F1", "macro_f1"),
                                              ("Weighted F1", "weighted_f1")]) if single else
                ([("Micro F1", "micro_f1"), ("Macro F1", "macro_f1")],
                 [("Subset accuracy", "subset_accuracy"), ("Hamming loss", "hamming_loss")]))
    lines += [" · ".join(f"**{name}:** {f(result[key])}" for name, key in row) + "  "
              for row in headline]  # (words, metric) pairs, a line each
    if "roc_auc" in result:
        auc = "n/a (one class only)" if result["roc_auc"] is None else f(result["roc_auc"])
        lines.append(f"**ROC AUC** (positive class `{result['positive_class']}`): {auc}  ")
    # One row per class (label): its scores to 4 places, counts as they are.
    kind, columns = ("class", ["precision", "recall", "f1"]) if single else (
        "label", ["threshold", "precision", "recall", "f1", "accuracy"])
    lines += ["", f"## Per {kind}", ""]
    lines += markdown_rows(
        [kind, *("F1" if c == "f1" else c for c in columns), "support", "predicted"],
        [[name, *(f"{v[c]:.2f}" if c == "threshold" else f(v[c]) for c in columns),
          v["support"], v["predicted"]] for name, v in result[f"per_{kind}"].items()])
    if single:
        names = result["confusion_matrix"]["labels"]
        lines += ["", "## Confusion matrix", "", "Rows: true class; columns: predicted class.", ""]
        if len(names) <= REPORT_MAX_MATRIX_CLASSES:
            lines += markdown_rows(["true \\ predicted", *names],
                                   [[name, *row] for name, row in
                                    zip(names, result["confusion_matrix"]["matrix"])])
        else:
            lines.append(f"{len(names)} classes: too many for a table; see metrics.json.")
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], output_dir: str, report: str) -> None:
    """Writes `metrics.json` and `report.md` into `output_dir` (`read_evaluation` reads it)."""
    os.makedirs(output_dir, exist_ok=True)
    write_json_atomically(os.path.join(output_dir, EVALUATION_FILE), result, sort_keys=False,
                          allow_nan=False)
    write_text_atomically(os.path.join(output_dir, REPORT_FILE), report)


def read_evaluation(evaluation_dir: str) -> dict[str, Any]:
    """Loads `metrics.json` from an evaluation step's output folder."""
    return read_json(os.path.join(evaluation_dir, EVALUATION_FILE))
