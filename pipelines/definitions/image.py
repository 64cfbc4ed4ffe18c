"""The image classification pipeline: shard -> train DenseNet121 -> evaluate (-> register)."""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import json
import os
from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, Metrics, Model

from components.common.metrics import read_evaluation
from components.common.report_html import REPORT_HTML_FILE
from components.shard.contract import MANIFEST_NAME
from pipelines.definitions import registry, tuning
from pipelines.definitions.steps import Steps, Target

PIPELINE_NAME = "image-classifier"
TUNING_PIPELINE_NAME = "image-classifier-tuning"


def build(image: str, target: "Target | None" = None,
          tune: "tuning.TuningSettings | None" = None):
    """Builds the image pipeline.

    Args:
        image: URI of the TensorFlow runtime image every step runs in.
        target: Where each step runs: `VertexSettings` (custom jobs; the Model Registry
            upload is compiled in only when `target.serving_image` names a pinned image) or
            `KubeflowSettings` (pods); None for the local (`kfp.local`) variant, whose steps
            run as plain components and which skips the model registry.
        tune: Compiles the tuning variant: after sharding, the target's search (a Vertex
            tuning job, or trials in a ParallelFor) explores `tune.spaces["image"]`, and
            the model is trained with the best trial's values.

    Returns:
        A `@dsl.pipeline` function.
    """
    steps = Steps("image", image, target, tune)
    default_job_account = steps.default_job_account

    class Outputs(NamedTuple):
        dataset: Dataset
        model: Model
        metrics: Metrics
        evaluation: Artifact
        register: bool

    # Defaults written by python -m tools.signatures from the steps they feed
    # (edit there); their help: `Steps._describe`.
    @steps.pipeline(PIPELINE_NAME, TUNING_PIPELINE_NAME,
                    "Shards a bucket folder of class sub-folders into TFRecords, ",
                    "fine-tunes DenseNet121 on GPUs, evaluates it and registers it.")
    def image_pipeline(
        data_uri: str,
        image_size: int = 224,
        image_format: str = "jpeg",
        jpeg_quality: int = 95,
        resize_method: str = "crop",
        train_fraction: float = 0.8,
        validation_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 42,
        target_shard_mb: float = 100.0,
        min_shards_per_split: int = 16,
        max_skipped_fraction: float = 0.05,
        shard_workers: int = 0,
        weights: str = "imagenet",
        epochs: int = 10,
        fine_tune_epochs: int = 10,
        batch_size: int = 32,
        learning_rate: float = 1e-3,
        fine_tune_learning_rate: float = 1e-4,
        unfreeze_blocks: int = 1,
        dropout: float = 0.2,
        flip: bool = True,
        rotation: float = 0.05,
        zoom: float = 0.1,
        precision: str = "auto",
        early_stopping_patience: int = 3,
        reduce_lr_patience: int = 2,
        steps_per_epoch: int = 0,
        eval_batch_size: int = 64,
        register_model: bool = True,
        registration_metric: str = "accuracy",
        registration_threshold: float = 0.8,
        registration_beats_baselines: bool = False,
        model_display_name: str = "densenet121-image-classifier",
        predict_uri: str = "",
        tracking_uri: str = "",
        job_service_account: str = default_job_account,
    ) -> Outputs:
        """Trains and evaluates a DenseNet121 classifier on a folder of labelled images."""
        params = locals()  # the pipeline parameters, before anything else is named
        preflight = steps.preflight(params)
        shard = steps.run("shard", params, data_fingerprint=preflight.outputs["data_fingerprint"],
                          num_workers=shard_workers)
        train = steps.train(params, dataset=shard.outputs["dataset"],
                            weights_fingerprint=preflight.outputs["weights_fingerprint"])
        return steps.evaluate_and_publish(
            Outputs, params, train, shard.outputs["dataset"], split="test",
            predict_fingerprint=preflight.outputs["predict_fingerprint"])

    return image_pipeline


def summarize(outputs: dict) -> dict:
    """What a local run of the image pipeline produced, in the shape of `summary.json`.

    Args:
        outputs: The pipeline's outputs from `kfp.local` (artifacts and the gate's decision).

    Returns:
        `{"metrics": {...}, "baseline": {pixels_logreg: {...}, majority_class: {...}},
        "sharding": {...}, "provenance": {...}, "registration": {...}, "artifacts": {...}}`.
    """
    with open(os.path.join(outputs["dataset"].path, MANIFEST_NAME)) as f:
        manifest = json.load(f)
    metrics = read_evaluation(outputs["evaluation"].path)
    return {
        "metrics": {
            "accuracy": metrics["accuracy"],
            "macro_f1": metrics["macro_f1"],
            "per_label": {
                name: {k: values[k] for k in ("precision", "recall", "f1", "support")}
                for name, values in metrics["per_class"].items()
            },
        },
        # Cheap models on the same split, with the same metric names (common.baselines).
        "baseline": metrics.get("baseline", {}),
        "sharding": {
            "examples_in": manifest["examples_in"],
            "written": {s: v["count"] for s, v in manifest["splits"].items()},
            "skipped": manifest["skipped"],
            "ignored": manifest["ignored"],
            "missing_classes": manifest["missing_classes"],
        },
        "provenance": {key: outputs["model"].metadata.get(key)
                       for key in ("git_sha", "data_sha256", "parameters")},
        "registration": registry.local_registration(outputs["register"]),
        "artifacts": {**{name: outputs[name].path
                         for name in ("dataset", "model", "metrics", "evaluation")},
                      "report_html": os.path.join(outputs["evaluation"].path,
                                                  REPORT_HTML_FILE)},
    }
