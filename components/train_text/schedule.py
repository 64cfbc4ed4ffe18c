"""What to train in which order (stages, each one `fit_one_cycle` call), and the state that
resumes a run at `(stage, epochs_done)`. Pure logic, no fastai."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from components.common import run_state
from components.text_common.scores import finite
from components.train_text.contract import (
    BOUNDS_N_HID,
    MAX_FOUND_LR_HEAD,
    MAX_FOUND_LR_WHOLE,
    MIN_FOUND_LR,
    TextTrainingError,
)

STATE_FILE = "state.json"
STATE_VERSION = 1
VOCAB_FILE = "vocab.pkl"  # the classifier's vocabulary, saved once (training.py)
# The state file (`run_state.open_run`); a reused folder loses another run's files.
STATE = run_state.StateFile(STATE_FILE, TextTrainingError,
                            "other config, dataset or model folder", version=STATE_VERSION,
                            leftovers=(VOCAB_FILE,), leftover_suffixes=(".pth", ".pth.tmp"))
LM = "lm"
CLASSIFIER = "classifier"
# ULMFiT (Howard & Ruder 2018): the lower layer groups learn 2.6x slower than the one above.
LR_DECAY_PER_GROUP = 2.6
# Peak learning rate of each gradual-unfreezing stage, as a share of the base rate
# (the fastai ULMFiT recipe: 2e-2, 1e-2, 5e-3, then 1e-3 for everything).
_UNFREEZE_STEPS = (("classifier-head", -1, 1.0), ("classifier-top2", -2, 0.5),
                   ("classifier-top3", -3, 0.25))
_UNFROZEN_LR_SHARE = 0.05
# Fewer batches per epoch than this make gradual stages too short ("auto" then unfreezes all
# at once): on 14 batches, gradual test micro F1 0.07..0.49, all at once 0.68..0.72.
GRADUAL_MIN_BATCHES = 50


@dataclasses.dataclass(frozen=True)
class Stage:
    """One `fit_one_cycle` call."""

    name: str  # shown in logs and the state file
    model: str  # LM or CLASSIFIER
    epochs: int
    lr: float  # peak rate of the top layer group; 0: the rate lr_find finds, times lr_share
    freeze_to: int | None = None  # learn.freeze_to(freeze_to) first; None: unfreeze all
    discriminative: bool = False  # lower groups get lr / 2.6^depth (a slice of rates)
    lr_share: float = 1.0


def resolve_unfreeze(mode: str, batches_per_epoch: int) -> tuple[str, str]:
    """`("gradual" or "all", why)` for the `unfreeze` setting and an epoch's training batches."""
    if mode != "auto":
        return mode, f"unfreeze={mode}"
    if batches_per_epoch >= GRADUAL_MIN_BATCHES:
        return "gradual", (f"auto: {batches_per_epoch} batches per epoch >= "
                           f"{GRADUAL_MIN_BATCHES}, enough for one-epoch unfreezing stages")
    return "all", (f"auto: {batches_per_epoch} batches per epoch < {GRADUAL_MIN_BATCHES}, too "
                   "few for one-epoch unfreezing stages; everything trains from the start")


def plan_stages(lm_epochs: int, epochs: int, lm_lr: float, lr: float,
                pretrained: bool, unfreeze: str = "gradual") -> list[Stage]:
    """The stages of a run: the LM's, then the classifier's.

    Args:
        lm_epochs: Language model fine-tuning epochs; 0 skips the LM.
        epochs: Classifier epochs in all (at least 1).
        lm_lr: Peak rate of the unfrozen LM epochs (a pretrained LM's frozen first: 10x).
        lr: Peak rate of the classifier's first stage; 0 finds it with `lr_find`.
        pretrained: The LM starts from pretrained weights.
        unfreeze: "gradual" or "all" (`resolve_unfreeze` turns "auto" into one of them).

    Returns:
        With "gradual" and a learnt encoder, ULMFiT's stages: head, top 2 groups, top 3 (1
        epoch each, fewer epochs drop the middle ones), then everything; else one stage.
    """
    if unfreeze not in ("gradual", "all"):
        raise ValueError(f"unfreeze must be 'gradual' or 'all' here (resolve_unfreeze turns "
                         f"'auto' into one), got {unfreeze!r}")
    stages: list[Stage] = []
    if lm_epochs:
        if pretrained:
            stages.append(Stage("lm-head", LM, 1, lm_lr * 10, freeze_to=-1))
            if lm_epochs > 1:
                stages.append(Stage("lm-all", LM, lm_epochs - 1, lm_lr))
        else:
            stages.append(Stage("lm-all", LM, lm_epochs, lm_lr))
    if (pretrained or lm_epochs) and unfreeze == "gradual":
        gradual = _UNFREEZE_STEPS[:min(len(_UNFREEZE_STEPS), epochs - 1)]
        for i, (name, freeze_to, share) in enumerate(gradual):
            stages.append(Stage(name, CLASSIFIER, 1, lr * share, freeze_to=freeze_to,
                                discriminative=i > 0, lr_share=share))
        stages.append(Stage("classifier-all", CLASSIFIER, epochs - len(gradual),
                            lr * _UNFROZEN_LR_SHARE, discriminative=True,
                            lr_share=_UNFROZEN_LR_SHARE))
    else:
        stages.append(Stage("classifier-all", CLASSIFIER, epochs, lr))
    return stages


