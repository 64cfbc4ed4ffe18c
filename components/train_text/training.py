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
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import torch
from fastai.learner import load_model, mk_metric, save_model
from fastai.text.all import (
    AWD_LSTM,
    BCEWithLogitsLossFlat,
    Callback,
    CategoryBlock,
    ColReader,
    ColSplitter,
    CrossEntropyLossFlat,
    DataBlock,
    F1Score,
    F1ScoreMulti,
    GradientClip,
    MultiCategoryBlock,
    TextBlock,
    accuracy,
    accuracy_multi,
    awd_lstm_lm_config,
    load_pickle,
    make_vocab,
    save_pickle,
    set_seed,
    text_classifier_learner,
    tokenize_df,
)

from components.common import run_state
from components.common.fastai_text import (
    FP32,
    EpochEnd,
    find_rate,
    lm_batch_size,
    lm_learner,
    mixed_precision,
    precision_here,
    quiet,
)
from components.common.hypertune import TrialReporter
from components.common.storage import write_json_atomically
from components.common.tensorboard import ScalarLog, epoch_scalars, log_folder, model_step
from components.formats.lm_assets import make_tokenizer
from components.prepare_text.contract import MULTI_LABEL, read_manifest, read_split
from components.text_common import scores as text_scores
from components.text_common.contract import (
    EXPORT_FILE,
    LABELS_FILE,
    MAX_TEXT_CHARS,
    PER_LABEL_FILE,
    TEXT_FIELD,
    TRAINING_METRICS_FILE,
    clip_text,
)
from components.text_common.scores import labels_info, per_label_summary, validation_result
from components.train_text import schedule
from components.train_text.assets import (
    LMAssets,
    fastai_pretrained_url,
    resolve_assets,
    uses_fastai_pretrained,
)
from components.train_text.contract import TextTrainingError, TrainConfig
from components.train_text.vocabulary import FAKE, with_pretrained_tokens

log = logging.getLogger(__name__)

VOCAB_FILE = "vocab.pkl"
ENCODER_FILE = "lm_encoder.pth"
# Columns of the frames handed to fastai: fixed names, so no user label can clash with them.
_TEXT, _VALID, _CLASS = TEXT_FIELD, "is_valid", "__class__"
# Settings that shape the encoder; the LM's dropouts do not carry over to the classifier.
_ENCODER_KEYS = ("emb_sz", "n_hid", "n_layers", "pad_token", "bidir")
# Largest gradient norm of a step (AWD-LSTM's recipe clips too): one bad batch at the
# peak rate cannot throw the LSTM into saturation, the collapse seen on real text.
GRADIENT_CLIP = 1.0


def _check_arch_config(config: dict[str, Any], source: str) -> None:
    unknown = sorted(set(config) - set(awd_lstm_lm_config) - {"init"})
    if unknown:
        raise TextTrainingError(f"{source}: unknown AWD_LSTM setting(s) {unknown}; "
                                f"known: {sorted(awd_lstm_lm_config)}")


def _frame(train: pd.DataFrame, valid: pd.DataFrame, text_column: str,
           labels: Sequence[str], task: str) -> pd.DataFrame:
    """One frame for fastai: text, is_valid, then the targets under fixed names."""
    both = pd.concat([train, valid], ignore_index=True)
    out = pd.DataFrame({_TEXT: both[text_column].astype(str),
                        _VALID: [False] * len(train) + [True] * len(valid)})
    if task == MULTI_LABEL:
        for i, label in enumerate(labels):
            out[f"__label_{i}"] = both[label].astype(np.int64)
    else:
        out[_CLASS] = np.asarray(labels, dtype=object)[both[list(labels)].to_numpy().argmax(1)]
    return out


def _lm_dataloaders(frame, tokenizer, vocab, config: TrainConfig):
    block = TextBlock.from_df(_TEXT, vocab=vocab, is_lm=True, seq_len=config.seq_len,
                              backwards=config.backwards, tok=tokenizer,
                              min_freq=config.min_freq, max_vocab=config.max_vocab)
    dsets = DataBlock(blocks=block, get_x=ColReader(_TEXT),
                      splitter=ColSplitter(_VALID)).datasets(frame[[_TEXT, _VALID]])
    bs = lm_batch_size(dsets.train.items["text_length"], config.batch_size)
    val_bs = lm_batch_size(dsets.valid.items["text_length"], config.batch_size)
    if bs < config.batch_size or val_bs < config.batch_size:
        log.warning("few tokens: language model batch size %d (train) / %d (valid) instead of %d",
                    bs, val_bs, config.batch_size)
    # num_workers=0: batches of token ids are cheap; worker processes only add start-up time.
    return dsets.dataloaders(bs=bs, val_bs=val_bs, seq_len=config.seq_len, num_workers=0)


