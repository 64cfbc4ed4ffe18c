"""The image evaluation's HTML report: where the confusions are, how training went, and the
test images it gets most confidently wrong."""

from __future__ import annotations

import html
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from components.common import report_html

WORST_MISTAKES = 12


def worst_mistakes(y_true: np.ndarray, y_prob: np.ndarray, limit: int = WORST_MISTAKES
                   ) -> list[int]:
    """Indices of the wrongly classified examples, most confident first."""
    predicted = y_prob.argmax(axis=1)
    wrong = np.flatnonzero(predicted != y_true)
    confidence = y_prob[wrong, predicted[wrong]]
    return wrong[np.argsort(-confidence, kind="stable")][:limit].tolist()


def pick(images: Iterable[np.ndarray], indices: Sequence[int]) -> dict[int, np.ndarray]:
    """The images at `indices` of a stream read in the evaluation's order (stops early)."""
    wanted = set(indices)
    read = itertools.islice(images, max(wanted, default=-1) + 1)
    return {index: np.asarray(image) for index, image in enumerate(read) if index in wanted}


def mistakes_grid(indices: Sequence[int], images: Mapping[int, np.ndarray], y_true: np.ndarray,
                  y_prob: np.ndarray, classes: Sequence[str]) -> str:
    """Thumbnails of the given examples, each with its true and predicted class."""
    if not indices:
        return '<p class="muted" id="mistakes">No test image was misclassified.</p>'
    cells = []
    for index in indices:
        predicted = int(y_prob[index].argmax())
        cells.append(
            f'<div class="cell mistake"><img alt="example {index}" '
            f'src="{report_html.thumbnail_data_uri(images[index])}"><div>true '
            f"<b>{html.escape(classes[y_true[index]])}</b><br>predicted "
            f"<b>{html.escape(classes[predicted])}</b> "
            f"({y_prob[index, predicted]:.2f})</div></div>")
    return f'<div class="grid" id="mistakes">{"".join(cells)}</div>'


def image_report(result: Mapping[str, Any], y_true: np.ndarray, y_prob: np.ndarray,
                 history: Mapping[str, Sequence[Mapping[str, float]]] | None,
                 images: Iterable[np.ndarray]) -> str:
    """The report's HTML.

    Args:
        result: The evaluation's metrics (`single_label_metrics` plus `split`).
        y_true: True class indices (n,).
        y_prob: Probabilities (n, k).
        history: The trainer's history.json (phase -> epoch rows), None if absent.
        images: The split's images in the evaluation's order (read until the mistakes
            are found).
    """
    classes = result["classes"]
    onehot = np.eye(len(classes), dtype=int)[y_true]
    mistakes = worst_mistakes(y_true, y_prob)
    sections = report_html.single_label_sections(result, onehot, y_prob, classes)
    if history:
        sections.append(("Training", report_html.training_curves(
            "training", history, [("loss", "val_loss"), ("accuracy", "val_accuracy")],
            "Per epoch; dotted lines mark where each phase starts (head, then fine-tuning "
            "of the unfrozen blocks).")))
    sections.append((f"Most confident mistakes ({len(mistakes)} shown)", mistakes_grid(
        mistakes, pick(images, mistakes), y_true, y_prob, classes)))
    summary = {"split": result["split"], "examples": result["num_examples"],
               "accuracy": result["accuracy"], "macro F1": result["macro_f1"]}
    linear = (result.get("baseline") or {}).get("pixels_logreg")
    if linear:
        summary["logistic regression on downscaled pixels, accuracy"] = linear["accuracy"]
        sections.insert(0, ("Baselines on the same split", report_html.baseline_table(
            result, ["accuracy", "macro_f1", "weighted_f1"])))
    return report_html.page(f"Image classifier evaluation: {result['split']} split", summary,
                            sections)
