"""The text classification pipeline: prepare a labelled CSV, train ULMFiT, evaluate, register."""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

from components.common.metrics import EVALUATION_FILE
from components.common.report_html import REPORT_HTML_FILE
from components.common.storage import read_json
from components.prepare_text.contract import MANIFEST, MULTI_LABEL
from components.text_common.contract import TRAINING_METRICS_FILE
from pipelines.definitions import registry, tuning
from pipelines.definitions.steps import Steps, Target, classifier_parameters, parameter

PIPELINE_NAME = "text-classifier"
TUNING_PIPELINE_NAME = "text-classifier-tuning"


class Outputs(NamedTuple):
    metrics: Metrics
    report: Markdown
    evaluation: Artifact
    model: Model
    dataset: Dataset
    register: bool


def build(image: str, target: "Target | None" = None,
          tune: "tuning.TuningSettings | None" = None):
    """Builds the text pipeline.

    Args:
        image: URI of the fastai runtime image every step runs in (and serves the model).
        target: Where each step runs (`steps.Steps`); None for the local variant.
        tune: Compiles the tuning variant, searching `tune.spaces["text"]`.

    Returns:
        A `@dsl.pipeline` function whose outputs are `Outputs`.
    """
    steps = Steps("text", image, target, tune)

    @steps.pipeline(PIPELINE_NAME, TUNING_PIPELINE_NAME, "Splits a labelled text CSV, ",
                    "trains a fastai ULMFiT classifier, evaluates it on the test split and "
                    "registers it.",
                    first=[parameter("data_uri", str), parameter("lm_assets", str, "")],
                    last=[parameter("eval_split", str, "test"), *classifier_parameters(
                        "micro_f1", 0.5, "ulmfit-text-classifier")])
    def text_pipeline(params) -> Outputs:
        """Prepares a labelled text CSV, trains a ULMFiT classifier and evaluates it."""
        preflight = steps.preflight(params)
        prepare = steps.run("prepare", params,
                            data_fingerprint=preflight.outputs["data_fingerprint"])
        train = steps.train(params, dataset=prepare.outputs["dataset"],
                            lm_assets_uri=params["lm_assets"],
                            lm_assets_fingerprint=preflight.outputs["lm_assets_fingerprint"])
        return steps.evaluate_and_publish(
            Outputs, params, train, prepare.outputs["dataset"], split=params["eval_split"],
            predict_fingerprint=preflight.outputs["predict_fingerprint"])

    return text_pipeline


def summarize_run(outputs: Mapping[str, Any], summarize_artifacts=None) -> dict[str, Any]:
    """What a run produced, from its outputs (artifacts and the gate's "register") as a
    runner returns them, through `summarize_artifacts` (default: the text pipeline's
    `summarize`), plus `registration` when the gate's decision is there."""
    summary = (summarize_artifacts or summarize)(
        {name: value.path for name, value in outputs.items() if hasattr(value, "path")})
    if "register" in outputs:
        summary["registration"] = registry.local_registration(outputs["register"])
        summary["artifacts"] = summary.pop("artifacts")  # last, as in the image summary
    return summary


def summarize(artifacts: Mapping[str, str]) -> dict[str, Any]:
    """What a local run of the text pipeline produced, in the shape of `summary.json`.

    Args:
        artifacts: Output name to local path; "evaluation" is required, "dataset" and
            "model" add the preparation and training sections.

    Returns:
        `{"metrics", "baseline", "preparation", "training", "artifacts"}`; single-label
        runs report per class, micro F1 being the accuracy.
    """
    result = read_json(os.path.join(artifacts["evaluation"], EVALUATION_FILE), optional=True)
    if result is None:
        raise FileNotFoundError(f"no {EVALUATION_FILE} in {artifacts['evaluation']}")
    multi = result["task"] == MULTI_LABEL
    per = result["per_label"] if multi else result["per_class"]
    metrics: dict[str, Any] = {
        "task": result["task"],
        "split": result.get("split"),
        "num_examples": result["num_examples"],
        "micro_f1": result["micro_f1"] if multi else result["accuracy"],
        "macro_f1": result["macro_f1"],
        "per_label": {name: {k: v[k] for k in ("precision", "recall", "f1", "support")}
                      for name, v in per.items()},
    }
    if multi:
        tuned = result["tuned"]
        metrics.update({
            "threshold": result["thresholds"][0] if result["thresholds"] else None,
            "tuned_micro_f1": tuned["micro_f1"],
            "tuned_macro_f1": tuned["macro_f1"],
            "tuned_thresholds": dict(zip(tuned["labels"], tuned["thresholds"])),
        })
    # Cheap models on the same split, with the same metric names (common.baselines).
    summary: dict[str, Any] = {"metrics": metrics, "baseline": result.get("baseline", {})}
    manifest = read_json(os.path.join(artifacts.get("dataset", ""), MANIFEST), optional=True)
    if manifest:
        summary["preparation"] = {
            "rows_in": manifest["rows_in"], "rows_kept": manifest["rows_kept"],
            "dropped": {kind: d["count"] for kind, d in manifest["dropped"].items()},
            "given_other": manifest["given_other"], "labels": manifest["labels"],
            "splits": {s: v["rows"] for s, v in manifest["splits"].items()},
        }
    training = read_json(os.path.join(artifacts.get("model", ""), TRAINING_METRICS_FILE),
                         optional=True)
    if training:
        run = training["run"]
        summary["training"] = {
            "epochs": len(training["history"]), "best": training.get("best"),
            **{key: run[key] for key in ("classifier_epoch_seconds", "train_tokens",
                                         "parameters", "device", "precision")},
            "unfreeze": run.get("unfreeze"),
            "found_learning_rates": run.get("found_learning_rates", {}),
            "restarts": run.get("restarts", []),
            **{key: run.get(key) for key in ("learnt_nothing", "lm_discarded")},
        }
    summary["artifacts"] = {**artifacts, "report_html": os.path.join(artifacts["evaluation"],
                                                                     REPORT_HTML_FILE)}
    return summary
