"""ULMFiT text classifier with fastai: fine-tune the language model, then the classifier.

Only `fastai.text` is imported: `fastai.vision` fails to import in this stack
(torchvision/torch mismatch) and the text path has no use for it.

Steps of `train_text_classifier`:
1. Read the prepared dataset (components/prepare_text): train and validation splits.
2. Pretrained LM assets (when `pretrained`) are checked and copied locally; a
   missing file is an error naming every missing one. English without assets takes
   fastai's WikiText-103 model, fetched as fastai fetches it (assets.py); nothing else is
   downloaded. The vocabulary keeps the task's tokens the pretrained LM knows, however
   rare in the task (vocabulary.py).
3. The LM is fine-tuned on the train+validation texts (`lm_epochs`; 0 skips it) and its
   encoder saved; the classifier starts from that encoder (or from the pretrained
   weights when the LM is skipped) and unfreezes gradually, or all at once when an epoch
   has too few batches for that (schedule.resolve_unfreeze, schedule.plan_stages).
4. Each epoch is checkpointed with the state file (schedule.py), so a restarted
   job resumes at the next epoch, whichever stage it was in.
5. The best epoch for `monitor` is kept, exported (`export.pkl`), and scored on the
   validation split at the fixed threshold and at per-label thresholds tuned there.

The steps' parts live beside this module: data.py (the dataset, fastai's frame and
dataloaders), runner.py (the stages, the state file and the checkpoints), learners.py (the
language model's fine-tuning and the classifier's learner) and outputs.py (the export,
metrics.json and the other files of the model folder).
"""

from __future__ import annotations

import dataclasses
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
from components.train_text import schedule
from components.train_text.assets import LMAssets, resolve_assets
from components.train_text.contract import TextTrainingError, TrainConfig
from components.train_text.data import PreparedDataset, fastai_frame, read_dataset
from components.train_text.learners import (
    classifier_learner,
    fine_tune_lm,
    loss_and_metrics,
    train_random_encoder_whole,
)
from components.train_text.outputs import run_report, validate_and_export, write_outputs
from components.train_text.runner import StageRunner, TrainingJob, resume_run


