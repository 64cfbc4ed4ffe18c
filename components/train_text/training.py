"""ULMFiT text classifier with fastai: fine-tune the language model, then the classifier.

Only `fastai.text` is imported (`fastai.vision` fails to import in this stack).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from fastai.learner import mk_metric
from fastai.text.all import Callback, awd_lstm_lm_config, set_seed

from components.common import run_state
from components.common.fastai_text import precision_here
from components.common.gpus import require_torch_gpus
from components.common.hypertune import TrialReporter
from components.common.tensorboard import ScalarLog, log_folder
from components.formats.lm_assets import make_tokenizer
from components.prepare_text.contract import MULTI_LABEL
from components.text_common import scores as text_scores
from components.text_common.scores import write_result_files
from components.train_text import schedule
from components.train_text.assets import LMAssets, resolve_assets
from components.train_text.contract import TextTrainingError, TrainConfig, model_config_problems
from components.train_text.data import PreparedDataset, fastai_frame, read_dataset
from components.train_text.learners import (
    classifier_learner,
    fine_tune_lm,
    loss_and_metrics,
    train_random_encoder_whole,
)
from components.train_text.outputs import run_report, validate_and_export
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
    folder = checkpoint_folder or run_state.checkpoint_folder(model_dir)
    os.makedirs(folder, exist_ok=True)
    os.makedirs(model_dir, exist_ok=True)
    # fastai drops the last partial training batch
    unfreeze = schedule.resolve_unfreeze(config.unfreeze, len(data.train) // config.batch_size)
    plan = schedule.plan_stages(config.lm_epochs, config.epochs, config.lm_learning_rate,
                                config.learning_rate, config.pretrained, unfreeze[0])
    tensorboard = ScalarLog(log_folder(model_dir, tensorboard_folder))
    scratch = tempfile.mkdtemp(prefix="train_text_")
    try:
        job = _prepare(data, config, plan, unfreeze, lm_assets_uri, model_dir, folder, scratch,
                       callbacks, tensorboard, hypertune_metric)
        vocab = fine_tune_lm(job, job.run.saved_vocab())
        train_random_encoder_whole(job)
        learn, dls, vocab = classifier_learner(job, vocab, loss, metrics)
        job.run.fit_classifier(learn, job.run.indices(schedule.CLASSIFIER))
        learn, result = validate_and_export(job, learn, model_dir)
        result.update(run_report(job, learn, dls, vocab, lm_assets_uri, started))
        write_result_files(model_dir, result, data.text_column, config.threshold,
                           lang=config.lang, backwards=config.backwards, arch="AWD_LSTM")
        job.run.state["finished"] = True
        job.run.save()
    finally:
        tensorboard.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if checkpoint_folder is None and run_state.inside_output(folder, model_dir):
        # Under the model output they would ship with the model; they served their purpose.
        shutil.rmtree(folder, ignore_errors=True)
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
    if config.pretrained and config.model_config:
        raise TextTrainingError(
            "model_config applies to training from scratch; a pretrained LM's "
            "settings come from its config.json")
    assets = resolve_assets(lm_assets_uri, config.lang, config.backwards, scratch) \
        if config.pretrained else None
    arch_config, source = ((assets.config, f"{lm_assets_uri} config.json") if assets else
                           (dict(config.model_config), "model_config"))
    # fastai's get_language_model takes an `init` too.
    problems = model_config_problems(arch_config, {**awd_lstm_lm_config, "init": None}, source)
    if problems:
        raise TextTrainingError("; ".join(problems))
    return assets, arch_config