def _unigram_accuracy(dls_lm) -> float:
    """Share of the most frequent token in the language model's validation texts."""
    tokens = torch.cat([item[0].flatten() for item in dls_lm.valid_ds])
    return float(torch.bincount(tokens).max()) / max(1, tokens.numel())


def _classifier_dataloaders(frame, tokenizer, vocab, labels, task, config: TrainConfig):
    text_block = TextBlock.from_df(_TEXT, vocab=vocab, seq_len=config.seq_len,
                                   backwards=config.backwards, tok=tokenizer,
                                   min_freq=config.min_freq, max_vocab=config.max_vocab)
    if task == MULTI_LABEL:
        columns = [f"__label_{i}" for i in range(len(labels))]
        y_block, get_y = MultiCategoryBlock(encoded=True, vocab=list(labels)), ColReader(columns)
    else:
        y_block, get_y = CategoryBlock(vocab=list(labels)), ColReader(_CLASS)
    block = DataBlock(blocks=(text_block, y_block), get_x=ColReader(_TEXT), get_y=get_y,
                      splitter=ColSplitter(_VALID))
    n_train = int((~frame[_VALID]).sum())
    # The training loader drops the last partial batch: never ask for more rows than exist.
    bs = min(config.batch_size, n_train)
    if bs < config.batch_size:
        log.warning("%d training rows: classifier batch size %d instead of %d",
                    n_train, bs, config.batch_size)
    return block.dataloaders(frame, bs=bs, seq_len=config.seq_len, num_workers=0)