def _check_arch_config(config: dict[str, Any], source: str) -> None:
    unknown = sorted(set(config) - set(awd_lstm_lm_config) - {"init"})
    if unknown:
        raise TextTrainingError(f"{source}: unknown AWD_LSTM setting(s) {unknown}; "
                                f"known: {sorted(awd_lstm_lm_config)}")


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
        dataset_dir: Folder from the preparation step (train/validation/test CSVs, manifest.json).
        model_dir: Output folder: `export.pkl` (fastai learner), `labels.json`,
            `metrics.json` and `per_label_metrics.json`.
        config: Training settings.
        lm_assets_uri: Root of the pretrained LM assets (local or gs://); used when
            `config.pretrained`.
        checkpoint_folder: Where checkpoints and the state file go; default
            `run_state.checkpoint_folder(model_dir)` (AIP_CHECKPOINT_DIR when set).
        callbacks: Extra fastai callbacks for every fit (the tests interrupt runs with one).
        tensorboard_folder: Folder (gs:// or local) of TensorBoard logs, one point per epoch
            under `lm/<field>` and `classifier/<field>` (history fields), the step counting
            each model's epochs; None or "": this task's folder under
            AIP_TENSORBOARD_LOG_DIR when set, else no logs (`tensorboard.log_folder`).
        hypertune_metric: In a Vertex tuning trial, the classifier's epoch value reported
            to the tuning service after each of its epochs (e.g. "valid_loss", "f1_score");
            None reports nothing.

    Returns:
        The content of metrics.json: `task`, `labels`, `split` ("validation"), the validation
        results (`fixed` at the threshold and, multi-label, `tuned` at tuned thresholds),
        `history` (one row per epoch) and `run` (sizes, timings, resume information).

    Raises:
        MissingAssetsError: Pretrained LM files are missing (each one is named).
        TextTrainingError: Settings or data that cannot be trained.
    """
    require_torch_gpus()  # before anything is read: a job without its GPUs ends now
    started = time.monotonic()
    data = read_dataset(dataset_dir)
    loss, metrics = loss_and_metrics(data.task, config.threshold)
    _check_monitor(config.monitor, data.task, metrics)
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
        write_outputs(model_dir, result, data.text_column, config)
        job.run.state["finished"] = True
        job.run.save()
    finally:
        tensorboard.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if checkpoint_folder is None and run_state.inside_output(folder, model_dir):
        # Under the model output they would ship with the model; they served their purpose.
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _check_monitor(monitor: str, task: str, metrics: Sequence) -> None:
    """Refuses a `monitor` that no epoch of this task's model reports."""
    known = ["train_loss", "valid_loss", *(mk_metric(m).name for m in metrics)]
    if monitor not in known:
        raise TextTrainingError(f"monitor {monitor!r} is not a metric of this "
                                f"{task.replace('_', '-')} model; choose one of {known}")


def _prepare(data: PreparedDataset, config: TrainConfig, plan: list[schedule.Stage],
             unfreeze: tuple[str, str], lm_assets_uri: str, model_dir: str, folder: str,
             scratch: str, callbacks: Sequence[Callback], tensorboard: ScalarLog,
             hypertune_metric: str | None) -> TrainingJob:
    """Checks the model's settings, resumes (or starts) the run, builds fastai's frame.

    Args:
        data: The dataset.
        config: Training settings.
        plan: The stages (`schedule.plan_stages`), part of the run's fingerprint.
        unfreeze: `schedule.resolve_unfreeze`'s answer.
        lm_assets_uri: Root of the pretrained LM assets (when `config.pretrained`).
        model_dir: The output folder (part of the run's fingerprint).
        folder: The checkpoint folder.
        scratch: Local folder for copied assets and the tokenizer's files.
        callbacks: Extra fastai callbacks for every fit.
        tensorboard: The epochs' scalar log.
        hypertune_metric: The classifier's value reported to a tuning study, or None.

    Raises:
        TextTrainingError: Bad model settings, or a checkpoint folder of another run.
    """
    assets, arch_config = _architecture(config, lm_assets_uri, scratch)
    tokenizer = make_tokenizer(config.lang, assets.spm_model if assets else None, scratch)
    precision = precision_here(config.mixed_precision)
    resume, resumed_from = resume_run(folder, plan, {
        "config": dataclasses.asdict(config), "plan": [dataclasses.asdict(s) for s in plan],
        "manifest": data.manifest, "model_dir": os.path.abspath(model_dir),
        "assets": lm_assets_uri if config.pretrained else "",
    })
    lm_config = {**awd_lstm_lm_config, **arch_config}
    constant = text_scores.constant_answer(
        data.valid[data.labels].to_numpy(), data.train[data.labels].to_numpy(),
        data.task == MULTI_LABEL, config.threshold)
    run = StageRunner(resume, plan, config.monitor, callbacks, tensorboard,
                      TrialReporter(hypertune_metric), constant, int(lm_config["n_hid"]))
    set_seed(config.seed)
    frame, truncated = fastai_frame(data)
    return TrainingJob(data, config, run, assets, arch_config, lm_config, tokenizer,
                       precision, frame, truncated, resumed_from, unfreeze)


def _architecture(config: TrainConfig, lm_assets_uri: str,
                  scratch: str) -> tuple[LMAssets | None, dict[str, Any]]:
    """The pretrained LM's assets (copied into `scratch`) and the AWD-LSTM settings given."""
    if not config.pretrained:
        arch_config = dict(config.model_config)
        _check_arch_config(arch_config, "model_config")
        return None, arch_config
    if config.model_config:
        raise TextTrainingError(
            "model_config applies to training from scratch; a pretrained LM's "
            "settings come from its config.json")
    assets = resolve_assets(lm_assets_uri, config.lang, config.backwards, scratch)
    _check_arch_config(assets.config, f"{lm_assets_uri} config.json")
    return assets, assets.config

