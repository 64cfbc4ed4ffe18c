"""The language model pipeline: a text corpus in, pretrained LM assets for the text pipeline out."""
# No `from __future__ import annotations` here: KFP reads the pipeline signature's real types.

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from kfp.dsl import Artifact, Metrics

from components.common.storage import read_json
from components.train_lm.contract import METRICS_FILE
from pipelines.definitions.steps import Steps, Target, parameter

PIPELINE_NAME = "language-model"


class Outputs(NamedTuple):
    metrics: Metrics
    lm_assets: Artifact


def build(image: str, target: "Target | None" = None):
    """Builds the language model pipeline.

    Args:
        image: URI of the fastai runtime image both steps run in.
        target: Where the training step runs (`steps.Steps`); None for the local variant.

    Returns:
        A `@dsl.pipeline` function whose outputs are `metrics` (perplexity, accuracy) and
        `lm_assets` (the text pipeline's `lm_assets`).
    """
    steps = Steps("lm", image, target)

    @steps.pipeline(PIPELINE_NAME, "", "Trains an AWD-LSTM language model on a text corpus "
                    "and writes it as the pretrained LM assets the text pipeline starts from.",
                    "", first=[parameter("corpus_uri", str)],
                    last=[parameter("tracking_uri", str, "")])
    def lm_pipeline(params) -> Outputs:
        """Trains a language model on a corpus and writes it as pretrained LM assets."""
        # The corpus's fingerprint keys the training step's cache.
        preflight = steps.preflight(params)
        train = steps.train(params, corpus_fingerprint=preflight.output)
        steps.track(params, PIPELINE_NAME, lm_assets=train.outputs["lm_assets"])
        return Outputs(metrics=train.outputs["metrics"], lm_assets=train.outputs["lm_assets"])

    return lm_pipeline


def summarize(artifacts: Mapping[str, str]) -> dict[str, Any]:
    """What a local run of the language model pipeline produced (`artifacts`: output name
    to local path, "lm_assets" required), in the shape of `summary.json`."""
    result = read_json(os.path.join(artifacts["lm_assets"], METRICS_FILE), optional=True)
    if result is None:
        raise FileNotFoundError(f"no {METRICS_FILE} in {artifacts['lm_assets']}")
    directions = result["directions"]
    return {
        "metrics": {
            "perplexity": result["perplexity"],
            "accuracy": result["accuracy"],
            "directions": {name: {k: run.get(k) for k in (
                "perplexity", "accuracy", "valid_loss", "unigram", "beats_unigram",
                "learnt_nothing")} for name, run in directions.items()},
            # The forward model's floor: a unigram model of its training tokens, same targets.
            "unigram": directions.get("forward", {}).get("unigram"),
            "learnt_nothing": result.get("learnt_nothing"),
            "tokens": result["tokens"],
            "vocab_size": result["vocab_size"],
        },
        "corpus": {k: v for k, v in result["corpus"].items() if k != "sha256"},
        "training": {
            "lang": result["lang"],
            **{key: {name: run[key] for name, run in directions.items()}
               for key in ("epochs", "epoch_seconds", "found_learning_rates")},
            **{k: result["run"][k] for k in ("parameters", "device", "precision", "seconds")},
        },
        "artifacts": dict(artifacts),
    }
