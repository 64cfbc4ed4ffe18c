"""The fastai text trainers hand memory they freed back to the system (issue 56 item 5):
the helper, the callback's trim points, and glibc's behaviour the fix relies on."""

import ctypes
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from fastai.data.core import DataLoaders
from fastai.learner import Learner
from torch.utils.data import DataLoader, TensorDataset

from components.common import fastai_text
from components.common.fastai_text import EpochEnd, quiet, release_freed_memory

GLIBC = sys.platform.startswith("linux") and \
    (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) / 1024


def test_release_applies_on_glibc_only(monkeypatch):
    fastai_text._malloc_trim.cache_clear()
    try:
        assert (fastai_text._malloc_trim() is not None) == GLIBC
        assert isinstance(release_freed_memory(), bool)
        fastai_text._malloc_trim.cache_clear()
        monkeypatch.setattr(fastai_text.os, "confstr", lambda name: "musl 1.2", raising=False)
        assert fastai_text._malloc_trim() is None
        assert release_freed_memory() is False
    finally:
        fastai_text._malloc_trim.cache_clear()


@pytest.mark.skipif(not GLIBC, reason="glibc's heaps")
def test_freed_heap_blocks_stay_resident_until_released():
    """What the trainer's heap did, small: blocks freed between live ones stay resident
    (a heap shrinks only from its top) until malloc_trim returns their pages."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 100 * 1024, 2000  # under glibc's least mmap threshold: from the heap
    blocks = []
    try:
        for _ in range(2 * count):
            blocks.append(libc.malloc(size))
            ctypes.memset(blocks[-1], 1, size)  # resident
        release_freed_memory()
        before = _rss_mb()
        for block in blocks[::2]:  # every other one: each freed block between live ones
            libc.free(block)
        on_free = before - _rss_mb()  # what free() returned
        assert release_freed_memory() is True
        on_release = before - _rss_mb()
    finally:
        for block in blocks[1::2]:
            libc.free(block)
    freed = size * count / 2 ** 20  # ~195 MB
    assert on_free < 0.2 * freed, (on_free, on_release)
    assert on_release > 0.8 * freed, (on_free, on_release)


class _Learn(SimpleNamespace):
    """What EpochEnd reads of a fastai Learner."""


def _fake(training=True):
    return _Learn(training=training, recorder=SimpleNamespace(losses=[], metric_names=[
        "epoch", "train_loss", "valid_loss"]), final_record=[1.0, 2.0], epoch=0, n_epoch=1)


def _epoch(cb: EpochEnd, training: int, validation: int = 0) -> None:
    """One epoch of `cb` on a fake learner; no training batch: one SkipToEpoch jumped over."""
    cb.learn = _fake()
    cb.before_epoch()
    for batch in range(training + validation):
        cb.learn.training = batch < training  # validation batches count too
        cb.after_batch()
    if training:
        cb.after_train()
    cb.after_epoch()


def test_epoch_end_releases_every_n_batches_and_at_each_epoch_end():
    calls, epochs = [], []
    cb = EpochEnd(lambda *args: epochs.append(args), trim_every=3,
                  release=lambda: calls.append(cb.batches))
    _epoch(cb, 7, 2)
    assert calls == [3, 6, 9, 9]  # the last at the epoch's end
    assert len(epochs) == 1


def test_epoch_end_releases_nothing_when_off_or_skipped():
    calls = []
    _epoch(EpochEnd(lambda *args: None, trim_every=0, release=lambda: calls.append("off")), 50)
    _epoch(EpochEnd(lambda *args: None, trim_every=3, release=lambda: calls.append("skip")), 0)
    assert calls == []  # off; an epoch skipped on resume: no batch, no trim


def test_a_fit_releases_through_the_default(monkeypatch):
    """Both trainers construct `EpochEnd(on_epoch)`: its defaults are read when it is made."""
    calls = []
    monkeypatch.setattr(fastai_text, "TRIM_EVERY_BATCHES", 4)
    monkeypatch.setattr(fastai_text, "release_freed_memory", lambda: calls.append(1))
    x = torch.randn(64, 3)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    dls = DataLoaders(DataLoader(data, batch_size=8), DataLoader(data, batch_size=16))
    learn = quiet(Learner(dls, torch.nn.Linear(3, 1), loss_func=torch.nn.MSELoss()))
    epochs = []
    learn.fit(2, 1e-2, cbs=[EpochEnd(lambda *args: epochs.append(args))])
    # per epoch 8 training + 4 validation batches: trims at every 4th batch (6) + 2 epoch ends
    assert len(epochs) == 2
    assert len(calls) == 24 // 4 + 2
