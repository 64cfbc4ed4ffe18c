"""Runtime pieces both fastai text trainers use (the classifier and the language model).

Imported only by steps that run in the fastai image: it loads fastai and torch.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from fastai.callback.progress import ProgressCallback
from fastai.callback.schedule import minimum, slide, steep, valley
from fastai.text.all import (
    AWD_LSTM,
    Callback,
    Perplexity,
    Recorder,
    accuracy,
    language_model_learner,
    noop,
)

from components.common.precision import BF16, FP16, FP32, choose_precision

log = logging.getLogger(__name__)

# lr_find's sweep (1e-7 to 10): fastai's default length, or the training's own when that is
# shorter, but never below the fewest steps that still give a valley a few points per decade.
LR_FIND_ITERATIONS = 100  # fastai's default
LR_FIND_MIN_ITERATIONS = 30
# Tokenize in this process (fastai's n_workers). fastai's default forks a process pool,
# and a fork of a process that has threads running (torch's, a storage client's, a test
# runner's servers) can deadlock in the child: the step would hang, not fail. The cost:
# fastai's rules + spaCy tokenize ~26k words a CPU second here (1M words: ~40 s; a
# WikiText-103-sized LM corpus, 100M: ~1 h, where 8 forked workers would take ~8 min).
TOKENIZER_WORKERS = 0
# Batches (training and validation) between two `release_freed_memory` calls of `EpochEnd`.
# At the English LM of docs/measurements.md (15k vocabulary, batch 32, ~1 s a batch on 2
# cores) glibc kept up to ~0.5 GB a minute of freed memory: 20 batches hold it to a few
# hundred MB between trims, for a trim every ~20 s.
TRIM_EVERY_BATCHES = 20


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None on another platform or C library (musl, macOS)."""
    libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    if not sys.platform.startswith("linux") or not (libc or "").startswith("glibc"):
        log.debug("not glibc (%s, %s): freed memory is left to the allocator",
                  sys.platform, libc)
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError) as error:
        log.debug("glibc's malloc_trim unavailable (%s): freed memory is left to it", error)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Returns the memory this process freed but glibc kept to the system (`malloc_trim(0)`).

    The LM trainer's resident memory grew from 1.7 to 6.5 GB in its first epoch while it
    held ~1.4 GB: each batch frees large temporaries (activations, the softmax over the
    vocabulary), and glibc keeps freed blocks in its heaps (one per thread that allocates:
    torch's), where live blocks between them keep a heap from shrinking from its top (and
    glibc raises its mmap threshold as large blocks are freed, so later ones come from the
    heaps too). `malloc_trim(0)` hands every free page back (it brought that process to
    1.4 GB at once). Nothing lives in those pages, so this is safe at any time; elsewhere
    than glibc it does nothing.

    Returns:
        Whether glibc gave memory back (False where there is no glibc).
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


class EpochEnd(Callback):
    """Calls `on_epoch(epochs_done, values, seconds, cpu_seconds)` after each epoch a fit
    really trained: its wall-clock seconds, and the CPU seconds this process spent in it
    (all its threads; on a shared machine the wall clock also counts other processes').

    It also returns freed memory to the system (`release`, by default
    `release_freed_memory`) every `trim_every` batches, training and validation (by default
    `TRIM_EVERY_BATCHES`; 0: never), and at each epoch's end.
    """

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
        # fastai's Recorder keeps each training batch's smoothed loss as a 0-d tensor for
        # the whole fit: small blocks between each batch's large temporaries, which keep
        # glibc from reusing or returning the freed memory (the LM trainer's resident
        # memory grew ~2.5 MB a batch at a 12.6k vocabulary; flat with floats).
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


def quiet(learn):
    """Drops the progress bars (carriage-return noise in job logs); EpochEnd logs each epoch."""
    if hasattr(learn, "progress"):
        learn.remove_cb(ProgressCallback)
    learn.logger = noop
    return learn


