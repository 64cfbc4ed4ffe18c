"""Evaluates a trained image classifier (tf-keras: Keras 3's `fit` fails under
MultiWorkerMirroredStrategy, keras-team/keras#20585) on one split of a sharded dataset."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from components.common import baselines
from components.common.metrics import (
    markdown_report,
    single_label_metrics,
    write_outputs,
)
from components.common.report_html import REPORT_HTML_FILE
from components.common.storage import read_json, write_text_atomically
from components.evaluate_image.contract import settings_problems
from components.evaluate_image.report import image_report
from components.formats.image_models import load_keras_model
from components.formats.shards import make_dataset
from components.shard.contract import read_manifest
from components.train_image.contract import HISTORY_FILE, MODEL_FILE, load_class_names

log = logging.getLogger(__name__)


class EvaluationError(ValueError):
    """The model and the data cannot be evaluated together; the message says why."""


def check_classes(model_classes: Sequence[str], data_classes: Sequence[str]) -> None:
    """Fails unless the model's classes (output columns) are the data's labels, in order.

    Raises:
        EvaluationError: Saying which names are missing, extra or out of order.
    """
    model_classes, data_classes = list(model_classes), list(data_classes)
    if model_classes == data_classes:
        return
    only_model = [c for c in model_classes if c not in data_classes]
    only_data = [c for c in data_classes if c not in model_classes]
    if only_model or only_data:
        detail = f"only in the model: {only_model}; only in the dataset: {only_data}"
    else:
        detail = "same names in a different order"
    raise EvaluationError(
        f"the model's classes {model_classes} do not match the dataset's {data_classes} "
        f"({detail}): evaluate the model on the dataset it was trained for"
    )


def predict(model: tf_keras.Model, dataset: tf.data.Dataset, batch_size: int,
            image_shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """`(y_true (n,), y_prob (n, k))` of the model over unbatched (uint8 image, label)s."""
    # One traced graph for every batch size: the last, smaller batch does not retrace.
    infer = tf.function(lambda x: model(x, training=False),
                        input_signature=[tf.TensorSpec((None, *image_shape), tf.float32)])
    labels, probs = [], []
    for images, batch_labels in dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE):
        probs.append(infer(tf.cast(images, tf.float32)).numpy())
        labels.append(batch_labels.numpy())
    if not probs:
        return np.zeros((0,), np.int64), np.zeros((0, 0), np.float32)
    return np.concatenate(labels), np.concatenate(probs)


# Pixel baseline: images shrunk to this side (area averaging), at most this many training
# images (a seeded sample): seconds of work whatever the dataset.
BASELINE_SIDE = 16
BASELINE_MAX_TRAIN = 20_000


def split_pixels(dataset_dir: str, manifest: dict[str, Any], split: str,
                 limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`(features (n, side*side*3) in 0..1, labels (n,))` of a split's images, downscaled,
    in the shards' order; at most `limit` of them (a sample seeded by 0) unless None."""
    side = BASELINE_SIDE
    dataset = make_dataset(dataset_dir, split, manifest=manifest, deterministic=True).map(
        lambda image, label: (tf.image.resize(image, (side, side), method="area") / 255.0,
                              label), num_parallel_calls=tf.data.AUTOTUNE)
    features, labels = [], []
    for images, batch_labels in dataset.batch(256):
        features.append(images.numpy().reshape(len(images), -1))
        labels.append(batch_labels.numpy())
    x, y = np.concatenate(features), np.concatenate(labels)
    if limit is not None and len(y) > limit:
        keep = np.sort(np.random.default_rng(0).choice(len(y), limit, replace=False))
        x, y = x[keep], y[keep]
    return x, y


def pixel_baselines(dataset_dir: str, manifest: dict[str, Any], split: str, y_true: np.ndarray,
                    class_names: Sequence[str]) -> dict[str, Any]:
    """Logistic regression on `BASELINE_SIDE`-pixel images and the majority class.

    Fitted on the train split (C chosen on validation), scored on `split`, whose labels
    `y_true` the model was scored on. Returns {} when train or validation is empty.
    """
    if not all(manifest["splits"].get(name, {}).get("count", 0)
               for name in ("train", "validation")):
        return {}
    one_hot = np.eye(len(class_names))

    def read(name, limit=None):
        x, y = split_pixels(dataset_dir, manifest, name, limit)
        return x, one_hot[y]

    x_test, _ = split_pixels(dataset_dir, manifest, split)
    return baselines.linear_and_constant(
        baselines.PIXELS, read("train", BASELINE_MAX_TRAIN), read("validation"),
        (x_test, one_hot[y_true]), class_names, "single_label")


