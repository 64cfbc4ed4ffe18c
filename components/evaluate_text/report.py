"""The text evaluation's HTML report: each label at the fixed and tuned thresholds, how the
language model and the classifier trained, and the texts it gets most wrong."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from components.common import report_html

WORST_MISTAKES = 10
SNIPPET_CHARS = 300


def worst_mistakes(truth: np.ndarray, probs: np.ndarray, predicted: np.ndarray,
                   limit: int = WORST_MISTAKES) -> list[int]:
    """Rows whose predicted labels differ from the truth, largest probability error first."""
    wrong = np.flatnonzero((predicted != truth).any(axis=1))
    error = np.abs(truth[wrong] - probs[wrong]).sum(axis=1)
    return wrong[np.argsort(-error, kind="stable")][:limit].tolist()


def _names(row: np.ndarray, labels: Sequence[str]) -> str:
    return ", ".join(label for label, on in zip(labels, row) if on) or "(none)"


def mistakes_list(indices: Sequence[int], texts: Sequence[str], truth: np.ndarray,
                  predicted: np.ndarray, probs: np.ndarray, labels: Sequence[str]) -> str:
    """Each text's opening, true and predicted labels, and the scores of both."""
    if not indices:
        return '<p class="muted" id="mistakes">No text was misclassified.</p>'
    items = []
    for i in indices:
        text = texts[i]
        snippet = text[:SNIPPET_CHARS] + ("…" if len(text) > SNIPPET_CHARS else "")
        shown = sorted({*np.flatnonzero(truth[i]), *np.flatnonzero(predicted[i])})
        scores = ", ".join(f"{labels[j]} {probs[i, j]:.2f}" for j in shown)
        items.append(f'<div class="snippet mistake"><div>{html.escape(snippet)}</div>'
                     f'<div class="muted">true <b>{html.escape(_names(truth[i], labels))}'
                     f"</b> · predicted <b>{html.escape(_names(predicted[i], labels))}</b> · "
                     f"scores {html.escape(scores)}</div></div>")
    return f'<div id="mistakes">{"".join(items)}</div>'


def text_report(result: Mapping[str, Any], texts: Sequence[str], truth: np.ndarray,
                probs: np.ndarray, training: Mapping[str, Any] | None) -> str:
    """The report's HTML.

    Args:
        result: The evaluation's metrics (multi-label: with `tuned`; plus `split`).
        texts: The split's texts, in row order.
        truth: 0/1 label matrix (n, k) (one-hot for single-label).
        probs: Probabilities (n, k).
        training: The trainer's metrics.json (its `history` rows), None if absent.
    """
    multi = result["task"] == "multi_label"
    labels = result["labels"] if multi else result["classes"]
    if multi:
        fixed = np.asarray(result["thresholds"])
        tuned = np.asarray(result["tuned"]["thresholds"])
        predicted = (probs >= fixed).astype(int)
        sections = [
            ("Per label, fixed and tuned thresholds", report_html.metric_bars(
                "per-label", result["per_label"],
                "Solid: at the fixed threshold; light: at the thresholds tuned on the "
                "validation split.", result["tuned"]["per_label"], ("fixed", "tuned"))),
            ("Precision-recall per label", report_html.curves(
                "curves", truth, probs, labels, "Markers: the fixed (circle) and tuned "
                "(square) thresholds on each label's curve.",
                marks={"fixed threshold": fixed.tolist(), "tuned threshold": tuned.tolist()})),
            ("Label co-occurrence", report_html.cooccurrence(truth, labels)),
        ]
    else:
        predicted = np.eye(len(labels), dtype=int)[probs.argmax(axis=1)]
        sections = report_html.single_label_sections(result, truth, probs, labels,
                                                     bars_id="per-label")
    history = (training or {}).get("history", [])
    for model, title, pairs in (
            ("lm", "Language model fine-tuning", [("train_loss", "valid_loss"),
                                                  ("accuracy", "perplexity")]),
            ("classifier", "Classifier training", [("train_loss", "valid_loss"),
                                                   ("f1_score", "accuracy_multi" if multi
                                                    else "accuracy")])):
        stages: dict[str, list] = {}  # the model's history rows, stage by stage
        for row in history:
            if row.get("model") == model:
                stages.setdefault(row["stage"], []).append(row)
        if stages:
            sections.append((title, report_html.training_curves(
                f"training-{model}", stages, pairs,
                "Per epoch; dotted lines mark where each stage starts (gradual unfreezing).")))
    if result.get("baseline"):
        deep = {**result, "tuned_micro_f1": (result.get("tuned") or {}).get("micro_f1")}
        names = ["micro_f1", "macro_f1"] + (["tuned_micro_f1"] if multi else ["accuracy"])
        sections.insert(0, ("Baselines on the same split", report_html.baseline_table(
            deep, names)))
    mistakes = worst_mistakes(truth, probs, predicted)
    sections.append((f"Largest mistakes ({len(mistakes)} shown)", mistakes_list(
        mistakes, texts, truth, predicted, probs, labels)))
    summary = {"split": result["split"], "texts": result["num_examples"],
               "micro F1": result["micro_f1"], "macro F1": result["macro_f1"]}
    if multi:
        summary["micro F1, tuned thresholds"] = result["tuned"]["micro_f1"]
    linear = (result.get("baseline") or {}).get("tfidf_logreg")
    if linear:
        summary["TF-IDF + logistic regression, micro F1"] = linear["micro_f1"]
    return report_html.page(f"Text classifier evaluation: {result['split']} split", summary,
                            sections)