# A classifier that learnt nothing is trained again from where it started at this share of
# its rates, at most MAX_RESTARTS times (then the run goes on with what it has, and says so).
RESTART_RATE_SHARE = 0.25
MAX_RESTARTS = 2
# A language model whose best next-token accuracy is within this of always predicting the
# most frequent token learnt nothing from the texts' order (lm_learnt_nothing).
LM_ACCURACY_MARGIN = 0.02


def lm_learnt_nothing(rows: list[Mapping[str, Any]], unigram_accuracy: float) -> str | None:
    """Why the language model stages (their history `rows`) taught the encoder nothing, or
    None when they did: an AWD-LSTM from scratch on a few hundred texts can end predicting the
    most frequent token (`unigram_accuracy`: its share of the validation text) whatever came
    before; a classifier from that encoder learnt nothing."""
    accuracies = [r["accuracy"] for r in rows if finite(r.get("accuracy"))]
    if not accuracies:
        return None
    best = max(accuracies)
    if best > unigram_accuracy + LM_ACCURACY_MARGIN:
        return None
    return (f"best next-token accuracy {best:.4f} vs {unigram_accuracy:.4f} for always "
            "predicting the most frequent token")


def found_rate_bounds(stage: Stage, n_hid: int = BOUNDS_N_HID) -> tuple[float, float]:
    """[floor, ceiling] of a found rate for the stage that finds it (its model's first); a
    whole model's window scales with 1 / `n_hid` (as Adam's stable rate does), capped at
    the head's ceiling."""
    if stage.freeze_to is not None:
        return MIN_FOUND_LR, MAX_FOUND_LR_HEAD
    scale = BOUNDS_N_HID / max(1, n_hid)
    ceiling = min(MAX_FOUND_LR_WHOLE * scale, MAX_FOUND_LR_HEAD)
    return min(MIN_FOUND_LR * scale, ceiling), ceiling


def new_state() -> dict[str, Any]:
    """The state of a run that has trained nothing yet (`open_run` adds version, fingerprint)."""
    return {
        "stage": 0,          # index in the plan of the stage in progress
        "epochs_done": 0,    # epochs of that stage finished and checkpointed
        "vocab_saved": False,
        "encoder_saved": False,
        "lm_discarded": None,  # why the LM's encoder is not used (lm_learnt_nothing)
        "best": None,        # {"value", "stage", "epoch"} of the monitored metric
        "found_lr": {},      # model -> {"valley", "used"}: lr_find's, kept for a resume
        "history": [],       # one row per finished epoch
        "restarts": [],      # classifier runs that learnt nothing: reason, rate scale, epochs
        "stage_start": None,  # the classifier's first weights, which a restart goes back to
        "rate_scale": 1.0,   # of every classifier rate, lowered by each restart
        "gave_up": None,     # why, when the classifier learnt nothing even after restarts
        "finished": False,
    }


def improved(value: float, best: float | None, metric: str) -> bool:
    """Whether `value` of `metric` beats `best` (None: nothing to beat); losses, errors and
    perplexity improve downwards, other metrics upwards."""
    if best is None:
        return True
    lower = any(word in metric.lower() for word in ("loss", "error", "perplexity"))
    return value < best if lower else value > best
