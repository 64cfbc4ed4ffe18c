"""Runtime pieces both fastai text trainers use (the classifier and the language model);
imported only by steps that run in the fastai image."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from fastai.callback.progress import ProgressCallback
from fastai.callback.schedule import minimum, slide, steep, valley
from fastai.learner import load_model, save_model
from fastai.text.all import (
    AWD_LSTM,
    Callback,
    ColReader,
    ColSplitter,
    DataBlock,
    LMDataLoader,
    Perplexity,
    Recorder,
    TextBlock,
    accuracy,
    get_model,
    language_model_learner,
    noop,
)

from components.common import preemption, run_state
from components.common.precision import BF16, FP16, FP32, choose_precision
from components.common.tensorboard import ScalarLog, epoch_scalars, log_folder, model_step

log = logging.getLogger(__name__)

# lr_find's sweep: fastai's length, or the training's when shorter, never below the minimum.
LR_FIND_ITERATIONS = 100  # fastai's default
LR_FIND_MIN_ITERATIONS = 30
# Tokenize in this process: forking a process with threads running can deadlock the child.
TOKENIZER_WORKERS = 0
# The column of a frame's held-out rows (`lm_dataloaders`).
IS_VALID = "is_valid"
# Batches between `release_freed_memory` calls (glibc kept ~0.5 GB a minute otherwise).
TRIM_EVERY_BATCHES = 20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None on another platform or C library (musl, macOS)."""
    libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    try:
        if sys.platform.startswith("linux") and (libc or "").startswith("glibc"):
            trim = ctypes.CDLL("libc.so.6").malloc_trim
            trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
            return trim
    except (OSError, AttributeError) as error:
        libc = f"{libc}: {error}"
    log.debug("no malloc_trim (%s, %s): freed memory is left to the allocator",
              sys.platform, libc)
    return None


