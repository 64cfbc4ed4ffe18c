"""The transformer text pipeline: prepare/split a labelled CSV, fine-tune a Hugging Face encoder,
evaluate (-> register).

The text pipeline's steps around another trainer: the same preparation, evaluation (metrics,
thresholds, report, baselines), registration gate, Model Registry upload (served by the same
image and server), prediction and tracking; only training differs.
"""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import os
from collections.abc import Mapping
from typing import Any

from components.text_common.contract import TRAINING_METRICS_FILE
from pipelines.definitions import text, tuning
from pipelines.definitions.steps import Steps, Target
from pipelines.definitions.text import Outputs

PIPELINE_NAME = "text-transformer"
TUNING_PIPELINE_NAME = "text-transformer-tuning"


def build(image: str, target: "Target | None" = None,
          tune: "tuning.TuningSettings | None" = None):
    """Builds the transformer text pipeline, as `text.build` builds the text pipeline (the
    same arguments, steps and outputs) but for its trainer: `image` holds transformers, and
    the tuning variant searches `tune.spaces["transformer"]`."""
    steps = Steps("transformer", image, target, tune)
    default_job_account = steps.default_job_account

    # Defaults and Args help written by python -m tools.signatures from the
    # steps they feed and pipelines/definitions/help_text.py (edit there).
    @steps.pipeline(PIPELINE_NAME, TUNING_PIPELINE_NAME, "Splits a labelled text CSV, ",
                    "fine-tunes a Hugging Face transformer encoder, evaluates it on the test "
                    "split and registers it.")
    def transformer_pipeline(
        data_uri: str,
        text_column: str = "text",
        label_columns: str = "",
        label_delimiter: str = "auto",
        other_label: str = "other",
        validation_fraction: float = 0.2,
        test_fraction: float = 0.25,
        seed: int = 42,
        model_name: str = "FacebookAI/xlm-roberta-base",
        epochs: int = 6,
        batch_size: int = 16,
        learning_rate: float = 5e-05,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        max_length: int = 256,
        threshold: float = 0.5,
        monitor: str = "loss",
        early_stopping_patience: int = 2,
        mixed_precision: bool = True,
        eval_split: str = "test",
        eval_batch_size: int = 64,
        register_model: bool = True,
        registration_metric: str = "micro_f1",
        registration_threshold: float = 0.5,
        registration_beats_baselines: bool = False,
        model_display_name: str = "transformer-text-classifier",
        predict_uri: str = "",
        tracking_uri: str = "",
        job_service_account: str = default_job_account,
    ) -> Outputs:
        """Prepares a labelled text CSV, fine-tunes a transformer classifier and evaluates it.

        Args:
            data_uri: CSV (gs://bucket/path.csv or local path) with a text column and either one 0/1 (or True/False) column per label or one column of class names.
            text_column: Name of the column holding the texts.
            label_columns: Comma-separated label column names; empty uses every column but the text.
            label_delimiter: Separates several class names inside one cell of a class-name column: "auto" reads "," and refuses a cell holding ";" or "|" (one file mixing them would make "a;b" a class); "," declares ";" and "|" part of class names; ";" or "|" separate with that; empty keeps each cell one class name.
            other_label: Label given to rows with no label set; empty drops those rows instead.
            validation_fraction: Share of the rows left after the test split used for validation.
            test_fraction: Share of all rows held out for the final test.
            seed: Seed of the split, the classification head's initialisation and the batch order.
            model_name: Hub model name (e.g. FacebookAI/xlm-roberta-base, google-bert/bert-base-uncased) or a folder (gs:// or local) written by save_pretrained; its classification head is replaced by one sized for the labels.
            epochs: Most epochs (early stopping may end sooner).
            batch_size: Texts per batch on each GPU (or process).
            learning_rate: Peak AdamW learning rate: 5e-5 fine-tunes a pretrained encoder (a small one such as all-MiniLM-L6-v2 on a few hundred texts learns faster at 1e-4); a model trained from scratch needs about 1e-3.
            weight_decay: AdamW weight decay.
            warmup_ratio: Share of the steps the rate warms up over, linearly from 0; it then decays linearly to 0.
            max_length: Tokens of each text the model reads (longer texts are cut).
            threshold: Multi-label decision threshold on each label's probability.
            monitor: What picks the best epoch and stops training: loss (validation loss), micro_f1 or macro_f1.
            early_stopping_patience: Epochs without improvement of the monitored value before training stops; 0 never stops early.
            mixed_precision: bf16 on GPUs of compute capability >= 8.0 (A100, L4, H100), fp16 on 7.x (V100, T4); never on CPU.
            eval_split: Split to evaluate: "train", "validation" or "test".
            eval_batch_size: Texts per forward pass in the evaluation (and prediction).
            register_model: Upload the model to the Vertex Model Registry when it clears the threshold.
            registration_metric: Evaluation metric compared with the threshold: "micro_f1" (the accuracy for one class per row) or "macro_f1".
            registration_threshold: Register only when the metric on the evaluated split is at least this.
            registration_beats_baselines: Also require the metric above every cheap baseline the evaluation scored on the same split (logistic regression on TF-IDF, and the constant answer).
            model_display_name: Name of the model in the Model Registry; a later run adds a version to it.
            predict_uri: gs:// CSV of new texts (the training text column) to label with the trained model, one JSON line per row; empty skips prediction.
            tracking_uri: MLflow tracking server URL (http/https), sqlite:///FILE, or a gs:// folder used as a file store; one MLflow run per pipeline run, named after it. Empty: no tracking.
            job_service_account: Service account the custom jobs (preparation, training, evaluation, prediction) run as on Vertex; empty: Vertex's Custom Code Service Agent. Not the pipeline run's own account. Ignored by local runs.
        """
        params = locals()  # the pipeline parameters, before anything else is named
        preflight = steps.preflight(params)  # it fingerprints a model_name folder too
        prepare = steps.run("prepare", params,
                            data_fingerprint=preflight.outputs["data_fingerprint"])
        train = steps.train(params, dataset=prepare.outputs["dataset"],
                            model_fingerprint=preflight.outputs["model_fingerprint"])
        return steps.evaluate_and_publish(
            Outputs, params, train, prepare.outputs["dataset"], split=eval_split,
            predict_fingerprint=preflight.outputs["predict_fingerprint"])

    return transformer_pipeline


