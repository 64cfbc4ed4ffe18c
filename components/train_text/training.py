"""ULMFiT text classifier with fastai: `TrainingJob` fine-tunes the language model, then
the classifier, stage by stage with their state file and checkpoints; the best epoch scored
and exported, metrics.json's report, the model's metadata.

Only `fastai.text` is imported (`fastai.vision` fails to import in this stack).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from fastai.learner import load_model, mk_metric
from fastai.text.all import (
    AWD_LSTM,
    BCEWithLogitsLossFlat,
    Callback,
    CrossEntropyLossFlat,
    F1Score,
    F1ScoreMulti,
    GradientClip,
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
    TOKENIZER_WORKERS,
    find_rate,
    fit_sealed,
    lm_dataloaders,
    lm_learner,
    load_checkpoint,
    mixed_precision,
    precision_here,
    quiet,
    run_folders,
    save_checkpoint,
)
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
from components.train_text.assets import fetch_assets
from components.train_text.contract import TextTrainingError, TrainConfig, model_config_problems
from components.train_text.data import (
    FRAME_TEXT,
    PreparedDataset,
    classifier_dataloaders,
    fastai_frame,
    read_dataset,
    unigram_accuracy,
)

log = logging.getLogger(__name__)

ENCODER = "lm_encoder"  # learn.save_encoder's name: lm_encoder.pth in the checkpoint folder

# Settings that shape the encoder; the LM's dropouts do not carry over to the classifier.
ENCODER_KEYS = ("emb_sz", "n_hid", "n_layers", "pad_token", "bidir")
# fastai pads a vocabulary with this token to a multiple of 8 (`make_vocab`).
FAKE = "xxfake"
# Largest gradient norm of a step (AWD-LSTM's recipe clips too): one bad batch at the
# peak rate cannot throw the LSTM into saturation, the collapse seen on real text.
GRADIENT_CLIP = 1.0


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
    with run_folders(model_dir, checkpoint_folder, tensorboard_folder) as folders:
        job = TrainingJob(data, config, lm_assets_uri, model_dir, folders, callbacks,
                          hypertune_metric)
        vocab = fine_tune_lm(job, job.saved_vocab())
        train_random_encoder_whole(job)
        learn, dls, vocab = classifier_learner(job, vocab, loss, metrics)
        job.fit_classifier(learn, job.indices(schedule.CLASSIFIER))
        learn, result = validate_and_export(job, learn, model_dir)
        result.update(run_report(job, learn, dls, vocab, started))
        write_result_files(model_dir, result, data.text_column, config.threshold,
                           lang=config.lang, backwards=config.backwards, arch="AWD_LSTM")
        job.state["finished"] = True
        job.save()
    return result


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
    data, best = job.data, job.state["best"]
    if best and best.get("file") and os.path.exists(job.path(best["file"])):
        load_model(job.path(best["file"]), learn.model, None, with_opt=False,
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
    state, config = job.state, job.config
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
            "stages": [dataclasses.asdict(s) for s in job.plan],
            "found_learning_rates": state.get("found_lr", {}),
            # Classifier runs that learnt nothing and ran again at a lower rate.
            "restarts": [{k: v for k, v in r.items() if k != "epochs"}
                         for r in state.get("restarts", [])],
            "learnt_nothing": state.get("gave_up"),
            "lm_discarded": state.get("lm_discarded"),
            "constant_answer": job.constant,
        },
        "config": dataclasses.asdict(config),
    }


class TrainingJob:
    """What the stages of one `train_text_classifier` call share, and their runner: the plan,
    the state file and the checkpoints."""

    def __init__(self, data: PreparedDataset, config: TrainConfig, lm_assets_uri: str,
                 model_dir: str, folders: tuple[str, ScalarLog, str],
                 callbacks: Sequence[Callback], hypertune_metric: str | None):
        """Plans the stages, checks the model's settings, resumes (or starts) the run in the
        checkpoint folder of `folders` (`fastai_text.run_folders`), builds fastai's frame; the
        scratch folder takes the copied assets and the tokenizer's files."""
        folder, self.tensorboard, scratch = folders
        self.data, self.config, self.callbacks = data, config, list(callbacks)
        # (mode used, why); fastai drops the last partial training batch
        self.unfreeze = schedule.resolve_unfreeze(config.unfreeze,
                                                  len(data.train) // config.batch_size)
        self.plan = schedule.plan_stages(config.lm_epochs, config.epochs, config.lm_learning_rate,
                                         config.learning_rate, config.pretrained,
                                         self.unfreeze[0])
        # The pretrained LM's local files, and the AWD-LSTM settings given.
        self.assets = fetch_assets(lm_assets_uri, config.lang, config.backwards, scratch) \
            if config.pretrained else None
        self.arch_config, source = ((self.assets.config, f"{lm_assets_uri} config.json")
                                    if self.assets else (dict(config.model_config), "model_config"))
        # fastai's get_language_model takes an `init` too.
        problems = model_config_problems(self.arch_config, {**awd_lstm_lm_config, "init": None},
                                         source)
        if problems:
            raise TextTrainingError("; ".join(problems))
        self.lm_config = {**awd_lstm_lm_config, **self.arch_config}  # fastai's, updated
        self.tokenizer = make_tokenizer(config.lang, self.assets and self.assets.spm_model,
                                        scratch)
        self.precision = precision_here(config.mixed_precision)
        # What defines the run is hashed into its fingerprint; another run's state is refused.
        self.resume = run_state.open_run(folder, schedule.STATE, {
            "config": dataclasses.asdict(config),
            "plan": [dataclasses.asdict(s) for s in self.plan], "manifest": data.manifest,
            "model_dir": os.path.abspath(model_dir),
            "assets": lm_assets_uri if config.pretrained else "",
        }, fresh=schedule.new_state())
        self.folder, self.state = folder, self.resume.state
        self.path, self.save = self.resume.path, self.resume.save  # a file's path; the state
        self.resumed_from = None
        if self.resume.resumed:
            self.resumed_from = {
                "stage": self.plan[min(self.state["stage"], len(self.plan) - 1)].name,
                "epochs_done": self.state["epochs_done"],
                **(self.state.get("mid_epoch") or {})}  # batches of the next
            log.info("resuming from %s", self.resumed_from)
        self.constant = text_scores.constant_answer(
            data.valid[data.labels].to_numpy(), data.train[data.labels].to_numpy(),
            data.task == MULTI_LABEL, config.threshold)
        self.trial = TrialReporter(hypertune_metric)
        self.step: dict | None = None  # the mid-epoch step `restore` loaded
        set_seed(config.seed)
        self.frame, self.truncated = fastai_frame(data)  # what fastai reads, texts clipped

    def indices(self, model: str) -> list[int]:
        """Positions in the plan of `model`'s stages (schedule.LM or schedule.CLASSIFIER)."""
        return [i for i, s in enumerate(self.plan) if s.model == model]

    def saved_vocab(self) -> list[str] | None:
        """The vocabulary an earlier attempt of this run saved, or None."""
        return load_pickle(self.path(schedule.VOCAB_FILE)) if self.state["vocab_saved"] else None

    def save_vocab(self, vocab: list[str]) -> None:
        """Keeps the vocabulary first made: a resumed run must number tokens alike."""
        save_pickle(self.path(schedule.VOCAB_FILE), vocab)
        self.state["vocab_saved"] = True
        self.save()

    def restore(self, learn) -> bool:
        """Loads the latest checkpoint of this learner's model kind, if training began."""
        self.step = load_checkpoint(learn, self.resume, self.state)
        return bool(self.state.get("checkpoint"))

    def started(self, index: int) -> bool:
        """Whether stage `index` or a later one has a checkpoint (an epoch's or mid-epoch)."""
        return (self.state["stage"], self.state["epochs_done"],
                bool(self.state.get("mid_epoch"))) > (index, 0, False)

    def fit_classifier(self, learn, indices: Sequence[int]) -> None:
        """Runs the classifier's stages, again from their first weights at lower rates (at
        most `MAX_RESTARTS` times) while they learnt nothing (`text_scores.learnt_nothing`)."""
        while True:
            for index in indices:
                self.fit(learn, index)
            rows = [r for r in self.state["history"] if r["model"] == schedule.CLASSIFIER]
            reason = None if self.state.get("gave_up") else \
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
        self.resume.drop(self.state.get("checkpoint"), start["file"])
        # A resumed job restores the start weights (they hold no optimizer state).
        self.state.update(stage=first, epochs_done=0, checkpoint=start["file"],
                          best=start["best"])
        self.save()

    def fit(self, learn, index: int) -> None:
        """Runs stage `index`, or what is left of it."""
        stage = self.plan[index]
        classifier = stage.model == schedule.CLASSIFIER
        start = self.state["epochs_done"] if self.state["stage"] == index else 0
        if self.state["stage"] > index or start >= stage.epochs:
            return
        if start == 0 and classifier and self.state.get("stage_start") is None:
            # The weights a restart goes back to (fit_classifier): the classifier's first.
            name = "classifier-start.pth"
            save_checkpoint(learn, self.path(name), with_opt=False)
            self.state["stage_start"] = {"file": name, "best": self.state["best"]}
            self.save()
        resumed = self.step if self.state["stage"] == index else None
        self.step = None
        moments = learn.opt.state_dict() if start or resumed else None  # the checkpoint's
        learn.freeze_to(0 if stage.freeze_to is None else stage.freeze_to)  # 0: unfreeze()
        if moments:  # which freeze_to clears: a resumed stage goes on with them
            learn.opt.load_state_dict(moments)
        # lr_find's rate for the stage's model (found once, kept) times the stage's share.
        top = (stage.lr or stage.lr_share * find_rate(
            learn, self.resume, self.state.setdefault("found_lr", {}), stage.model,
            *schedule.found_rate_bounds(stage, int(self.lm_config["n_hid"])),
            sum(s.epochs for s in self.plan if s.model == stage.model))) * \
            (self.state.get("rate_scale", 1.0) if classifier else 1.0)
        lr = top if not stage.discriminative else \
            slice(top / schedule.LR_DECAY_PER_GROUP ** (len(learn.opt.param_groups) - 1), top)
        log.info("stage %s: epochs %d..%d of %d", stage.name, start + 1, stage.epochs, stage.epochs)

        def keep_best(epochs_done: int, values: dict[str, float]) -> str | None:
            # A new best's weights; the older best's file goes once the epoch is reported.
            best, monitor = self.state["best"], self.config.monitor
            if monitor not in values or \
                    not schedule.improved(values[monitor], best and best["value"], monitor):
                return None
            name = f"best-{index}-{epochs_done}.pth"
            save_checkpoint(learn, self.path(name), with_opt=False)
            self.state["best"] = {"value": values[monitor], "stage": stage.name,
                                  "epoch": epochs_done, "file": name}
            previous = best and best.get("file")
            return previous if previous != name else None

        fit_sealed(learn, stage.epochs, lr, start, self.resume, self.state, self.tensorboard,
                   f"{stage.model}-{index}", stage.model, resumed,
                   self.config.checkpoint_every_steps,
                   [GradientClip(GRADIENT_CLIP), *self.callbacks],
                   row={"stage": stage.name, "model": stage.model}, fields={"stage": index},
                   keep=((self.state.get("stage_start") or {}).get("file"),),
                   best=keep_best if classifier else None,
                   report=self.trial.report if classifier else None)  # a study ranks these


def fine_tune_lm(job: TrainingJob, vocab: list[str] | None) -> list[str] | None:
    """Runs the LM stages and saves the encoder, unless there are none or it is saved.

    Returns:
        The vocabulary: `vocab`, or the LM data's when `vocab` was None (then saved).
    """
    state, config = job.state, job.config
    lm_indices = job.indices(schedule.LM)
    if not lm_indices or state["encoder_saved"]:
        return vocab
    vocab = _vocab_with_pretrained_tokens(job, vocab)
    dls_lm = lm_dataloaders(job.frame, FRAME_TEXT, job.tokenizer, vocab, config,
                            config.backwards)
    if vocab is None:
        vocab = list(dls_lm.vocab)
        job.save_vocab(vocab)
    learn_lm = lm_learner(dls_lm, job.lm_config, config.drop_mult, job.folder, job.precision)
    if not job.restore(learn_lm) and job.assets:
        learn_lm.load_pretrained(job.assets.weights, job.assets.vocab)
    for index in lm_indices:
        job.fit(learn_lm, index)
    learn_lm.save_encoder(ENCODER)
    lm_rows = [r for r in state["history"] if r["model"] == schedule.LM]
    discarded = schedule.lm_learnt_nothing(lm_rows, unigram_accuracy(dls_lm))
    if discarded:
        log.warning("the language model learnt nothing (%s): the classifier starts "
                    "from %s instead", discarded,
                    "the pretrained weights" if job.assets else "random weights")
    state.update(encoder_saved=True, checkpoint=None, lm_discarded=discarded)
    job.save()
    return vocab


def _vocab_with_pretrained_tokens(job: TrainingJob,
                                  vocab: list[str] | None) -> list[str] | None:
    """`vocab`, else with a pretrained LM fastai's plus the rarer tokens it knows (saved)."""
    if vocab is not None or job.assets is None:
        return vocab
    # Counted as TextBlock.from_df counts (a resumed run reads the saved vocabulary).
    _, counts = tokenize_df(job.frame[[FRAME_TEXT]], [FRAME_TEXT], tok=job.tokenizer,
                            n_workers=TOKENIZER_WORKERS)
    config = job.config
    frequent = make_vocab(counts, config.min_freq, config.max_vocab)
    vocab = with_pretrained_tokens(frequent, counts, load_pickle(job.assets.vocab),
                                   config.max_vocab)
    log.info("vocabulary: %d tokens seen %d times or more, %d rarer ones the pretrained "
             "language model knows", sum(t != FAKE for t in frequent), config.min_freq,
             sum(t != FAKE for t in vocab) - sum(t != FAKE for t in frequent))
    job.save_vocab(vocab)
    return vocab


def with_pretrained_tokens(task_vocab: Sequence[str], counts: Counter,
                           pretrained_vocab: Sequence[str], max_vocab: int) -> list[str]:
    """fastai's vocabulary of a task plus the task's rarer tokens a pretrained LM knows
    (fastai numbers only tokens seen `min_freq` times: on Debian's package descriptions 19%
    of the test tokens read as `xxunk` where the LM knew all but 6%).

    Args:
        task_vocab: `make_vocab(counts, min_freq, max_vocab)` of the task's texts.
        counts: How often each token of the task's texts (train and validation) occurs.
        pretrained_vocab: The pretrained LM's vocabulary (its `vocab.pkl`).
        max_vocab: Most tokens kept (fastai's `max_vocab`).

    Returns:
        `task_vocab`'s tokens, then the task's other tokens `pretrained_vocab` holds (most
        frequent first), at most `max_vocab`, padded with `xxfake` as fastai pads.
    """
    kept = [token for token in task_vocab if token != FAKE]
    seen, known = set(kept), set(pretrained_vocab) - {FAKE}
    extra = [token for token, _ in counts.most_common() if token not in seen and token in known]
    vocab = (kept + extra)[:max_vocab]
    return vocab + [FAKE] * (8 - len(vocab) % 8)


def train_random_encoder_whole(job: TrainingJob) -> None:
    """Replaces gradual unfreezing by one whole stage when the LM's encoder was discarded:
    a random encoder gains nothing from it (a resume plans alike: lm_discarded is saved)."""
    config = job.config
    if not (job.state.get("lm_discarded") and not config.pretrained and
            any(s.freeze_to is not None for s in job.plan)):
        return
    job.plan = [s for s in job.plan if s.model == schedule.LM] + \
        schedule.plan_stages(0, config.epochs, config.lm_learning_rate, config.learning_rate,
                             False, "all")
    job.unfreeze = ("all", "the language model learnt nothing: the random encoder trains "
                    "whole from the start")


def classifier_learner(job: TrainingJob, vocab: list[str] | None, loss, metrics):
    """The classifier's learner from its last checkpoint, else the fine-tuned encoder, else
    the pretrained one, else random weights.

    Returns:
        `(learner, its dataloaders, the vocabulary)`; a vocabulary first made here is saved.
    """
    state, config, data = job.state, job.config, job.data
    vocab = _vocab_with_pretrained_tokens(job, vocab)
    dls = classifier_dataloaders(job.frame, job.tokenizer, vocab, data.labels, data.task,
                                 config)
    if list(dls.vocab[1]) != list(data.labels):  # outputs are read in the labels' order
        raise TextTrainingError(f"the classifier's outputs are ordered {list(dls.vocab[1])}, "
                                f"not as the dataset's labels {list(data.labels)}")
    if vocab is None:
        vocab = list(dls.vocab[0])
        job.save_vocab(vocab)
    clas_config = {k: v for k, v in job.arch_config.items() if k in ENCODER_KEYS}
    learn = text_classifier_learner(
        dls, AWD_LSTM, seq_len=config.seq_len, config=clas_config, pretrained=False,
        drop_mult=config.drop_mult, loss_func=loss, metrics=metrics, path=job.folder,
        model_dir=".")
    quiet(learn)
    start_at_label_frequencies(learn, data.train[data.labels].to_numpy(), data.task)
    learn = mixed_precision(learn, job.precision)
    clas_indices = job.indices(schedule.CLASSIFIER)
    if not (clas_indices and job.started(clas_indices[0]) and job.restore(learn)):
        if state["encoder_saved"] and not state.get("lm_discarded"):
            learn.load_encoder(ENCODER)
        elif job.assets:
            learn.load_pretrained(job.assets.weights, job.assets.vocab, model=learn.model[0])
    return learn, dls, vocab


def start_at_label_frequencies(learn, truth: np.ndarray, task: str) -> None:
    """Gives a fresh classifier head's last Linear layer (fastai's has no bias) the bias
    that predicts each label's frequency in `truth`, the training split's 0/1 label matrix
    (`text_scores.frequency_bias`)."""
    linear = [m for m in learn.model[1].modules() if isinstance(m, torch.nn.Linear)][-1]
    bias = text_scores.frequency_bias(truth, task)
    linear.bias = torch.nn.Parameter(torch.as_tensor(bias, dtype=linear.weight.dtype,
                                                     device=linear.weight.device))


def loss_and_metrics(task: str, threshold: float) -> tuple[Any, list]:
    """Multi-label: sigmoid per label (BCE), thresholded; single-label: softmax (cross-entropy)."""
    if task == MULTI_LABEL:
        return (BCEWithLogitsLossFlat(thresh=threshold),
                [partial(accuracy_multi, thresh=threshold),
                 F1ScoreMulti(thresh=threshold, average="macro")])
    return CrossEntropyLossFlat(), [accuracy, F1Score(average="macro")]