class _Run:
    """The plan, the state file and the checkpoints of one run."""

    def __init__(self, folder: str, plan: list[schedule.Stage], state: dict[str, Any],
                 monitor: str, callbacks: Sequence[Callback], tensorboard: ScalarLog,
                 trial: TrialReporter, constant: dict[str, float] | None = None,
                 n_hid: int = schedule.BOUNDS_N_HID):
        self.folder, self.plan, self.state = folder, plan, state
        self.monitor, self.callbacks = monitor, list(callbacks)
        self.tensorboard, self.trial = tensorboard, trial
        self.constant = constant  # the classifier's constant answer (text_scores.constant_answer)
        self.n_hid = n_hid  # the AWD-LSTM's hidden size, which the rate bounds scale with

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def save(self) -> None:
        schedule.save_state(self.folder, self.state)

    def indices(self, model: str) -> list[int]:
        """Positions in the plan of `model`'s stages (schedule.LM or schedule.CLASSIFIER)."""
        return [i for i, s in enumerate(self.plan) if s.model == model]

    def saved_vocab(self) -> list[str] | None:
        """The vocabulary an earlier attempt of this run saved, or None."""
        return load_pickle(self.path(VOCAB_FILE)) if self.state["vocab_saved"] else None

    def save_vocab(self, vocab: list[str]) -> None:
        """Keeps the vocabulary first made: a resumed run must number tokens alike."""
        save_pickle(self.path(VOCAB_FILE), vocab)
        self.state["vocab_saved"] = True
        self.save()

    def _save_model(self, learn, name: str, with_opt: bool) -> None:
        tmp = self.path(name + ".tmp")
        save_model(tmp, learn.model, learn.opt, with_opt=with_opt)
        os.replace(tmp, self.path(name))

    def _drop(self, name: str | None, keep: str | None) -> None:
        start = (self.state.get("stage_start") or {}).get("file")
        if name and name not in (keep, start) and os.path.exists(self.path(name)):
            os.remove(self.path(name))

    def restore(self, learn) -> bool:
        """Loads the latest checkpoint of this learner's model kind, if training began."""
        name = self.state.get("checkpoint")
        if not name:
            return False
        if learn.opt is None:
            learn.create_opt()
        load_model(self.path(name), learn.model, learn.opt, with_opt=True,
                   device=learn.dls.device)
        return True

    def started(self, index: int) -> bool:
        """Whether stage `index` or a later one has a checkpointed epoch."""
        return (self.state["stage"], self.state["epochs_done"]) > (index, 0)

    def found_rate(self, learn, stage: schedule.Stage) -> float:
        """`lr_find`'s rate for the stage's model times the stage's share.

        Found once per model, at its first stage (after that stage's freezing); kept in the
        state so that a resumed run trains on the same rates.
        """
        found = self.state.setdefault("found_lr", {})
        if stage.model not in found:
            log.info("finding the %s's rate", stage.model)
            found[stage.model] = find_rate(learn, *schedule.found_rate_bounds(stage, self.n_hid))
            self.save()
        return found[stage.model]["used"] * stage.lr_share

    def fit_classifier(self, learn, indices: Sequence[int]) -> None:
        """Runs the classifier's stages; again, at a lower rate, if they learnt nothing.

        When the classifier's epochs show no learning (`text_scores.learnt_nothing`: the
        validation loss and score still those of the label frequencies), its weights go
        back to where its first stage started and every classifier stage runs again at
        `RESTART_RATE_SHARE` of its rate, at most `MAX_RESTARTS` times; each attempt is
        recorded in the state (`restarts`), and a run that never learns says so.
        """
        while True:
            for index in indices:
                self.fit(learn, index)
            rows = [r for r in self.state["history"] if r["model"] == schedule.CLASSIFIER]
            reason = None if self.state.get("gave_up") or self.constant is None else \
                text_scores.learnt_nothing(rows, self.constant)
            if reason is None:
                return
            if len(self.state["restarts"]) >= schedule.MAX_RESTARTS:
                log.warning("the classifier learnt nothing after %d restarts (%s): going on "
                            "with its best epoch", len(self.state["restarts"]), reason)
                self.state["gave_up"] = reason
                self.save()
                return
            self._restart(learn, indices[0], rows, reason)

    def _restart(self, learn, first: int, rows: list[dict[str, Any]], reason: str) -> None:
        """Back to the classifier's first weights at a lower rate; the failed epochs kept aside."""
        scale = self.state.get("rate_scale", 1.0)
        self.state["rate_scale"] = scale * schedule.RESTART_RATE_SHARE
        log.warning("the classifier learnt nothing (%s): restarting it from its first weights "
                    "at %.3g x its rates", reason, self.state["rate_scale"])
        self.state["restarts"].append({"reason": reason, "rate_scale": scale, "epochs": rows})
        self.state["history"] = [r for r in self.state["history"] if r not in rows]
        start = self.state["stage_start"]
        load_model(self.path(start["file"]), learn.model, None, with_opt=False,
                   device=learn.dls.device)
        learn.opt = None  # a fresh optimizer: the failed run's moments go with it
        self._drop(self.state.get("checkpoint"), start["file"])
        # A resumed job restores the start weights (they hold no optimizer state).
        self.state.update(stage=first, epochs_done=0, checkpoint=start["file"],
                          best=start["best"])
        self.save()

    def fit(self, learn, index: int) -> None:
        """Runs stage `index`, or what is left of it."""
        stage = self.plan[index]
        current = self.state["stage"]
        if current > index:
            return
        start = self.state["epochs_done"] if current == index else 0
        if start >= stage.epochs:
            return
        if start == 0 and stage.model == schedule.CLASSIFIER and \
                self.state.get("stage_start") is None:
            # The weights a restart goes back to (fit_classifier): the classifier's first.
            name = "classifier-start.pth"
            self._save_model(learn, name, with_opt=False)
            self.state["stage_start"] = {"file": name, "best": self.state["best"]}
            self.save()
        if stage.freeze_to is None:
            learn.unfreeze()
        else:
            learn.freeze_to(stage.freeze_to)
        top = (stage.lr or self.found_rate(learn, stage)) * \
            (self.state.get("rate_scale", 1.0) if stage.model == schedule.CLASSIFIER else 1.0)
        lr = top
        if stage.discriminative:
            groups = len(learn.opt.param_groups)
            lr = slice(top / schedule.LR_DECAY_PER_GROUP ** (groups - 1), top)
        log.info("stage %s: epochs %d..%d of %d", stage.name, start + 1, stage.epochs,
                 stage.epochs)

        def on_epoch(epochs_done: int, values: dict[str, float], seconds: float,
                     cpu_seconds: float) -> None:
            previous = self.state.get("checkpoint")
            name = f"{stage.model}-{index}-{epochs_done}.pth"
            self._save_model(learn, name, with_opt=True)
            best = self.state["best"]
            new_best = None
            if stage.model == schedule.CLASSIFIER and self.monitor in values and \
                    schedule.improved(values[self.monitor], best and best["value"], self.monitor):
                new_best = f"best-{index}-{epochs_done}.pth"
                self._save_model(learn, new_best, with_opt=False)
                self.state["best"] = {"value": values[self.monitor], "stage": stage.name,
                                      "epoch": epochs_done, "file": new_best}
            self.state.update(stage=index, epochs_done=epochs_done, checkpoint=name)
            row = {"stage": stage.name, "model": stage.model, "epoch": epochs_done,
                   "seconds": round(seconds, 3), "cpu_seconds": round(cpu_seconds, 3), **values}
            self.state["history"].append(row)
            self.save()
            # After the save: a resumed run never trains (and logs) this epoch again.
            step = model_step(self.state["history"], stage.model)
            self.tensorboard.write(epoch_scalars(stage.model, row), step)
            if stage.model == schedule.CLASSIFIER:  # the study ranks classifiers
                self.trial.report(values, step)
            # Older files go only once the state no longer points at them.
            self._drop(previous, name)
            if new_best and best:
                self._drop(best.get("file"), new_best)

        clip = [GradientClip(GRADIENT_CLIP)] if GRADIENT_CLIP else []
        learn.fit_one_cycle(stage.epochs, lr, moms=(0.8, 0.7, 0.8), start_epoch=start,
                            cbs=[EpochEnd(on_epoch), *clip, *self.callbacks])


