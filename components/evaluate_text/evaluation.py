"""Evaluates a trained text classifier on one split of a prepared dataset (multi-label: at
the fixed and the tuned thresholds). Only `fastai.text` is imported, never `fastai.vision`."""

from __future__ import annotations

import os
import re
from typing import Any

from components.common import baselines
from components.common.metrics import (
    markdown_report,
    multi_label_metrics,
    single_label_metrics,
    write_outputs,
)
from components.common.report_html import REPORT_HTML_FILE
from components.common.storage import read_json, write_text_atomically
from components.evaluate_text.contract import settings_problems
from components.evaluate_text.report import text_report


def evaluate_text_model(model_dir: str, dataset_dir: str, output_dir: str, split: str = "test",
                        threshold: float | None = None, batch_size: int = 64,
                        baseline: bool = True) -> dict[str, Any]:
    """Scores a trained text classifier on one split; writes metrics.json, report.md/.html.

    Args:
        model_dir: A text training step's output (fastai or transformer) with `labels.json`.
        dataset_dir: Preparation step output; its labels must equal the model's.
        output_dir: Folder for the outputs.
        split: "train", "validation" or "test".
        threshold: Fixed multi-label threshold; None uses the model's.
        batch_size: Texts per forward pass.
        baseline: Also score TF-IDF + logistic regression (fitted on train) and the
            constant answer on the same split (`baselines.text_baselines`).

    Returns:
        The `multi_label_metrics` or `single_label_metrics` result at the fixed threshold,
        plus `split`, `model_dir`, `dataset_dir`, `tuned` (multi-label: at the thresholds
        tuned on validation) and `baseline` (empty when not asked for).

    Raises:
        ValueError: Settings `settings_problems` refuses, an empty split, or labels that
            disagree.
    """
    from components.prepare_text.contract import read_manifest, read_split
    from components.text_common.contract import TRAINING_METRICS_FILE, read_labels
    from components.text_common.models import load_text_model

    if problems := settings_problems(split, batch_size):
        raise ValueError("; ".join(problems))
    info = read_labels(model_dir)
    manifest = read_manifest(dataset_dir)
    labels = info["labels"]
    if manifest["labels"] != labels:
        raise ValueError(f"the dataset's labels {manifest['labels']} differ from the model's "
                         f"{labels}")
    frame = read_split(dataset_dir, split)
    if frame.empty:
        raise ValueError(f"split {split!r} of {dataset_dir} has no rows")
    texts = frame[manifest["text_column"]].tolist()
    probs = load_text_model(model_dir).probabilities(texts, batch_size)
    truth = frame[labels].to_numpy()
    if info["task"] == "multi_label":
        fixed_threshold = info["threshold"] if threshold is None else threshold
        result = multi_label_metrics(truth, probs, labels, fixed_threshold)
        tuned = info.get("thresholds") or {}
        result["tuned"] = multi_label_metrics(
            truth, probs, labels, [tuned.get(label, fixed_threshold) for label in labels])
        title = f"Text classifier on {split}: threshold {fixed_threshold:g}"
    else:
        fixed_threshold = None
        result = single_label_metrics(truth.argmax(axis=1), probs, labels)
        title = f"Text classifier on {split}"
    result.update(split=split, model_dir=model_dir, dataset_dir=dataset_dir)
    report = markdown_report(result, title)
    if "tuned" in result:
        nested = markdown_report({**result["tuned"], "split": split},
                                 "Per-label thresholds tuned on the validation split")
        report += "\n" + re.sub(r"^(#+) ", r"#\1 ", nested, flags=re.MULTILINE)  # one level down
    result["baseline"] = (_baselines(dataset_dir, manifest, frame, result["task"], fixed_threshold)
                          if baseline else {})
    report += baselines.markdown_table(result)
    write_outputs(result, output_dir, report)
    write_text_atomically(os.path.join(output_dir, REPORT_HTML_FILE), text_report(
        result, texts, truth, probs,
        read_json(os.path.join(model_dir, TRAINING_METRICS_FILE), optional=True)))
    return result


def _baselines(dataset_dir: str, manifest: dict[str, Any], frame, task: str,
               threshold: float | None) -> dict[str, Any]:
    from components.prepare_text.contract import read_split

    text, labels = manifest["text_column"], manifest["labels"]

    def pair(split_frame):
        return split_frame[text].astype(str).tolist(), split_frame[labels].to_numpy()

    train, valid = read_split(dataset_dir, "train"), read_split(dataset_dir, "validation")
    if train.empty or valid.empty:
        return {}
    return baselines.text_baselines(pair(train), pair(valid), pair(frame), labels, task,
                                    threshold)
