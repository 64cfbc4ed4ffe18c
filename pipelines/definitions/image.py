"""The image classification pipeline: shard -> train DenseNet121 -> evaluate (-> register)."""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import os
from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, Metrics, Model

from components.common.metrics import read_evaluation
from components.common.report_html import REPORT_HTML_FILE
from components.common.storage import read_json
from components.shard.contract import MANIFEST_NAME
from pipelines.definitions import registry, tuning
from pipelines.definitions.steps import Steps, Target, classifier_parameters, parameter

PIPELINE_NAME = "image-classifier"
TUNING_PIPELINE_NAME = "image-classifier-tuning"


def build(image: str, target: "Target | None" = None,
          tune: "tuning.TuningSettings | None" = None):
    """Builds the image pipeline.

    Args:
        image: URI of the TensorFlow runtime image every step runs in.
        target: Where each step runs (`steps.Steps`); None for the local variant.
        tune: Compiles the tuning variant, searching `tune.spaces["image"]`.

    Returns:
        A `@dsl.pipeline` function.
    """
    steps = Steps("image", image, target, tune)

    class Outputs(NamedTuple):
        dataset: Dataset
        model: Model
        metrics: Metrics
        evaluation: Artifact
        register: bool

    @steps.pipeline(PIPELINE_NAME, TUNING_PIPELINE_NAME,
                    "Shards a bucket folder of class sub-folders into TFRecords, ",
                    "fine-tunes DenseNet121 on GPUs, evaluates it and registers it.",
                    first=[parameter("data_uri", str)],
                    last=[parameter("shard_workers", int, 0), *classifier_parameters(
                        "accuracy", 0.8, "densenet121-image-classifier")])
    def image_pipeline(params) -> Outputs:
        """Trains and evaluates a DenseNet121 classifier on a folder of labelled images."""
        preflight = steps.preflight(params)
        shard = steps.run("shard", params, data_fingerprint=preflight.outputs["data_fingerprint"],
                          num_workers=params["shard_workers"])
        train = steps.train(params, dataset=shard.outputs["dataset"],
                            weights_fingerprint=preflight.outputs["weights_fingerprint"])
        return steps.evaluate_and_publish(
            Outputs, params, train, shard.outputs["dataset"], split="test",
            predict_fingerprint=preflight.outputs["predict_fingerprint"])

    return image_pipeline


def summarize(outputs: dict) -> dict:
    """What a local run of the image pipeline produced (`outputs`: from `kfp.local`), in
    the shape of `summary.json`."""
    manifest = read_json(os.path.join(outputs["dataset"].path, MANIFEST_NAME))
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
            **{key: manifest[key] for key in ("skipped", "ignored", "missing_classes")},
        },
        "provenance": {key: outputs["model"].metadata.get(key)
                       for key in ("git_sha", "data_sha256", "parameters")},
        "registration": registry.local_registration(outputs["register"]),
        "artifacts": {**{name: outputs[name].path
                         for name in ("dataset", "model", "metrics", "evaluation")},
                      "report_html": os.path.join(outputs["evaluation"].path,
                                                  REPORT_HTML_FILE)},
    }