def _reset_folder(folder: str) -> None:
    """Removes this step's files from a checkpoint folder (another run's, or none)."""
    run_state.remove_leftovers(
        folder, names=(schedule.STATE_FILE, VOCAB_FILE),
        suffixes=(".pth", ".pth.tmp"))


@dataclasses.dataclass(frozen=True)
class _Dataset:
    """The prepared dataset's manifest facts and its two splits used in training."""

    manifest: dict[str, Any]
    labels: list[str]
    task: str
    text_column: str
    train: pd.DataFrame
    valid: pd.DataFrame


@dataclasses.dataclass
class _Job:
    """What the stages of one `train_text_classifier` call share."""

    data: _Dataset
    config: TrainConfig
    run: _Run
    assets: LMAssets | None  # the pretrained LM's local files, when pretrained
    arch_config: dict[str, Any]  # the AWD-LSTM settings given (config.json or model_config)
    lm_config: dict[str, Any]  # fastai's defaults updated with them
    tokenizer: Any
    precision: str
    frame: pd.DataFrame  # what fastai reads (_frame), texts clipped to MAX_TEXT_CHARS
    truncated: int  # texts that were clipped
    resumed_from: dict[str, Any] | None
    unfreeze: tuple[str, str]  # (mode used, why)


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
            `schedule.checkpoint_dir(model_dir)` (AIP_CHECKPOINT_DIR when set).
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
    started = time.monotonic()
    data = _read_dataset(dataset_dir)
    loss, metrics = _loss_and_metrics(data.task, config.threshold)
    _check_monitor(config.monitor, data.task, metrics)
    folder = checkpoint_folder or schedule.checkpoint_dir(model_dir)
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
        vocab = _fine_tune_lm(job, job.run.saved_vocab())
        _train_random_encoder_whole(job)
        learn, dls, vocab = _classifier_learner(job, vocab, loss, metrics)
        job.run.fit_classifier(learn, job.run.indices(schedule.CLASSIFIER))
        learn, result = _validate_and_export(job, learn, model_dir)
        result.update(_report(job, learn, dls, vocab, lm_assets_uri, started))
        _write_outputs(model_dir, result, data.text_column, config)
        job.run.state["finished"] = True
        job.run.save()
    finally:
        tensorboard.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if checkpoint_folder is None and run_state.inside_output(folder, model_dir):
        # Under the model output they would ship with the model; they served their purpose.
        shutil.rmtree(folder, ignore_errors=True)
    return result