def evaluate_image_model(
    model_dir: str,
    dataset_dir: str,
    output_dir: str,
    split: str = "test",
    batch_size: int = 64,
) -> dict[str, Any]:
    """Evaluates a trained image classifier on one split of a sharded dataset.

    Args:
        model_dir: Folder with `model.keras` and `labels.json` (the trainer's output).
        dataset_dir: Folder written by the sharding step (shards and `manifest.json`).
        output_dir: Folder for `metrics.json`, `report.md` and `report.html`.
        split: "train", "validation" or "test".
        batch_size: Images per forward pass.

    Returns:
        The metrics written to `metrics.json` (see `single_label_metrics`), with `split`,
        `dataset_dir`, `model_dir` and `baseline` (`{"pixels_logreg": {...},
        "majority_class": {...}}`; empty when the train or validation split is).

    Raises:
        EvaluationError: Missing model files, or model and dataset disagree on
            classes, image size or example count.
        FileNotFoundError: `dataset_dir` has no manifest.
    """
    if problems := settings_problems(batch_size):
        raise EvaluationError("; ".join(problems))
    class_names = load_class_names(model_dir)
    manifest = read_manifest(dataset_dir)
    # Fail on a class mismatch before paying for loading the model.
    check_classes(class_names, manifest["classes"])
    path = os.path.join(model_dir, MODEL_FILE)
    if not tf.io.gfile.exists(path):
        raise EvaluationError(f"{path} not found: {model_dir!r} is not a trained model folder")
    model = load_keras_model(path, compile=False)
    history = read_json(os.path.join(model_dir, HISTORY_FILE), optional=True)
    if split not in manifest["splits"]:
        raise EvaluationError(f"split must be one of {sorted(manifest['splits'])}, got {split!r}")
    expected = manifest["splits"][split]["count"]
    if expected == 0:
        raise EvaluationError(f"split {split!r} of {dataset_dir!r} has no examples")
    image = manifest["image"]
    image_shape = (image["height"], image["width"], image["channels"])
    shape = tuple(model.input_shape)
    if len(shape) != 4 or shape[-1] not in (None, 3):
        raise EvaluationError(f"the model takes inputs of shape {shape}, not (batch, H, W, 3)")
    if shape[1] not in (None, image_shape[0]) or shape[2] not in (None, image_shape[1]):
        raise EvaluationError(
            f"the model takes {shape[1]}x{shape[2]} images but the dataset holds "
            f"{image_shape[0]}x{image_shape[1]}: shard the data with the image size the model "
            "was trained on")

    dataset = make_dataset(dataset_dir, split, manifest=manifest, deterministic=True)
    y_true, y_prob = predict(model, dataset, batch_size, image_shape)
    if y_true.size != expected:
        raise EvaluationError(f"read {y_true.size} examples of split {split!r} but the manifest "
                              f"lists {expected}: the shards changed after it was written")
    if y_prob.ndim != 2 or y_prob.shape[1] != len(class_names):
        raise EvaluationError(f"the model outputs shape {y_prob.shape[1:]} per batch but has "
                              f"{len(class_names)} classes")
    if (y_prob.min() < -1e-6 or y_prob.max() > 1 + 1e-6
            or not np.allclose(y_prob.sum(axis=1), 1.0, atol=1e-3)):
        # Accuracy and F1 only need the argmax; ROC thresholds would not be probabilities.
        log.warning("model outputs are not softmax probabilities (rows do not sum to 1)")

    metrics = single_label_metrics(y_true, y_prob, class_names)
    result = {"split": split, "dataset_dir": dataset_dir, "model_dir": model_dir, **metrics}
    result["baseline"] = pixel_baselines(dataset_dir, manifest, split, y_true, class_names)
    write_outputs(result, output_dir,
                  markdown_report(result, f"Image classifier evaluation: {split} split")
                  + baselines.markdown_table(result))
    images = (image.numpy() for image, _ in
              make_dataset(dataset_dir, split, manifest=manifest, deterministic=True))
    write_text_atomically(os.path.join(output_dir, REPORT_HTML_FILE),
                          image_report(result, y_true, y_prob, history, images))
    return result
