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

    # Defaults and Args help written by python -m tools.signatures from the
    # steps they feed and pipelines/definitions/help_text.py (edit there).
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
        """Trains and evaluates a DenseNet121 classifier on a folder of labelled images.

        Args:
            data_uri: Folder (gs://bucket/prefix or local path) with one sub-folder of images per class.
            image_size: Height and width in pixels the images are resized to and stored at (the model is trained at this size).
            image_format: Shard image encoding: "jpeg" (about 4x smaller, decoded when read) or "raw" (uint8, no decode).
            jpeg_quality: JPEG quality 1-95 when image_format is "jpeg".
            resize_method: "crop" scales the shorter side to image_size and center-crops; "pad" scales the longer side and pads with black.
            train_fraction: Share of each class for training.
            validation_fraction: Share of each class for validation (early stopping, learning-rate schedule).
            test_fraction: Share of each class for the final test.
            seed: Seed of the split, shuffles, initialisation and augmentation.
            target_shard_mb: Aimed shard size in MB (TensorFlow advises 10 MB+, ideally ~100 MB).
            min_shards_per_split: Fewest shards per split so readers can interleave (capped at the number of examples).
            max_skipped_fraction: Fail when more than this share of the files is unreadable.
            shard_workers: Sharding processes; 0 uses every CPU core of the machine, fewer for a small dataset (one per 200 images).
            weights: Base weights: "imagenet" (DenseNet121's, downloaded by Keras), "none" (DenseNet121 from scratch), or the URI (gs:// or local) of a no-top .h5 weights file of a tf-keras DenseNet: 121, 169, 201 or another layout, read from the file.
            epochs: Epochs training only the new top on the frozen pretrained base (from scratch: epochs + fine_tune_epochs of full training).
            fine_tune_epochs: Epochs fine-tuning the top dense blocks after the head phase, at fine_tune_learning_rate.
            batch_size: Examples per replica (GPU) per step; the global batch is this times the number of replicas.
            learning_rate: Adam learning rate of the head phase for one replica; scaled linearly with the replicas.
            fine_tune_learning_rate: Adam learning rate of the fine-tune phase for one replica; scaled linearly with the replicas.
            unfreeze_blocks: Dense blocks (1-4, counted from the top) trained in fine-tuning; BatchNorm layers stay frozen.
            dropout: Dropout rate before the classification layer.
            flip: Random horizontal flips of training images.
            rotation: Random rotation of training images as a fraction of a full turn (0.05 = up to 18 degrees); 0 turns it off.
            zoom: Random zoom of training images by a factor in [1 - zoom, 1 + zoom]; 0 turns it off.
            precision: "auto" (mixed_float16 when every GPU has compute capability 7.0+), "on" or "off" (float32).
            early_stopping_patience: Epochs without validation-loss improvement before a phase stops, keeping its best weights; 0 turns it off.
            reduce_lr_patience: Epochs without validation-loss improvement before the learning rate is cut 5x; 0 turns it off.
            steps_per_epoch: Training steps per epoch; 0 for one pass over the training split.
            eval_batch_size: Images per forward pass in the evaluation (and prediction).
            register_model: Upload the model to the Vertex Model Registry when it clears the threshold.
            registration_metric: Evaluation metric compared with the threshold: "accuracy" or "macro_f1".
            registration_threshold: Register only when the metric on the test split is at least this.
            registration_beats_baselines: Also require the metric above every cheap baseline the evaluation scored on the same split (logistic regression on downscaled pixels, and the constant answer).
            model_display_name: Name of the model in the Model Registry; a later run adds a version to it.
            predict_uri: gs:// folder of new images (any depth) to label with the trained model, one JSON line each; empty skips prediction.
            tracking_uri: MLflow tracking server URL (http/https), sqlite:///FILE, or a gs:// folder used as a file store; one MLflow run per pipeline run, named after it. Empty: no tracking.
            job_service_account: Service account the custom jobs (sharding, training, evaluation, prediction) run as on Vertex; empty: Vertex's Custom Code Service Agent. Not the pipeline run's own account. Ignored by local runs.
        """
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
