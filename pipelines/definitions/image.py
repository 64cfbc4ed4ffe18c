"""The image classification pipeline: shard -> train DenseNet121 -> evaluate (-> register)."""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import json
import os
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Metrics, Model

from components.common.metrics import read_evaluation
from components.common.report_html import REPORT_HTML_FILE
from components.evaluate_image import component as evaluate_component
from components.predict import component as predict_component
from components.preflight import component as preflight_component
from components.register import component as register_component
from components.shard import component as shard_component
from components.shard.contract import MANIFEST_NAME
from components.track import component as track_component
from components.train_image import component as train_component
from components.tune import component as tune_component
from pipelines.definitions import registry, tuning
from pipelines.definitions.vertex import VertexSettings, preflight_inputs

PIPELINE_NAME = "image-classifier"
TUNING_PIPELINE_NAME = "image-classifier-tuning"


def build(image: str, vertex: "VertexSettings | None" = None,
          tune: "tuning.TuningSettings | None" = None):
    """Builds the image pipeline.

    Args:
        image: URI of the TensorFlow runtime image every step runs in.
        vertex: Where each step runs on Vertex; None for the local (`kfp.local`) variant,
            whose steps run as plain components and which skips the Model Registry upload.
            The upload is compiled in only when `vertex.serving_image` names a pinned image.
        tune: Compiles the tuning variant (Vertex only): after sharding, a Vertex
            hyperparameter tuning job searches `tune.spaces["image"]`, and the model is
            trained with the best trial's values.

    Returns:
        A `@dsl.pipeline` function.
    """
    if tune is not None and vertex is None:
        raise ValueError("the tuning variant runs on Vertex: give vertex settings")
    preflight_op = preflight_component.build_image(image)
    shard_op = shard_component.build(image)
    train_op = train_component.build(image)
    evaluate_op = evaluate_component.build(image)
    gate_op = register_component.build_gate(image)
    predict_op = predict_component.build(image)
    track_op = track_component.build_classifier(image)
    if tune is not None:
        tune_op = tuning.as_tuning_job(train_op, "image", tune.spaces["image"], tune, vertex,
                                       vertex.machines["train_image"], "tune-densenet121")
        best_op = tune_component.build_best_trial("image", image)
    if vertex is not None:
        # Wrapped before the pipeline body uses them (kubeflow/pipelines#9320).
        shard_op = vertex.wrap(shard_op, "shard", "shard-images")
        train_op = vertex.wrap(train_op, "train_image", "train-densenet121")
        evaluate_op = vertex.wrap(evaluate_op, "evaluate_image", "evaluate-image-classifier")
        predict_op = vertex.wrap(predict_op, "predict_image", "predict-images")

    # The jobs' account is a run-time choice (GCPC passes it as a parameter of the job);
    # its default is compile.py's --service-account.
    default_job_account = vertex.service_account if vertex is not None else ""

    class Outputs(NamedTuple):
        dataset: Dataset
        model: Model
        metrics: Metrics
        evaluation: Artifact
        register: bool

    @dsl.pipeline(name=PIPELINE_NAME if tune is None else TUNING_PIPELINE_NAME,
                  description="Shards a bucket folder of class sub-folders into TFRecords, "
                              + ("" if tune is None else "tunes hyperparameters in a Vertex "
                                 "tuning job, ")
                              + "fine-tunes DenseNet121 on GPUs, evaluates it and registers it.")
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
            data_uri: gs://bucket/prefix (or local folder) with one sub-folder of images per class.
            image_size: Height and width in pixels the images are resized to (and trained at).
            image_format: Shard image encoding, "jpeg" or "raw" (uint8).
            jpeg_quality: JPEG quality 1-95.
            resize_method: "crop" (center crop) or "pad" (letterbox).
            train_fraction: Share of each class for training.
            validation_fraction: Share of each class for validation (early stopping, LR schedule).
            test_fraction: Share of each class for the final evaluation.
            seed: Seed of the split, shuffles, initialisation and augmentation.
            target_shard_mb: Aimed shard size in MB.
            min_shards_per_split: Fewest shards per split, so reads can interleave.
            max_skipped_fraction: Fail when more than this share of files is unreadable.
            shard_workers: Sharding processes; 0 uses every core of the machine.
            weights: DenseNet121 base weights: "imagenet", "none" (from scratch) or a gs:// URI of a no-top .h5 file.
            epochs: Epochs training the new head on the frozen base.
            fine_tune_epochs: Epochs fine-tuning the top dense blocks at the lower learning rate.
            batch_size: Images per GPU per step; the global batch is this times the GPUs.
            learning_rate: Head-phase learning rate for one GPU, scaled with the GPU count.
            fine_tune_learning_rate: Fine-tune learning rate for one GPU, scaled with the GPU count.
            unfreeze_blocks: Dense blocks (1-4, from the top) trained when fine-tuning.
            dropout: Dropout before the classification layer.
            flip: Random horizontal flips while training.
            rotation: Random rotation while training, as a fraction of a full turn; 0 for none.
            zoom: Random zoom while training, in [1 - zoom, 1 + zoom]; 0 for none.
            precision: "auto" (mixed_float16 on GPUs of compute capability 7.0+), "on" or "off".
            early_stopping_patience: Epochs without validation-loss gain before a phase stops; 0 for never.
            reduce_lr_patience: Epochs without validation-loss gain before the learning rate drops; 0 for never.
            steps_per_epoch: Training steps per epoch; 0 for a full pass over the training split.
            eval_batch_size: Images per forward pass in evaluation.
            register_model: Upload the model to the Vertex Model Registry when it clears the threshold.
            registration_metric: Evaluation metric compared with the threshold: "accuracy" or "macro_f1".
            registration_threshold: Register only when the metric on the test split is at least this.
            registration_beats_baselines: Also require the metric above every cheap baseline scored on the same split (logistic regression on TF-IDF or downscaled pixels, and the constant answer).
            model_display_name: Name of the model in the Model Registry.
            predict_uri: gs:// folder of new images (any depth) to label with the trained model, one JSON line each; empty skips prediction.
            tracking_uri: MLflow tracking server URL (http/https), sqlite:///FILE, or a gs:// folder used as a file store; one MLflow run per pipeline run, named after it. Empty: no tracking.
            job_service_account: Service account the custom jobs (sharding, training, evaluation) run as on Vertex; empty: Vertex's Custom Code Service Agent. Not the pipeline run's own account. Ignored by local runs.
        """
        # First, before anything else is named: every pipeline parameter, checked on a
        # light machine before the first paid job; never cached (it fingerprints the data).
        preflight = preflight_op(**{name: value for name, value in locals().items()
                                    if name in preflight_op.component_spec.inputs},
                                 **preflight_inputs(vertex))
        preflight.set_display_name("preflight").set_caching_options(False)
        job = {"service_account": job_service_account} if vertex is not None else {}
        shard = shard_op(
            data_uri=data_uri, data_fingerprint=preflight.outputs["data_fingerprint"],
            image_size=image_size,
            image_format=image_format,
            jpeg_quality=jpeg_quality, resize_method=resize_method,
            train_fraction=train_fraction, validation_fraction=validation_fraction,
            test_fraction=test_fraction, seed=seed, target_shard_mb=target_shard_mb,
            min_shards_per_split=min_shards_per_split,
            max_skipped_fraction=max_skipped_fraction, num_workers=shard_workers, **job,
        ).set_display_name("shard-images")
        training = dict(
            dataset=shard.outputs["dataset"], weights=weights,
            weights_fingerprint=preflight.outputs["weights_fingerprint"], epochs=epochs,
            fine_tune_epochs=fine_tune_epochs, batch_size=batch_size,
            learning_rate=learning_rate, fine_tune_learning_rate=fine_tune_learning_rate,
            unfreeze_blocks=unfreeze_blocks, dropout=dropout, flip=flip, rotation=rotation,
            zoom=zoom, precision=precision, seed=seed,
            early_stopping_patience=early_stopping_patience,
            reduce_lr_patience=reduce_lr_patience, steps_per_epoch=steps_per_epoch,
        )
        if tune is not None:
            training = tuning.searched(tune_op, best_op, "image", training, job, "tune-densenet121")
        train = train_op(**training, **job).set_display_name("train-densenet121")
        evaluate = evaluate_op(
            model=train.outputs["model"], dataset=shard.outputs["dataset"], split="test",
            batch_size=eval_batch_size, **job,
        ).set_display_name("evaluate")
        gate = gate_op(
            evaluation=evaluate.outputs["evaluation"], metric=registration_metric,
            threshold=registration_threshold, enabled=register_model,
            beat_baselines=registration_beats_baselines,
        ).set_display_name("registration-gate")
        if vertex is not None and vertex.serving_image:
            registry.add_upload(image, gate, train.outputs["model"], model_display_name,
                                vertex.serving_image, vertex.encryption_spec_key_name)
        with dsl.If(predict_uri != "", name="prediction-requested"):
            predict_op(
                model=train.outputs["model"], data_uri=predict_uri, batch_size=eval_batch_size,
                data_fingerprint=preflight.outputs["predict_fingerprint"], **job,
            ).set_display_name("predict")
        with dsl.If(tracking_uri != "", name="tracking-requested"):
            track_op(
                model=train.outputs["model"], evaluation=evaluate.outputs["evaluation"],
                tracking_uri=tracking_uri, run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
                experiment=PIPELINE_NAME, kind="image",
            ).set_display_name("track-run").set_caching_options(False)
        return Outputs(
            dataset=shard.outputs["dataset"],
            model=train.outputs["model"],
            metrics=evaluate.outputs["metrics"],
            evaluation=evaluate.outputs["evaluation"],
            register=gate.outputs["Output"],
        )

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
