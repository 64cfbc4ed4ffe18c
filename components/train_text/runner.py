"""The stage runner (the plan, state file and checkpoints of one run) and `TrainingJob`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pandas as pd
from fastai.learner import load_model
from fastai.text.all import Callback, GradientClip, load_pickle, save_pickle

from components.common import run_state
from components.common.fastai_text import (
    find_rate,
    fit_sealed,
    load_checkpoint,
    save_checkpoint,
    seal,
)
from components.common.hypertune import TrialReporter
from components.common.tensorboard import ScalarLog, epoch_scalars, model_step
from components.text_common import scores as text_scores
from components.train_text import schedule
from components.train_text.assets import LMAssets
from components.train_text.contract import TrainConfig
from components.train_text.data import PreparedDataset

log = logging.getLogger(__name__)

# Largest gradient norm of a step (AWD-LSTM's recipe clips too): one bad batch at the
# peak rate cannot throw the LSTM into saturation, the collapse seen on real text.
GRADIENT_CLIP = 1.0


class StageRunner:
    """Runs the stages of one run's plan, keeping its state file and checkpoints."""

    def __init__(self, resume: run_state.Resume, plan: list[schedule.Stage],
                 monitor: str, callbacks: Sequence[Callback], tensorboard: ScalarLog,
                 trial: TrialReporter, constant: dict[str, float] | None = None,
                 n_hid: int = schedule.BOUNDS_N_HID, every_steps: int = 0):
        self.resume, self.plan = resume, plan
        self.folder, self.state = resume.folder, resume.state
        self.path, self.save = resume.path, resume.save  # a file's path; writes the state
        self.monitor, self.callbacks = monitor, list(callbacks)
        self.tensorboard, self.trial = tensorboard, trial
        self.constant = constant  # text_scores.constant_answer
        self.n_hid, self.every_steps = n_hid, every_steps  # n_hid scales the rate bounds
        self.step: dict | None = None  # the mid-epoch step `restore` loaded

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

    def _drop(self, name: str | None, keep: str | None) -> None:
        """Removes checkpoint `name` unless it is `keep` or the restarts' start weights."""
        self.resume.drop(name, keep, (self.state.get("stage_start") or {}).get("file"))

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
        start = self.state["epochs_done"] if self.state["stage"] == index else 0
        if self.state["stage"] > index or start >= stage.epochs:
            return
        if start == 0 and stage.model == schedule.CLASSIFIER and \
                self.state.get("stage_start") is None:
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
            *schedule.found_rate_bounds(stage, self.n_hid),
            sum(s.epochs for s in self.plan if s.model == stage.model))) * \
            (self.state.get("rate_scale", 1.0) if stage.model == schedule.CLASSIFIER else 1.0)
        lr = top if not stage.discriminative else \
            slice(top / schedule.LR_DECAY_PER_GROUP ** (len(learn.opt.param_groups) - 1), top)
        log.info("stage %s: epochs %d..%d of %d", stage.name, start + 1, stage.epochs, stage.epochs)

        def sealed(name: str, epochs_done: int, steps: int, step: dict | None = None) -> str:
            # Older files go only once the state no longer points at them (`seal`).
            return seal(self.resume, self.state, learn, name, step,
                        ((self.state.get("stage_start") or {}).get("file"),), stage=index,
                        epochs_done=epochs_done, optimizer_steps=steps)

        def on_epoch(steps: int, epochs_done: int, values: dict[str, float], seconds: float,
                     cpu_seconds: float) -> None:
            best = self.state["best"]
            new_best = None
            if stage.model == schedule.CLASSIFIER and self.monitor in values and \
                    schedule.improved(values[self.monitor], best and best["value"], self.monitor):
                new_best = f"best-{index}-{epochs_done}.pth"
                save_checkpoint(learn, self.path(new_best), with_opt=False)
                self.state["best"] = {"value": values[self.monitor], "stage": stage.name,
                                      "epoch": epochs_done, "file": new_best}
            row = {"stage": stage.name, "model": stage.model, "epoch": epochs_done,
                   "seconds": round(seconds, 3), "cpu_seconds": round(cpu_seconds, 3), **values}
            self.state["history"].append(row)
            sealed(f"{stage.model}-{index}-{epochs_done}.pth", epochs_done, steps)
            # After the save: a resumed run never trains (and logs) this epoch again.
            step = model_step(self.state["history"], stage.model)
            self.tensorboard.write(epoch_scalars(stage.model, row), step)
            if stage.model == schedule.CLASSIFIER:  # the study ranks classifiers
                self.trial.report(values, step)
            if new_best and best:
                self._drop(best.get("file"), new_best)

        fit_sealed(learn, stage.epochs, lr, start, on_epoch, lambda step: sealed(
            f"{stage.model}-{index}-{step['epoch']}-{step['batches']}.pth", step["epoch"],
            step["steps"], step), resumed, self.every_steps, self.state.get("optimizer_steps", 0),
            [GradientClip(GRADIENT_CLIP), *self.callbacks])


@dataclasses.dataclass
class TrainingJob:
    """What the stages of one `train_text_classifier` call share."""

    data: PreparedDataset
    config: TrainConfig
    run: StageRunner
    assets: LMAssets | None  # the pretrained LM's local files, when pretrained
    arch_config: dict[str, Any]  # the AWD-LSTM settings given (config.json or model_config)
    lm_config: dict[str, Any]  # fastai's defaults updated with them
    tokenizer: Any
    precision: str
    frame: pd.DataFrame  # what fastai reads (data.fastai_frame), texts clipped
    truncated: int  # texts that were clipped
    resumed_from: dict[str, Any] | None
    unfreeze: tuple[str, str]  # (mode used, why)