def _read_dataset(dataset_dir: str) -> _Dataset:
    """The manifest's labels, task and text column, and the train and validation splits."""
    manifest = read_manifest(dataset_dir)
    return _Dataset(manifest, manifest["labels"], manifest["task"], manifest["text_column"],
                    read_split(dataset_dir, "train"), read_split(dataset_dir, "validation"))


def _check_monitor(monitor: str, task: str, metrics: Sequence) -> None:
    """Refuses a `monitor` that no epoch of this task's model reports."""
    known = ["train_loss", "valid_loss", *(mk_metric(m).name for m in metrics)]
    if monitor not in known:
        raise TextTrainingError(f"monitor {monitor!r} is not a metric of this "
                                f"{task.replace('_', '-')} model; choose one of {known}")


def _prepare(data: _Dataset, config: TrainConfig, plan: list[schedule.Stage],
             unfreeze: tuple[str, str], lm_assets_uri: str, model_dir: str, folder: str,
             scratch: str, callbacks: Sequence[Callback], tensorboard: ScalarLog,
             hypertune_metric: str | None) -> _Job:
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
    state, resumed_from = _load_or_start_state(folder, plan, schedule.fingerprint({
        "config": dataclasses.asdict(config), "plan": [dataclasses.asdict(s) for s in plan],
        "manifest": data.manifest, "model_dir": os.path.abspath(model_dir),
        "assets": lm_assets_uri if config.pretrained else "",
    }))
    lm_config = {**awd_lstm_lm_config, **arch_config}
    constant = text_scores.constant_answer(
        data.valid[data.labels].to_numpy(), data.train[data.labels].to_numpy(),
        data.task == MULTI_LABEL, config.threshold)
    run = _Run(folder, plan, state, config.monitor, callbacks, tensorboard,
               TrialReporter(hypertune_metric), constant, int(lm_config["n_hid"]))
    set_seed(config.seed)
    frame, truncated = _fastai_frame(data)
    return _Job(data, config, run, assets, arch_config, lm_config, tokenizer, precision,
                frame, truncated, resumed_from, unfreeze)


def _fastai_frame(data: _Dataset) -> tuple[pd.DataFrame, int]:
    """The frame fastai reads (`_frame`), texts clipped; and how many were clipped."""
    frame = _frame(data.train, data.valid, data.text_column, data.labels, data.task)
    # Read as prediction reads them (spaCy refuses texts over 1M characters).
    truncated = int((frame[_TEXT].str.len() > MAX_TEXT_CHARS).sum())
    frame[_TEXT] = frame[_TEXT].map(clip_text)
    if truncated:
        log.warning("%d text(s) over %d characters: read up to the limit", truncated,
                    MAX_TEXT_CHARS)
    return frame, truncated


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


