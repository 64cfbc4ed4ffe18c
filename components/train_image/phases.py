"""The image trainer's phases: their plan, the optimizer they compile, their callbacks.

Two phases with pretrained weights: "head" trains only the new top on a frozen
base, then "fine_tune" unfreezes the top dense blocks at a lower learning rate.
Without pretrained weights there is nothing to protect, so one "full" phase trains
everything for `epochs + fine_tune_epochs` epochs at `learning_rate`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tf_keras

from components.common.hypertune import TrialReporter
from components.common.storage import push_mirrors
from components.train_image.contract import TrainConfig
from components.train_image.state import RunState

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One `model.fit` with its own trainable set and optimizer."""

    name: str  # "head", "fine_tune" or "full"; also the set_trainable phase
    epochs: int
    learning_rate: float  # for one replica


def plan_phases(config: TrainConfig) -> list[Phase]:
    """The phases to run, leaving out those with zero epochs."""
    if not config.pretrained:
        phases = [Phase("full", config.epochs + config.fine_tune_epochs, config.learning_rate)]
    else:
        phases = [Phase("head", config.epochs, config.learning_rate),
                  Phase("fine_tune", config.fine_tune_epochs, config.fine_tune_learning_rate)]
    return [p for p in phases if p.epochs > 0]


class EpochRecorder(tf_keras.callbacks.Callback):
    """Keeps each epoch's metrics in memory and (chief) in the run state; logs a line."""

    def __init__(self, state: RunState, phase: str):
        super().__init__()
        self.state = state
        self.phase = phase
        self.records: list[dict[str, Any]] = []

    def on_epoch_end(self, epoch, logs=None):
        record = {"epoch": int(epoch), **{k: float(v) for k, v in (logs or {}).items()}}
        self.records.append(record)
        self.state.record_epoch(self.phase, record)
        log.info("%s epoch %d: %s", self.phase, epoch,
                 ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))


class MirrorPush(tf_keras.callbacks.Callback):
    """Pushes the checkpoint and log folders where they mirror an object store (open-source
    Kubeflow), once the epoch's backup and logs are written: a retried pod resumes there."""

    def on_epoch_end(self, epoch, logs=None):
        push_mirrors()


class TrialReport(tf_keras.callbacks.Callback):
    """Reports the tuning metric after each epoch (epochs counted across both phases)."""

    def __init__(self, reporter: TrialReporter):
        super().__init__()
        self.reporter = reporter

    def on_epoch_end(self, epoch, logs=None):
        self.reporter.report(logs or {}, int(epoch) + 1)


def compile_model(model, learning_rate: float) -> None:
    """Compiles `model` for training: Adam at `learning_rate`, sparse cross-entropy, accuracy."""
    model.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )


def phase_callbacks(config: TrainConfig, state: RunState, phase: Phase,
                    recorder: EpochRecorder, tensorboard_dir: str, monitor: str) -> list:
    """The Keras callbacks of one phase's `model.fit`.

    Learning-rate reduction and early stopping on `monitor` (when configured), then
    `recorder`, the phase's BackupAndRestore, TensorBoard logs and the mirror push.
    """
    # Order matters: the LR change and early stopping of an epoch happen before its
    # metrics are recorded and before BackupAndRestore saves it.
    callbacks = []
    if config.reduce_lr_patience:
        callbacks.append(tf_keras.callbacks.ReduceLROnPlateau(
            monitor=monitor, factor=config.reduce_lr_factor,
            patience=config.reduce_lr_patience, min_lr=1e-7))
    if config.early_stopping_patience:
        callbacks.append(tf_keras.callbacks.EarlyStopping(
            monitor=monitor, patience=config.early_stopping_patience,
            restore_best_weights=True))
    callbacks += [
        recorder,
        tf_keras.callbacks.BackupAndRestore(backup_dir=state.backup_dir(phase.name)),
        tf_keras.callbacks.TensorBoard(log_dir=tensorboard_dir, histogram_freq=0,
                                       write_graph=False, profile_batch=0),
        MirrorPush(),
    ]
    return callbacks