def lm_batch_size(lengths: Sequence[int], bs: int) -> int:
    """Largest batch size <= bs whose token streams give a language model one batch.

    Args:
        lengths: Token count of each text.
        bs: The batch size asked for.
    """
    total = int(sum(lengths))
    # LMDataLoader cuts the corpus into bs streams of (total - 1) // bs tokens; it
    # needs at least 2 per stream (one input, one target).
    return max(1, min(bs, (total - 1) // 2))


def language_model_loaders(dsets, bs: int, val_bs: int, seq_len: int):
    """fastai's language model dataloaders over `dsets`, each text's token ids made once.

    fastai's LMDataLoader turns a text into token ids each time a sequence reads from it
    and keeps the last 2 (`cache=2`). Its batches read `bs` streams far apart in the
    corpus, so the 2 kept are never the next ones asked for: every epoch made every text's
    ids again, in Python, between GPU steps. On an H100 that was 78% of an AWD-LSTM epoch
    (500k tokens: 21 of 27 s making batches). Kept for every text, they take 8 bytes a
    token plus ~1.5 KB a text (~20 bytes a token at 120 tokens a text, ~54 at 32), beside
    the ~150 a token the tokenized texts hold already.

    Args:
        dsets: The `Datasets` of a language model `TextBlock` (train and validation).
        bs: Training batch size.
        val_bs: Validation batch size.
        seq_len: Tokens per sequence (BPTT).
    """
    # num_workers=0: worker processes fork the training process (threads running).
    return dsets.dataloaders(bs=bs, val_bs=val_bs, seq_len=seq_len, num_workers=0,
                             cache=max(len(dsets.train), len(dsets.valid), 1))


def precision_here(requested: bool) -> str:
    """`choose_precision` for the devices this process sees."""
    cuda = torch.cuda.is_available()
    return choose_precision(requested, cuda, torch.cuda.get_device_capability() if cuda else None)


def mixed_precision(learn, precision: str):
    """`learn` set to train in `precision` ("fp32" leaves it as it is)."""
    if precision == BF16:
        return learn.to_bf16()
    if precision == FP16:
        return learn.to_fp16()
    if precision != FP32:
        raise ValueError(f"precision must be one of {(FP32, FP16, BF16)}, got {precision!r}")
    return learn


def lm_learner(dls, arch_config: dict, drop_mult: float, folder: str, precision: str):
    """A quiet AWD-LSTM language model learner from scratch weights, checkpointing in `folder`.

    Args:
        dls: Language model dataloaders.
        arch_config: Full AWD_LSTM settings (`awd_lstm_lm_config` updated).
        drop_mult: Multiplier of every dropout.
        folder: Where `learn.save` and `save_encoder` write.
        precision: "fp32", "fp16" or "bf16" (see `choose_precision`).
    """
    learn = language_model_learner(dls, AWD_LSTM, config=arch_config, pretrained=False,
                                   drop_mult=drop_mult, metrics=[accuracy, Perplexity()],
                                   path=folder, model_dir=".")
    quiet(learn)
    return mixed_precision(learn, precision)


# What learning_rate=0 does, as the trainers' and pipelines' help says it: `python -m
# tools.signatures` writes it there with each trainer's bounds. Keep it `choose_rate`'s.
FOUND_RATE_HELP = ("0 finds it with fastai's lr_find: its valley, held to {bounds}; "
                   "without a valley, the bounds' geometric middle.")


def choose_rate(suggestions: Mapping[str, float], floor: float, ceiling: float,
                ) -> tuple[float, str]:
    """The peak rate to train with, from `lr_find`'s suggestions, and which rule gave it.

    `valley` (fastai's default suggestion since 2.5: the middle of the longest valley of
    the loss curve), held to [floor, ceiling]; the middle of the bounds when it is not a
    positive number. `steep` and `minimum` are recorded but not used: on a few dozen
    batches of real text they were the curve's noise (steep 6.3e-7 and 4.4e-5, minimum
    7.6e-8 on the docstring and Debian corpora, which left the classifier at 1e-4 learning
    nothing), while valley stayed within 8e-4..5e-3 on every curve seen.

    Args:
        suggestions: `{"valley", "minimum", "steep", "slide"}` from `lr_find`.
        floor: Smallest rate believed.
        ceiling: Largest rate believed.

    Returns:
        `(rate, rule)`, the rule naming what was used.
    """
    value = suggestions.get("valley", math.nan)
    if not value > 0:  # also NaN
        return (floor * ceiling) ** 0.5, "middle of the bounds (no usable valley)"
    if floor <= value <= ceiling:
        return float(value), "valley"
    return min(max(float(value), floor), ceiling), "valley, held to the bounds"


def sweep_length(training_steps: int) -> int:
    """How many batches `lr_find` sweeps for a model that trains for `training_steps`.

    fastai's 100, or the training's own steps when it takes fewer, but at least
    `LR_FIND_MIN_ITERATIONS`. On a small dataset 100 steps go round its few batches again
    and again: 60 reviews (3 batches of 16) made fastai's AWD-LSTM sweep for 81 s before
    training 12 epochs in 24 s. The rate found is held to its bounds either way, a window
    of 1.67x for a model trained whole (`train_text.schedule.found_rate_bounds`); a run
    with 100 steps or more sweeps as fastai does.
    """
    return max(LR_FIND_MIN_ITERATIONS, min(LR_FIND_ITERATIONS, training_steps))


def find_rate(learn, floor: float, ceiling: float, epochs: int) -> dict[str, float | str]:
    """Runs `lr_find` on `learn` as it is (frozen or not) and chooses a rate (`choose_rate`).

    Args:
        learn: The learner, frozen as the rate's first stage trains it.
        floor: Smallest rate believed.
        ceiling: Largest rate believed.
        epochs: Epochs the model trains for with the rate: the sweep is no longer than
            their batches (`sweep_length`).

    Returns:
        The four suggestions, `used` (the rate), `rule` (which suggestion it is) and
        `sweep` (the batches swept).
    """
    sweep = sweep_length(epochs * len(learn.dls.train))
    found = learn.lr_find(suggest_funcs=(valley, minimum, steep, slide), show_plot=False,
                          num_it=sweep)
    rates: dict[str, float | str] = {name: float(getattr(found, name))
                                     for name in ("valley", "minimum", "steep", "slide")}
    rates["used"], rates["rule"] = choose_rate(rates, floor, ceiling)
    rates["sweep"] = sweep
    log.info("lr_find: %s", rates)
    return rates