def release_freed_memory() -> bool:
    """Returns memory freed but kept by glibc's per-thread heaps to the system (`malloc_trim`);
    whether glibc gave some back (False where there is no glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


class EpochEnd(Callback):
    """Calls `on_epoch(epochs_done, values, seconds, cpu_seconds)` after each epoch trained,
    and `release` (freed memory) every `trim_every` batches (0: never) and at epoch ends."""

    order = Recorder.order + 1  # after the Recorder has the epoch's losses and metrics
    _trained, _start, _start_cpu = False, 0.0, 0.0

    def __init__(self, on_epoch, trim_every: int | None = None,
                 release: Callable[[], object] | None = None):
        self.on_epoch = on_epoch
        self.trim_every = TRIM_EVERY_BATCHES if trim_every is None else trim_every
        self.release = release or release_freed_memory
        self.batches = 0

    def before_epoch(self):
        self._trained, self._start, self._start_cpu = False, time.monotonic(), time.process_time()

    def after_train(self):
        self._trained = True

    def after_batch(self):
        # Recorder's 0-d loss tensors, kept all fit, fragment the heap: keep floats.
        losses = getattr(self.recorder, "losses", None)
        if self.training and losses and hasattr(losses[-1], "item"):
            losses[-1] = losses[-1].item()
        self.batches += 1
        if self.trim_every and self.batches % self.trim_every == 0:
            self.release()

    def after_epoch(self):
        # Epochs that SkipToEpoch jumps over on resume end too, without training.
        if not self._trained:
            return
        if self.trim_every:
            self.release()
        names = self.recorder.metric_names[1:1 + len(self.learn.final_record)]
        values = {name: float(v) for name, v in zip(names, self.learn.final_record)
                  if v is not None}
        seconds, cpu = time.monotonic() - self._start, time.process_time() - self._start_cpu
        log.info("epoch %d/%d: %s (%.1f s, %.1f CPU s)", self.epoch + 1, self.n_epoch,
                 ", ".join(f"{k} {v:.4f}" for k, v in values.items()), seconds, cpu)
        self.on_epoch(self.epoch + 1, values, seconds, cpu)


@contextlib.contextmanager
def run_folders(output_dir: str, checkpoint_folder: str | None, tensorboard_folder: str | None):
    """Yields a fastai trainer's `(checkpoint folder, ScalarLog, scratch folder)`: checkpoints
    in `checkpoint_folder`, else `run_state.checkpoint_folder(output_dir)`, then gone once
    the run succeeds if inside the output (they would ship with it); the log is closed and
    the scratch removed whatever happens."""
    folder = checkpoint_folder or run_state.checkpoint_folder(output_dir)
    os.makedirs(folder, exist_ok=True)
    tensorboard = ScalarLog(log_folder(output_dir, tensorboard_folder))
    scratch = tempfile.mkdtemp(prefix="fastai_run_")
    try:
        yield folder, tensorboard, scratch
    finally:
        tensorboard.close()
        shutil.rmtree(scratch, ignore_errors=True)
    if checkpoint_folder is None and run_state.inside_output(folder, output_dir):
        shutil.rmtree(folder, ignore_errors=True)


def step_file(name: str | None) -> str | None:
    """The file beside checkpoint `name` (`<stem>.pth`) holding its mid-epoch step, if any."""
    return name and name.removesuffix(".pth") + "-step.pth"


def save_checkpoint(learn, path: str, step: dict | None = None, with_opt: bool = True) -> None:
    """Writes `learn`'s model (and optimizer) to `path` and a mid-epoch `step` to
    `step_file(path)`, each whole or not at all."""
    if step is not None:
        torch.save(step, step_file(path) + ".tmp")
        os.replace(step_file(path) + ".tmp", step_file(path))
    save_model(path + ".tmp", learn.model, learn.opt, with_opt=with_opt)
    os.replace(path + ".tmp", path)


def load_checkpoint(learn, resume, record: dict) -> dict | None:
    """Loads `record`'s checkpoint (`fit_sealed`'s model and optimizer), if any, into `learn`;
    returns its mid-epoch step or None."""
    if not record.get("checkpoint"):
        return None
    if learn.opt is None:
        learn.create_opt()
    path = resume.path(record["checkpoint"])
    load_model(path, learn.model, learn.opt, with_opt=True, device=learn.dls.device)
    step = step_file(path)
    return torch.load(step, weights_only=False) if os.path.exists(step) else None


def _rng_state(dl=None) -> dict:
    """The RNG of python, numpy, torch and, with `dl`, its shuffle (and an LM's order)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    if dl is not None:
        state.update(loader=dl.rng.getstate(),
                     order=list(dl.items.idxs) if isinstance(dl, LMDataLoader) else None)
    return state


def _set_rng_state(state: dict, dl=None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    if dl is not None:
        dl.rng.setstate(state["loader"])
        if state["order"] is not None:  # the LM shuffles its texts' order in place
            dl.items.reindex(list(state["order"]))
            dl.lens.reindex(dl.items.idxs)


class MidEpoch(Callback):
    """Seals a mid-epoch checkpoint at a SIGTERM (then `Preempted`) and every `every_steps`
    optimizer steps; resumes a fit inside the sealed epoch.

    A resumed epoch draws its order again, skips the batches trained and goes on at the
    sealed one-cycle position, RNG and LM hidden state: on CPU the same model as an
    uninterrupted run.

    Args:
        notice: The SIGTERM notice held while the fit runs.
        every_steps: `checkpoint_every_steps` (0: never).
        seal: `seal(step)` seals `step` with the model and optimizer; returns where.
        resumed: The step `load_checkpoint` returned, to resume from; None: none.
        steps: The run's optimizer steps before this fit.
    """

    order = EpochEnd.order + 1  # after TrainEvalCallback's epoch start and EpochEnd's seal

    def __init__(self, notice: preemption.Notice, every_steps: int,
                 seal: Callable[[dict], str], resumed: dict | None = None, steps: int = 0):
        self.notice, self.every_steps, self.seal = notice, every_steps, seal
        self.resumed, self.steps, self.skipped, self.restore = resumed, steps, 0, None

    def before_train(self):
        step, self.skipped = self.resumed, 0
        if step is not None and step["epoch"] == self.epoch:
            _set_rng_state(step["start_rng"], self.dl)  # this epoch's order again
            self.resumed, self.restore, self.skipped = None, step, step["batches"]
            dl, get_idxs = self.dl, self.dl.get_idxs

            def skip_trained():  # once: the next epochs read whole
                del dl.get_idxs
                return itertools.islice(get_idxs(), self.skipped * dl.bs, None)

            dl.get_idxs = skip_trained
            self.learn.pct_train += self.skipped / (len(dl) * self.n_epoch)
            self.learn.train_iter = step["train_iter"]
            log.info("resumed mid-epoch: epoch %d from step %d", self.epoch, self.skipped)
        self.start_rng = _rng_state(self.dl)

    def before_batch(self):
        if self.training and self.restore is not None:  # the order drawn: as at the seal
            _set_rng_state(self.restore["rng"])
            hidden, encoder = self.restore["hidden"], get_model(self.model)[0]
            if hidden is not None:  # with its batch size, which AWD_LSTM resizes it from
                encoder.hidden, encoder.bs = hidden, hidden[0][0].size(1)
            self.restore = None

    def after_step(self):
        self.steps += 1

    def after_batch(self):
        done = self.skipped + self.iter + 1
        if not self.training or done == self.n_iter:  # an epoch's end: EpochEnd seals it
            return
        stop = preemption.any_rank(self.notice.requested, None)  # one process
        if stop or preemption.due(self.steps, self.every_steps):
            hidden = getattr(get_model(self.model)[0], "hidden", None)  # an LM's carries on
            where = self.seal({"epoch": self.epoch, "batches": done, "steps": self.steps,
                               "train_iter": self.train_iter, "start_rng": self.start_rng,
                               "rng": _rng_state(), "hidden": hidden})
            if stop:
                raise preemption.Preempted(f"in {where} at epoch {self.epoch} step {done}")

    def after_epoch(self):
        if self.notice.requested:  # in validation or at the last step: sealed by EpochEnd
            raise preemption.Preempted(f"at epoch {self.epoch}'s end")


def fit_sealed(learn, epochs: int, lr, start_epoch: int, resume: run_state.Resume, record: dict,
               tensorboard: ScalarLog, stem: str, tag: str, resumed: dict | None,
               every_steps: int, cbs: Sequence[Callback] = (), *, row: Mapping | None = None,
               fields: Mapping | None = None, keep: Sequence[str | None] = (),
               best: Callable[[int, dict], str | None] | None = None,
               report: Callable[[dict, int], None] | None = None) -> None:
    """`fit_one_cycle` at ULMFiT's momenta from `start_epoch`, sealing in `record` (of
    `resume`'s state) `<stem>-<epoch>.pth` at each epoch's end (`EpochEnd`, after its row,
    `row`'s fields, `epoch`, `seconds`, `cpu_seconds` and values, joins `record["history"]`)
    and `<stem>-<epoch>-<batches>.pth` mid-epoch (`MidEpoch` from `resumed`, `every_steps`).
    A seal saves the files, then the state (with `fields`), then drops the previous files
    unless in `keep`. Once sealed, an epoch's row goes to `tensorboard` (`<tag>/<field>` at
    its model's row count, `model_step`), then `report(values, step)`; then the file that
    `best(epochs_done, values)` returned before the seal goes (unless in `keep`)."""

    def seal(name: str, epochs_done: int, steps: int, step: dict | None = None) -> str:
        previous = record.get("checkpoint")
        save_checkpoint(learn, resume.path(name), step)
        record.update(checkpoint=name, mid_epoch=step and {"batches": step["batches"]},
                      **(fields or {}), epochs_done=epochs_done, optimizer_steps=steps)
        resume.save()  # older files go only once the state no longer points at them
        for old in (previous, step_file(previous)):
            resume.drop(old, name, step_file(name), *keep)
        return resume.path(name)

    def seal_step(step: dict) -> str:
        return seal(f"{stem}-{step['epoch']}-{step['batches']}.pth", step["epoch"],
                    step["steps"], step)

    def on_epoch(epochs_done: int, values: dict[str, float], seconds: float,
                 cpu_seconds: float) -> None:
        drop = best(epochs_done, values) if best else None
        done = {**(row or {}), "epoch": epochs_done, "seconds": round(seconds, 3),
                "cpu_seconds": round(cpu_seconds, 3), **values}
        record["history"].append(done)
        seal(f"{stem}-{epochs_done}.pth", epochs_done, mid.steps)
        step = model_step(record["history"], done.get("model"))
        tensorboard.write(epoch_scalars(tag, done), step)
        if report:
            report(values, step)
        resume.drop(drop, *keep)

    with preemption.Notice() as notice:
        mid = MidEpoch(notice, every_steps, seal_step, resumed, record.get("optimizer_steps", 0))
        learn.fit_one_cycle(epochs, lr, moms=(0.8, 0.7, 0.8), start_epoch=start_epoch,
                            cbs=[EpochEnd(on_epoch), mid, *cbs])


def quiet(learn):
    """Drops the progress bars (carriage-return noise in job logs); EpochEnd logs each epoch."""
    if hasattr(learn, "progress"):
        learn.remove_cb(ProgressCallback)
    learn.logger = noop
    return learn


def language_model_loaders(dsets, bs: int, val_bs: int, seq_len: int):
    """fastai's language model dataloaders over the `Datasets` of an LM `TextBlock`, each
    text's token ids made once (the default cache of 2 texts remade them every epoch: 78% of
    an epoch on an H100)."""
    # num_workers=0: worker processes fork the training process (threads running).
    return dsets.dataloaders(bs=bs, val_bs=val_bs, seq_len=seq_len, num_workers=0,
                             cache=max(len(dsets.train), len(dsets.valid), 1))


def lm_dataloaders(frame, text: str, tokenizer, vocab, config, backwards: bool):
    """A language model's dataloaders over `frame`'s `text` column (its `IS_VALID` rows
    held out), a batch size shrunk where a split has too few tokens for one batch.

    Args:
        frame: The texts and their `IS_VALID` column.
        text: The column of the texts.
        tokenizer: fastai's tokenizer of the language.
        vocab: The vocabulary to number tokens with; None makes one of the training texts.
        config: The trainer's settings (`seq_len`, `min_freq`, `max_vocab`, `batch_size`).
        backwards: Read the texts right to left.
    """
    block = TextBlock.from_df(text, vocab=vocab, is_lm=True, seq_len=config.seq_len,
                              backwards=backwards, tok=tokenizer, min_freq=config.min_freq,
                              max_vocab=config.max_vocab, n_workers=TOKENIZER_WORKERS)
    dsets = DataBlock(blocks=block, get_x=ColReader(text),
                      splitter=ColSplitter(IS_VALID)).datasets(frame[[text, IS_VALID]])
    # LMDataLoader cuts a split into bs streams of (tokens - 1) // bs tokens; each needs 2.
    bs, val_bs = (max(1, min(config.batch_size, (int(split.items["text_length"].sum()) - 1) // 2))
                  for split in (dsets.train, dsets.valid))
    if (bs, val_bs) != (config.batch_size, config.batch_size):
        log.warning("few tokens: language model batch size %d (train) / %d (validation) "
                    "instead of %d", bs, val_bs, config.batch_size)
    return language_model_loaders(dsets, bs, val_bs, config.seq_len)


def precision_here(requested: bool) -> str:
    """`choose_precision` for the devices this process sees."""
    cuda = torch.cuda.is_available()
    return choose_precision(requested, cuda, torch.cuda.get_device_capability() if cuda else None)


def mixed_precision(learn, precision: str):
    """`learn` set to train in `precision` ("fp32" leaves it as it is)."""
    if precision not in (FP32, FP16, BF16):
        raise ValueError(f"precision must be one of {(FP32, FP16, BF16)}, got {precision!r}")
    return learn.to_bf16() if precision == BF16 else learn.to_fp16() if precision == FP16 else learn


def lm_learner(dls, arch_config: dict, drop_mult: float, folder: str, precision: str):
    """A quiet AWD-LSTM language model learner of full `arch_config` settings from scratch
    weights, in `precision` (`choose_precision`), saving (and its encoder) in `folder`."""
    learn = language_model_learner(dls, AWD_LSTM, config=arch_config, pretrained=False,
                                   drop_mult=drop_mult, metrics=[accuracy, Perplexity()],
                                   path=folder, model_dir=".")
    quiet(learn)
    return mixed_precision(learn, precision)


def choose_rate(suggestions: Mapping[str, float], floor: float, ceiling: float,
                ) -> tuple[float, str]:
    """The peak rate to train with, from `lr_find`'s suggestions, and which rule gave it.

    `valley`, held to [floor, ceiling]; the bounds' geometric middle when it is not a
    positive number (`steep` and `minimum` were noise on real text). The help text
    (train_text.contract's FOUND_RATE_HELP) says the same: keep them together.
    """
    value = suggestions.get("valley", math.nan)
    if not value > 0:  # also NaN
        return (floor * ceiling) ** 0.5, "middle of the bounds (no usable valley)"
    if floor <= value <= ceiling:
        return float(value), "valley"
    return min(max(float(value), floor), ceiling), "valley, held to the bounds"


def sweep_length(training_steps: int) -> int:
    """Batches `lr_find` sweeps for `training_steps`: fastai's 100, or fewer for a shorter
    training, at least `LR_FIND_MIN_ITERATIONS`."""
    return max(LR_FIND_MIN_ITERATIONS, min(LR_FIND_ITERATIONS, training_steps))


def find_rate(learn, resume, found: dict, key: str, floor: float, ceiling: float,
              epochs: int) -> float:
    """The rate `lr_find` finds on `learn` as it is (frozen or not), held to [floor, ceiling]
    (`choose_rate`), once: `found[key]` keeps the suggestions, `used`, `rule` and `sweep`
    (batches swept: `sweep_length` of `epochs`' batches) in `resume`'s state."""
    if found.get(key) is None:
        sweep = sweep_length(epochs * len(learn.dls.train))
        suggested = learn.lr_find(suggest_funcs=(valley, minimum, steep, slide),
                                  show_plot=False, num_it=sweep)
        rates: dict[str, float | str] = {name: float(getattr(suggested, name))
                                         for name in ("valley", "minimum", "steep", "slide")}
        rates["used"], rates["rule"] = choose_rate(rates, floor, ceiling)
        found[key] = {**rates, "sweep": sweep}
        log.info("lr_find (%s): %s", key, found[key])
        resume.save()
    return found[key]["used"]
