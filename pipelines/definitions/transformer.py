"""The transformer text pipeline: the text pipeline's steps (prepare, evaluate, register)
around a Hugging Face encoder's fine-tuning."""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import os
from collections.abc import Mapping
from typing import Any

from components.common.storage import read_json
from components.text_common.contract import TRAINING_METRICS_FILE
from pipelines.definitions import text, tuning
from pipelines.definitions.steps import Steps, Target, classifier_parameters, parameter
from pipelines.definitions.text import Outputs

PIPELINE_NAME = "text-transformer"
TUNING_PIPELINE_NAME = "text-transformer-tuning"


def build(image: str, target: "Target | None" = None,
          tune: "tuning.TuningSettings | None" = None):
    """Builds the transformer text pipeline, as `text.build` builds the text pipeline (the
    same arguments, steps and outputs) but for its trainer: `image` holds transformers, and
    the tuning variant searches `tune.spaces["transformer"]`."""
    steps = Steps("transformer", image, target, tune)

    @steps.pipeline(PIPELINE_NAME, TUNING_PIPELINE_NAME, "Splits a labelled text CSV, ",
                    "fine-tunes a Hugging Face transformer encoder, evaluates it on the test "
                    "split and registers it.",
                    first=[parameter("data_uri", str)],
                    last=[parameter("eval_split", str, "test"), *classifier_parameters(
                        "micro_f1", 0.5, "transformer-text-classifier")])
    def transformer_pipeline(params) -> Outputs:
        """Prepares a labelled text CSV, fine-tunes a transformer classifier and evaluates it."""
        preflight = steps.preflight(params)  # it fingerprints a model_name folder too
        prepare = steps.run("prepare", params,
                            data_fingerprint=preflight.outputs["data_fingerprint"])
        train = steps.train(params, dataset=prepare.outputs["dataset"],
                            model_fingerprint=preflight.outputs["model_fingerprint"])
        return steps.evaluate_and_publish(
            Outputs, params, train, prepare.outputs["dataset"], split=params["eval_split"],
            predict_fingerprint=preflight.outputs["predict_fingerprint"])

    return transformer_pipeline


def summarize(artifacts: Mapping[str, str]) -> dict[str, Any]:
    """`text.summarize`'s summary of `artifacts` with this trainer's `training` section."""
    # The fastai trainer's training section is not this trainer's: the model is read here.
    summary = text.summarize({name: path for name, path in artifacts.items() if name != "model"})
    training = read_json(os.path.join(artifacts.get("model", ""), TRAINING_METRICS_FILE),
                         optional=True)
    if training:  # a value the file lacks: None
        run = training.get("run", {})
        summary["training"] = {
            "epochs": len(training.get("history", [])), "best": training.get("best"),
            **{key: run.get(key) for key in (
                "model_name", "arch", "classifier_epoch_seconds", "train_tokens", "parameters",
                "device", "precision", "world_size", "stopped_early", "resumed_from",
                "texts_truncated", "seconds", "learnt_nothing")},
        }
    summary["artifacts"] = {**artifacts, **summary.pop("artifacts")}
    return summary