def training_summary(training: Mapping[str, Any]) -> dict[str, Any]:
    """The `training` section of a run's summary, from the trainer's metrics.json.

    Args:
        training: The transformer trainer's metrics.json (`history`, `best`, `run`).

    Returns:
        `{epochs, best, model_name, arch, classifier_epoch_seconds, train_tokens,
        parameters, device, precision, world_size, stopped_early, resumed_from,
        texts_truncated, seconds, learnt_nothing}`; a value the file lacks is None.
    """
    run = training.get("run", {})
    return {
        "epochs": len(training.get("history", [])),
        "best": training.get("best"),
        **{key: run.get(key) for key in (
            "model_name", "arch", "classifier_epoch_seconds", "train_tokens", "parameters",
            "device", "precision", "world_size", "stopped_early", "resumed_from",
            "texts_truncated", "seconds", "learnt_nothing")},
    }


def summarize(artifacts: Mapping[str, str]) -> dict[str, Any]:
    """What a local run of the transformer pipeline produced, in the shape of `summary.json`.

    Args:
        artifacts: Output name to local path, as `pipelines.definitions.text.summarize` takes them.

    Returns:
        `pipelines.definitions.text.summarize`'s summary of the evaluation and the dataset (metrics,
        baseline, preparation), the transformer trainer's `training` section
        (`training_summary`), then `artifacts`.
    """
    # The fastai trainer's training section is not this trainer's: the model is read here.
    summary = text.summarize({name: path for name, path in artifacts.items() if name != "model"})
    training = text.read_json_if_present(os.path.join(artifacts.get("model", ""),
                                                      TRAINING_METRICS_FILE))
    if training:
        summary["training"] = training_summary(training)
    summary["artifacts"] = {**artifacts, **summary.pop("artifacts")}
    return summary


def summarize_run(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """`pipelines.definitions.text.summarize_run` with this pipeline's `summarize`.

    Args:
        outputs: Output name to artifact (with `.path`), and "register" to the gate's
            decision, as `kfp.local` (or the rehearsal) returns the pipeline's outputs.
    """
    return text.summarize_run(outputs, summarize)
