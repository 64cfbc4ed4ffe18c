"""ULMFiT text classifier with fastai: fine-tune the language model, then the classifier;
the best epoch scored and exported, metrics.json's report, the model's metadata.

Only `fastai.text` is imported (`fastai.vision` fails to import in this stack).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from fastai.learner import load_model, mk_metric
from fastai.text.all import Callback, awd_lstm_lm_config, set_seed

from components.common import run_state
from components.common.fastai_text import FP32, precision_here, run_folders
from components.common.gpus import require_torch_gpus
from components.common.hypertune import TrialReporter
from components.common.provenance import provenance
from components.common.tensorboard import ScalarLog
from components.formats.lm_assets import make_tokenizer
from components.prepare_text.contract import MANIFEST, MULTI_LABEL
from components.text_common import scores as text_scores
from components.text_common.contract import EXPORT_FILE, MAX_TEXT_CHARS
from components.text_common.scores import validation_result, write_result_files
from components.train_text import schedule
from components.train_text.assets import (
    LMAssets,
    resolve_assets,
)
from components.train_text.contract import TextTrainingError, TrainConfig, model_config_problems
from components.train_text.data import PreparedDataset, fastai_frame, read_dataset
from components.train_text.learners import (
    ENCODER_KEYS,
    classifier_learner,
    fine_tune_lm,
    loss_and_metrics,
    train_random_encoder_whole,
)
from components.train_text.runner import StageRunner, TrainingJob

log = logging.getLogger(__name__)


def train_text_classifier(
    dataset_dir: str,
    model_dir: str,
    config: TrainConfig,
    lm_assets_uri: str = "",
    checkpoint_folder: str | None = None,
    callbacks: Sequence[Callback] = (),
    tensorboard_folder: str | None = None,
    hypertune_metric: str | None = None,
) -> dict[str, Any]:
    """Trains a ULMFiT classifier on a prepared dataset and exports it.

    Args:
        dataset_dir: Folder from the preparation step (CSVs, manifest.json).
        model_dir: Output folder (`text_common.contract`'s files).
        config: Training settings.
        lm_assets_uri: Root of the pretrained LM assets (local or gs://), when pretrained.
        checkpoint_folder: Where checkpoints and the state file go; default
            `run_state.checkpoint_folder(model_dir)`.
        callbacks: Extra fastai callbacks for every fit (the tests interrupt runs with one).
        tensorboard_folder: Folder of TensorBoard logs (`lm/<field>`, `classifier/<field>`);
            None or "": `tensorboard.log_folder`.
        hypertune_metric: The classifier's epoch value reported to a Vertex tuning trial.

    Returns:
        The content of metrics.json: the validation results, `history` and `run`.

    Raises:
        MissingAssetsError: Pretrained LM files are missing (each one is named).
        TextTrainingError: Settings or data that cannot be trained.
    """
    require_torch_gpus()  # before anything is read: a job without its GPUs ends now
    started = time.monotonic()
    data = read_dataset(dataset_dir)
    loss, metrics = loss_and_metrics(data.task, config.threshold)
    known = ["train_loss", "valid_loss", *(mk_metric(m).name for m in metrics)]
    if config.monitor not in known:  # one that no epoch of this task's model reports
        raise TextTrainingError(f"monitor {config.monitor!r} is not a metric of this "
                                f"{data.task.replace('_', '-')} model; choose one of {known}")
    os.makedirs(model_dir, exist_ok=True)
    # fastai drops the last partial training batch
    unfreeze = schedule.resolve_unfreeze(config.unfreeze, len(data.train) // config.batch_size)
    plan = schedule.plan_stages(config.lm_epochs, config.epochs, config.lm_learning_rate,
                                config.learning_rate, config.pretrained, unfreeze[0])
    with run_folders(model_dir, checkpoint_folder, tensorboard_folder) as (
            folder, tensorboard, scratch):
        job = _prepare(data, config, plan, unfreeze, lm_assets_uri, model_dir, folder, scratch,
                       callbacks, tensorboard, hypertune_metric)
        vocab = fine_tune_lm(job, job.run.saved_vocab())
        train_random_encoder_whole(job)
        learn, dls, vocab = classifier_learner(job, vocab, loss, metrics)
        job.run.fit_classifier(learn, job.run.indices(schedule.CLASSIFIER))
        learn, result = validate_and_export(job, learn, model_dir)
        result.update(run_report(job, learn, dls, vocab, started))
        write_result_files(model_dir, result, data.text_column, config.threshold,
                           lang=config.lang, backwards=config.backwards, arch="AWD_LSTM")
        job.run.state["finished"] = True
        job.run.save()
    return result


def _prepare(data: PreparedDataset, config: TrainConfig, plan: list[schedule.Stage],
             unfreeze: tuple[str, str], lm_assets_uri: str, model_dir: str, folder: str,
             scratch: str, callbacks: Sequence[Callback], tensorboard: ScalarLog,
             hypertune_metric: str | None) -> TrainingJob:
    """Checks the model's settings, resumes (or starts) the run in `folder`, builds fastai's
    frame; `scratch` takes the copied assets and the tokenizer's files."""
    assets, arch_config = _architecture(config, lm_assets_uri, scratch)
    tokenizer = make_tokenizer(config.lang, assets.spm_model if assets else None, scratch)
    precision = precision_here(config.mixed_precision)
    # What defines the run is hashed into its fingerprint; another run's state is refused.
    resume = run_state.open_run(folder, schedule.STATE, {
        "config": dataclasses.asdict(config), "plan": [dataclasses.asdict(s) for s in plan],
        "manifest": data.manifest, "model_dir": os.path.abspath(model_dir),
        "assets": lm_assets_uri if config.pretrained else "",
    }, fresh=schedule.new_state())
    resumed_from = None
    if resume.resumed:
        resumed_from = {"stage": plan[min(resume.state["stage"], len(plan) - 1)].name,
                        "epochs_done": resume.state["epochs_done"],
                        **(resume.state.get("mid_epoch") or {})}  # batches of the next
        log.info("resuming from %s", resumed_from)
    lm_config = {**awd_lstm_lm_config, **arch_config}
    constant = text_scores.constant_answer(
        data.valid[data.labels].to_numpy(), data.train[data.labels].to_numpy(),
        data.task == MULTI_LABEL, config.threshold)
    run = StageRunner(resume, plan, config.monitor, callbacks, tensorboard,
                      TrialReporter(hypertune_metric), constant, int(lm_config["n_hid"]),
                      config.checkpoint_every_steps)
    set_seed(config.seed)
    frame, truncated = fastai_frame(data)
    return TrainingJob(data, config, run, assets, arch_config, lm_config, tokenizer,
                       precision, frame, truncated, resumed_from, unfreeze)


def _architecture(config: TrainConfig, lm_assets_uri: str,
                  scratch: str) -> tuple[LMAssets | None, dict[str, Any]]:
    """The pretrained LM's assets (copied into `scratch`) and the AWD-LSTM settings given."""
    assets = resolve_assets(lm_assets_uri, config.lang, config.backwards, scratch) \
        if config.pretrained else None
    arch_config, source = ((assets.config, f"{lm_assets_uri} config.json") if assets else
                           (dict(config.model_config), "model_config"))
    # fastai's get_language_model takes an `init` too.
    problems = model_config_problems(arch_config, {**awd_lstm_lm_config, "init": None}, source)
    if problems:
        raise TextTrainingError("; ".join(problems))
    return assets, arch_config


def model_metadata(result: dict[str, Any], config: TrainConfig, model_dir: str,
                   dataset_dir: str, lm_assets_uri: str,
                   lm_assets_fingerprint: str) -> dict[str, Any]:
    """The `Model` artifact's metadata of a `train_text_classifier` result: what the model
    is, its files, and its provenance (the dataset's manifest pins the data;
    `lm_assets_fingerprint` is the preflight step's digest of the assets' listing)."""
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


def run_report(job: TrainingJob, learn, dls, vocab: list[str], started: float) -> dict[str, Any]:
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
            "pretrained_from": job.assets.source if job.assets else None,
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