def _load_or_start_state(folder: str, plan: list[schedule.Stage], run_fingerprint: str,
                         ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """This run's saved state and where it resumes, or a new state (another run's files go).

    Raises:
        TextTrainingError: The folder holds another run's state.
    """
    state = schedule.load_state(folder, run_fingerprint)
    if state is None:
        _reset_folder(folder)
        return schedule.new_state(run_fingerprint), None
    resumed_from = {"stage": plan[min(state["stage"], len(plan) - 1)].name,
                    "epochs_done": state["epochs_done"]}
    log.info("resuming from %s", resumed_from)
    return state, resumed_from


def _fine_tune_lm(job: _Job, vocab: list[str] | None) -> list[str] | None:
    """Runs the LM stages and saves the encoder, unless there are none or it is saved.

    Returns:
        The vocabulary: `vocab`, or the LM data's when `vocab` was None (then saved).
    """
    run, state, config = job.run, job.run.state, job.config
    lm_indices = run.indices(schedule.LM)
    if not lm_indices or state["encoder_saved"]:
        return vocab
    vocab = _vocab_with_pretrained_tokens(job, vocab)
    dls_lm = _lm_dataloaders(job.frame, job.tokenizer, vocab, config)
    if vocab is None:
        vocab = list(dls_lm.vocab)
        run.save_vocab(vocab)
    learn_lm = lm_learner(dls_lm, job.lm_config, config.drop_mult, run.folder, job.precision)
    if not run.restore(learn_lm) and job.assets:
        learn_lm.load_pretrained(job.assets.weights, job.assets.vocab)
    for index in lm_indices:
        run.fit(learn_lm, index)
    learn_lm.save_encoder(ENCODER_FILE[:-len(".pth")])
    lm_rows = [r for r in state["history"] if r["model"] == schedule.LM]
    discarded = schedule.lm_learnt_nothing(lm_rows, _unigram_accuracy(dls_lm))
    if discarded:
        log.warning("the language model learnt nothing (%s): the classifier starts "
                    "from %s instead", discarded,
                    "the pretrained weights" if job.assets else "random weights")
    state.update(encoder_saved=True, checkpoint=None, lm_discarded=discarded)
    run.save()
    return vocab


def _vocab_with_pretrained_tokens(job: _Job, vocab: list[str] | None) -> list[str] | None:
    """The run's vocabulary: `vocab` when it has one; from a pretrained LM, fastai's plus the
    task's rarer tokens the LM has learnt (`vocabulary.with_pretrained_tokens`), saved;
    else None (the first dataloaders make fastai's own).
    """
    if vocab is not None or job.assets is None:
        return vocab
    # Counted as TextBlock.from_df counts (the same tokenizer and rules, train + validation);
    # the dataloaders tokenize the texts again: a pretrained run pays that once (the
    # vocabulary is saved, and a resumed run reads it).
    _, counts = tokenize_df(job.frame[[_TEXT]], [_TEXT], tok=job.tokenizer)
    config = job.config
    frequent = make_vocab(counts, config.min_freq, config.max_vocab)
    vocab = with_pretrained_tokens(frequent, counts, load_pickle(job.assets.vocab),
                                   config.max_vocab)
    log.info("vocabulary: %d tokens seen %d times or more, %d rarer ones the pretrained "
             "language model knows", sum(t != FAKE for t in frequent), config.min_freq,
             sum(t != FAKE for t in vocab) - sum(t != FAKE for t in frequent))
    job.run.save_vocab(vocab)
    return vocab


def _train_random_encoder_whole(job: _Job) -> None:
    """Replaces gradual unfreezing by one whole stage when the LM's encoder was discarded.

    A random encoder gains nothing from gradual unfreezing: it trains whole, as from
    scratch (the same plan on a resume: lm_discarded is in the state).
    """
    run, config = job.run, job.config
    if not (run.state.get("lm_discarded") and not config.pretrained and
            any(s.freeze_to is not None for s in run.plan)):
        return
    run.plan = [s for s in run.plan if s.model == schedule.LM] + \
        schedule.plan_stages(0, config.epochs, config.lm_learning_rate, config.learning_rate,
                             False, "all")
    job.unfreeze = ("all", "the language model learnt nothing: the random encoder trains "
                    "whole from the start")


def _classifier_learner(job: _Job, vocab: list[str] | None, loss, metrics):
    """The classifier's learner, from its last checkpoint, else its starting weights.

    It starts from the fine-tuned encoder, else the pretrained one, else random weights.

    Returns:
        `(learner, its dataloaders, the vocabulary)`; a vocabulary first made here is saved.
    """
    run, state, config, data = job.run, job.run.state, job.config, job.data
    vocab = _vocab_with_pretrained_tokens(job, vocab)
    dls = _classifier_dataloaders(job.frame, job.tokenizer, vocab, data.labels, data.task,
                                  config)
    if vocab is None:
        vocab = list(dls.vocab[0])
        run.save_vocab(vocab)
    clas_config = {k: v for k, v in job.arch_config.items() if k in _ENCODER_KEYS}
    learn = text_classifier_learner(
        dls, AWD_LSTM, seq_len=config.seq_len, config=clas_config, pretrained=False,
        drop_mult=config.drop_mult, loss_func=loss, metrics=metrics, path=run.folder,
        model_dir=".")
    quiet(learn)
    start_at_label_frequencies(learn, data.train[data.labels].to_numpy(), data.task)
    learn = mixed_precision(learn, job.precision)
    clas_indices = run.indices(schedule.CLASSIFIER)
    if not (clas_indices and run.started(clas_indices[0]) and run.restore(learn)):
        if state["encoder_saved"] and not state.get("lm_discarded"):
            learn.load_encoder(ENCODER_FILE[:-len(".pth")])
        elif job.assets:
            learn.load_pretrained(job.assets.weights, job.assets.vocab, model=learn.model[0])
    return learn, dls, vocab


def _validate_and_export(job: _Job, learn, model_dir: str) -> tuple[Any, dict[str, Any]]:
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


def _report(job: _Job, learn, dls, vocab: list[str], lm_assets_uri: str,
            started: float) -> dict[str, Any]:
    """metrics.json's `history`, `best`, `run` (sizes, timings, resume facts) and `config`."""
    state, config = job.run.state, job.config
    n_params = sum(p.numel() for p in learn.model.parameters())
    train_tokens = int(dls.train.items["text_length"].sum())
    clas_epochs = [h for h in state["history"] if h["model"] == schedule.CLASSIFIER]
    unfreeze, unfreeze_reason = job.unfreeze
    return {
        "history": state["history"],
        "best": state["best"],
        "run": {
            "rows": {"train": len(job.data.train), "validation": len(job.data.valid)},
            "texts_truncated": job.truncated,
            "max_text_chars": MAX_TEXT_CHARS,
            "train_tokens": train_tokens,
            "vocab_size": len(vocab),
            "parameters": int(n_params),
            "arch": "AWD_LSTM",
            "arch_config": {k: job.lm_config[k] for k in _ENCODER_KEYS},
            "pretrained": config.pretrained,
            "pretrained_from": (_pretrained_source(lm_assets_uri, config.lang,
                                                   config.backwards)
                                if config.pretrained else None),
            "precision": job.precision,
            "device": str(learn.dls.device),
            "resumed_from": job.resumed_from,
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


def _pretrained_source(lm_assets_uri: str, lang: str, backwards: bool) -> str:
    """Where the pretrained LM came from: the assets root, or fastai's archive URL."""
    if uses_fastai_pretrained(lm_assets_uri, lang):
        return fastai_pretrained_url(backwards)
    return lm_assets_uri


def start_at_label_frequencies(learn, truth: np.ndarray, task: str) -> None:
    """Gives the classifier's output layer a bias that predicts each label's frequency.

    fastai's head ends in BatchNorm then a Linear layer without bias, so an untrained model
    says 0.5 for every label (multi-label) and spends its first epochs only learning that
    labels are rare; with a random encoder and 6 epochs it often never gets further (the
    model answers "no label"). Starting from the training split's frequencies (the
    log-odds per label; log-priors for softmax) puts that knowledge in from the start.
    Rates are clipped to [1e-3, 1 - 1e-3]: a label with no training row is not -inf.

    Args:
        learn: A fresh `text_classifier_learner` (before any checkpoint is loaded into it).
        truth: 0/1 label matrix of the training split, shape (rows, labels).
        task: MULTI_LABEL or SINGLE_LABEL.
    """
    linear = [m for m in learn.model[1].modules() if isinstance(m, torch.nn.Linear)][-1]
    bias = text_scores.frequency_bias(truth, task)
    linear.bias = torch.nn.Parameter(torch.as_tensor(bias, dtype=linear.weight.dtype,
                                                     device=linear.weight.device))


def _loss_and_metrics(task: str, threshold: float) -> tuple[Any, list]:
    """Multi-label: sigmoid per label (BCE), thresholded; single-label: softmax (cross-entropy)."""
    if task == MULTI_LABEL:
        return (BCEWithLogitsLossFlat(thresh=threshold),
                [partial(accuracy_multi, thresh=threshold),
                 F1ScoreMulti(thresh=threshold, average="macro")])
    return CrossEntropyLossFlat(), [accuracy, F1Score(average="macro")]


def _write_outputs(model_dir: str, result: dict[str, Any],
                   text_column: str, config: TrainConfig) -> None:
    def dump(name: str, value: Any) -> None:
        write_json_atomically(os.path.join(model_dir, name), value, sort_keys=False)

    dump(LABELS_FILE, labels_info(result, text_column, config.threshold, lang=config.lang,
                                  backwards=config.backwards, arch="AWD_LSTM"))
    dump(TRAINING_METRICS_FILE, result)
    dump(PER_LABEL_FILE, per_label_summary(result))
