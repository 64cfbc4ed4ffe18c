"""The run's outputs: the best epoch scored and exported, metrics.json's report, metadata."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from fastai.learner import load_model

from components.common.fastai_text import FP32
from components.common.provenance import provenance
from components.prepare_text.contract import MANIFEST
from components.text_common.contract import EXPORT_FILE, MAX_TEXT_CHARS
from components.text_common.scores import validation_result
from components.train_text import schedule
from components.train_text.assets import fastai_pretrained_url, uses_fastai_pretrained
from components.train_text.contract import TrainConfig
from components.train_text.learners import ENCODER_KEYS
from components.train_text.runner import TrainingJob


def model_metadata(result: dict[str, Any], config: TrainConfig, model_dir: str,
                   dataset_dir: str, lm_assets_uri: str,
                   lm_assets_fingerprint: str) -> dict[str, Any]:
    """The `Model` artifact's metadata: what the model is, its files, and its provenance.

    Args:
        result: What `training.train_text_classifier` returned.
        config: The run's settings.
        model_dir: The model folder, written.
        dataset_dir: The preparation step's folder (its manifest pins the data).
        lm_assets_uri: The pretrained LM assets' root.
        lm_assets_fingerprint: The preflight step's digest of their listing.
    """
    return {
        "framework": "fastai",
        "arch": "AWD_LSTM",
        "task": result["task"],
        "labels": result["labels"],
        "lang": config.lang,
        "lm_assets_fingerprint": lm_assets_fingerprint,
        "files": sorted(os.listdir(model_dir)),
        **provenance(os.path.join(dataset_dir, MANIFEST),
                     {**dataclasses.asdict(config), "lm_assets_uri": lm_assets_uri}),
    }


def validate_and_export(job: TrainingJob, learn, model_dir: str) -> tuple[Any, dict[str, Any]]:
    """Loads the best epoch's weights, scores the validation split, writes `export.pkl`.

    Returns:
        `(learner in float32, text_scores.validation_result of the validation split)`.
    """
    run, data = job.run, job.data
    best = run.state["best"]
    if best and best.get("file") and os.path.exists(run.path(best["file"])):
        load_model(run.path(best["file"]), learn.model, None, with_opt=False,
                   device=learn.dls.device)
    if job.precision != FP32:
        learn = learn.to_fp32()
    probs, _ = learn.get_preds(ds_idx=1)
    probs = probs.float().cpu().numpy()
    truth = data.valid[data.labels].to_numpy()
    result = validation_result(truth, probs, data.labels, data.task, job.config.threshold)
    learn.export(os.path.abspath(os.path.join(model_dir, EXPORT_FILE)))
    return learn, result


def run_report(job: TrainingJob, learn, dls, vocab: list[str], lm_assets_uri: str,
               started: float) -> dict[str, Any]:
    """metrics.json's `history`, `best`, `run` (sizes, timings, resume facts) and `config`."""
    state, config = job.run.state, job.config
    clas_epochs = [h for h in state["history"] if h["model"] == schedule.CLASSIFIER]
    unfreeze, unfreeze_reason = job.unfreeze
    return {
        "history": state["history"],
        "best": state["best"],
        "run": {
            "rows": {"train": len(job.data.train), "validation": len(job.data.valid)},
            "texts_truncated": job.truncated,
            "max_text_chars": MAX_TEXT_CHARS,
            "train_tokens": int(dls.train.items["text_length"].sum()),
            "vocab_size": len(vocab),
            "parameters": int(sum(p.numel() for p in learn.model.parameters())),
            "arch": "AWD_LSTM",
            "arch_config": {k: job.lm_config[k] for k in ENCODER_KEYS},
            "pretrained": config.pretrained,
            "pretrained_from": None if not config.pretrained else (
                fastai_pretrained_url(config.backwards)
                if uses_fastai_pretrained(lm_assets_uri, config.lang) else lm_assets_uri),
            "precision": job.precision,
            "device": str(learn.dls.device),
            "resumed_from": job.resumed_from,
            # Every stage's across the attempts (a classifier restart's too).
            "optimizer_steps": state.get("optimizer_steps", 0),
            "classifier_epoch_seconds": [h["seconds"] for h in clas_epochs],
            "classifier_epoch_cpu_seconds": [h.get("cpu_seconds") for h in clas_epochs],
            "seconds": round(time.monotonic() - started, 3),
            "unfreeze": {"used": unfreeze, "reason": unfreeze_reason},
            "stages": [dataclasses.asdict(s) for s in job.run.plan],
            "found_learning_rates": state.get("found_lr", {}),
            # Classifier runs that learnt nothing and ran again at a lower rate.
            "restarts": [{k: v for k, v in r.items() if k != "epochs"}
                         for r in state.get("restarts", [])],
            "learnt_nothing": state.get("gave_up"),
            "lm_discarded": state.get("lm_discarded"),
            "constant_answer": job.run.constant,
        },
        "config": dataclasses.asdict(config),
    }
