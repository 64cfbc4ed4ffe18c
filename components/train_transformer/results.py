"""What a transformer run records: the `best` and `run` parts of metrics.json, the files
beside the model and the step's outputs."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import numpy as np

from components.text_common.contract import MAX_TEXT_CHARS
from components.text_common.scores import constant_answer, learnt_nothing, write_result_files
from components.train_transformer.contract import FRAMEWORK, TransformerConfig

log = logging.getLogger(__name__)


def run_record(trainer, model, config: TransformerConfig, history: list[dict[str, Any]],
               train_set, precision: str, started: float, *, rows: dict[str, int],
               texts_truncated: int, resumed_from: str | None, truth_valid: np.ndarray,
               truth_train: np.ndarray, multi: bool) -> dict[str, Any]:
    """The `run` part of metrics.json: data, model, device, how the run went, the constant
    answer's scores and whether the classifier learnt nothing beyond it (warned of)."""
    constant = constant_answer(truth_valid, truth_train, multi, config.threshold)
    nothing = learnt_nothing(history, constant)
    if nothing:
        log.warning("the classifier learnt nothing (%s): it still answers the label "
                    "frequencies whatever the text; train longer or at a higher "
                    "learning_rate", nothing)
    return {
        "rows": rows,
        "texts_truncated": texts_truncated,
        "max_text_chars": MAX_TEXT_CHARS,
        "train_tokens": int(sum(len(row["input_ids"]) for row in train_set)),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "arch": type(model).__name__,
        "model_name": config.model_name,
        "precision": precision,
        "device": str(trainer.args.device),
        "world_size": int(trainer.args.world_size),
        "resumed_from": resumed_from,
        "optimizer_steps": int(trainer.state.global_step),  # earlier attempts' included
        "classifier_epoch_seconds": [r.get("seconds") for r in history],
        "stopped_early": len(history) < config.epochs,
        "constant_answer": constant,
        "learnt_nothing": nothing,
        "seconds": round(time.monotonic() - started, 3),
    }


def best_epoch(state, monitor: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The `best` part of metrics.json: the epoch of the trainer's best checkpoint."""
    checkpoint, epoch = state.best_model_checkpoint, None
    per_epoch = state.global_step / max(1, history[-1]["epoch"]) if history else 0
    if checkpoint and per_epoch:
        epoch = int(round(int(os.path.basename(checkpoint).rsplit("-", 1)[-1]) / per_epoch))
    return {"monitor": monitor, "value": state.best_metric, "epoch": epoch}


def write_outputs(model_dir: str, result: dict[str, Any],
                  text_column: str, config: TransformerConfig) -> None:
    """Writes labels.json, the training metrics and the per-label summary into `model_dir`."""
    write_result_files(model_dir, result, text_column, config.threshold, framework=FRAMEWORK,
                       arch=result["run"]["arch"], model_name=config.model_name,
                       max_length=config.max_length)


def record_outputs(result: dict[str, Any], model, metrics, dataset_dir: str,
                   config: TransformerConfig, model_fingerprint: str) -> None:
    """Reports the model folder: validation scalars in `metrics`, the model's metadata.

    Args:
        result: The training result (the model's metrics.json).
        model, metrics: The step's `Output[Model]` (the folder at its `path`), `Output[Metrics]`.
        dataset_dir: The preparation step's folder (its manifest fingerprints the data).
        config: The run's settings.
        model_fingerprint: The preflight's digest of a `model_name` folder.
    """
    from components.common.provenance import provenance
    from components.prepare_text.contract import MANIFEST
    from components.text_common.scores import validation_scalars

    for name, value in validation_scalars(result).items():
        metrics.log_metric(name, float(value))
    model.metadata.update({
        "framework": FRAMEWORK,
        "arch": result["run"]["arch"],
        "task": result["task"],
        "labels": result["labels"],
        "model_fingerprint": model_fingerprint,
        "learnt_nothing": result["run"]["learnt_nothing"] or "",
        "files": sorted(os.listdir(model.path)),
        **provenance(os.path.join(dataset_dir, MANIFEST), dataclasses.asdict(config)),
    })
