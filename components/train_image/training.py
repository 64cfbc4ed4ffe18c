"""Train the image classifier on a sharded dataset: the driver, its callbacks, its resume state.

Pretrained: a "head" phase on the frozen base, then "fine_tune" of the top blocks; from
scratch, one "full" phase. Epochs are numbered across phases (one TensorBoard curve).

Restarts resume from the last backup (epoch end, SIGTERM step, `checkpoint_every_steps`).
Under `checkpoint_dir`: run.json (the run's fingerprint), backup-<phase>/ (BackupAndRestore),
history-<phase>.json, <phase>.weights.npz and, last, <phase>.done.json. Finished phases are
loaded and skipped; all is deleted once exported.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from components.common import preemption, run_state
from components.common.gpus import require_tensorflow_gpus
from components.common.hypertune import TrialReporter
from components.common.storage import (
    filesystem,
    is_remote,
    local_path,
    push_mirrors,
    read_json,
    run_folder,
    write_json_atomically,
)
from components.shard.contract import read_manifest
from components.train_image import distribute
from components.train_image.artifact import write_artifact
from components.train_image.contract import TrainConfig, TrainingError, normalize_weights
from components.train_image.model import (
    Phase,
    architecture,
    build_model,
    compile_model,
    dtype_policy,
    load_snapshot,
    plan_phases,
    set_trainable,
    train_input,
    validation_input,
    weight_snapshot,
)

log = logging.getLogger(__name__)


def resolve_dirs(model_dir: str, checkpoint_dir: str | None = None,
                 tensorboard_dir: str | None = None,
                 environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """Checkpoint and TensorBoard folders: the given ones, else this task's sub-folder of
    AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR (gs:// through /gcs/).

    Args:
        model_dir: The step's model folder (names the task's sub-folder).
        checkpoint_dir, tensorboard_dir: Explicit folders; None/"": the environment's.
        environ: Environment to read; default `os.environ`.

    Returns:
        `(checkpoint_dir, tensorboard_dir)`; None where neither is set.
    """
    return (local_path(checkpoint_dir) if checkpoint_dir
            else run_folder("AIP_CHECKPOINT_DIR", model_dir, None, environ),
            local_path(tensorboard_dir) if tensorboard_dir
            else run_folder("AIP_TENSORBOARD_LOG_DIR", model_dir, None, environ))


def fetch_weights(weights: str | None, workdir: str) -> str | None:
    """"imagenet", None or a local path for a weights setting (gs:// copied into `workdir`)."""
    weights = normalize_weights(weights)
    if weights is None or weights == "imagenet" or not is_remote(weights):
        return weights
    fs, path = filesystem(weights)
    local = os.path.join(workdir, os.path.basename(path.rstrip("/")) or "weights.h5")
    log.info("copying weights %s to %s", weights, local)
    fs.get(path, local)
    return local


def train(
    dataset_dir: str,
    output_dir: str,
    config: TrainConfig,
    checkpoint_dir: str | None = None,
    tensorboard_dir: str | None = None,
    *,
    strategy: tf.distribute.Strategy | None = None,
    callbacks: Sequence[tf_keras.callbacks.Callback] = (),
    hypertune_metric: str | None = None,
    serving: bool = True,
) -> dict[str, Any]:
    """Trains the classifier and writes the model artifact.

    Args:
        dataset_dir: Folder written by the sharding step.
        output_dir: Folder for the artifact (`write_artifact`); the chief alone writes it.
        config: How to train.
        checkpoint_dir, tensorboard_dir: Resume state (shared by all workers) and the
            chief's logs; default `<output_dir>/checkpoints`, `<output_dir>/tensorboard`.
        strategy: Instead of the one chosen from TF_CONFIG / CLUSTER_SPEC and the GPUs.
        callbacks: Extra tf-keras callbacks, run after the built-in ones each phase.
        hypertune_metric: The epoch value a Vertex tuning trial reports; None: nothing.
        serving: False leaves saved_model/ out.

    Returns:
        Final metrics and facts of the run (`_metrics`), optimizer_steps included.

    Raises:
        TrainingError: Bad settings, an empty train split, or another run's checkpoints.
        FileNotFoundError: The dataset folder is not a complete sharded dataset.
    """
    require_tensorflow_gpus()  # before anything is read
    strategy = (run := _start(config, strategy)).strategy
    data = _read_inputs(dataset_dir, config, run)
    state = RunState(checkpoint_dir or os.path.join(output_dir, "checkpoints"), run.chief)
    shards = {split: [s["sha256"] for s in info["shards"]]
              for split, info in data.manifest["splits"].items()}
    state.claim({"config": dataclasses.asdict(config), "classes": data.classes,
                 "shards": shards, "replicas": run.replicas},
                {"config": dataclasses.asdict(config), "replicas": run.replicas})
    phases = plan_phases(config)
    finished = {p.name: state.finished(p.name) for p in phases}  # from an earlier attempt
    log.info("training on %d examples of %d classes: strategy %s, %d replica(s), global "
             "batch %d, %d steps/epoch, precision %s, phases %s", data.train_count,
             len(data.classes), run.kind, run.replicas, run.global_batch, data.steps,
             run.precision, [p.name for p in phases])
    trial = TrialReporter(hypertune_metric)
    history: dict[str, list[dict[str, Any]]] = {}
    epoch = optimizer_steps = 0
    with (dtype_policy(run.precision), tempfile.TemporaryDirectory() as workdir,
          preemption.Notice() as notice):
        weights = fetch_weights(config.weights, workdir)
        with strategy.scope():
            model = build_model(len(data.classes), data.image_size, weights, config.dropout,
                                architecture=config.architecture)
        # Other workers' logs stay local: a killed worker's must not ship with the model.
        log_dir = (tensorboard_dir or os.path.join(output_dir, "tensorboard")) if run.chief \
            else os.path.join(workdir, "tensorboard")
        for phase in phases:
            with strategy.scope():
                set_trainable(model, phase.name, config.unfreeze_blocks)
            if (marker := finished[phase.name]) is not None:
                with strategy.scope():
                    load_snapshot(model, state.finished_weights(phase.name))
                log.info("phase %s finished in an earlier attempt: weights loaded", phase.name)
                done = marker["history"], marker["next_epoch"], marker.get("optimizer_steps", 0)
            else:
                done = _fit(model, phase, epoch, run, data, state, [*_callbacks(
                    config, state, phase.name, data, log_dir, trial, notice, run), *callbacks])
            history[phase.name], epoch, steps = done
            optimizer_steps += steps
        if None not in finished.values():  # every phase finished earlier: compile to evaluate
            with strategy.scope():
                compile_model(model, phases[-1].learning_rate * run.replicas)
        final = {}
        if data.validation is not None:
            final = model.evaluate(data.validation, verbose=0, return_dict=True)
        snapshot = weight_snapshot(model)
    metrics = {**_metrics(run, data, phases, history, final, epoch, architecture(model)),
               "optimizer_steps": optimizer_steps}
    if run.chief:
        write_artifact(output_dir, snapshot, data.manifest, config, history, metrics,
                       serving=serving)
        state.clear([p.name for p in phases])
    if (sum_over_workers := _sum_over_workers(strategy)) is not None:
        sum_over_workers(1)  # barrier: a worker gone while the chief writes reads as crashed
    log.info("finished: %s", metrics)
    return metrics


@dataclasses.dataclass(frozen=True)
class _Run:
    """Where the run trains: its strategy and what follows from it."""

    strategy: tf.distribute.Strategy
    kind: str
    precision: str
    chief: bool
    replicas: int
    global_batch: int


def _start(config: TrainConfig, strategy: tf.distribute.Strategy | None) -> _Run:
    """The strategy (before any TensorFlow op: MultiWorkerMirroredStrategy), precision, batch."""
    if strategy is None:
        kind, precision = distribute.prepare_environment(config.precision)
        strategy = distribute.make_strategy(kind)
    else:
        kind = distribute.strategy_kind_of(strategy)
        precision = distribute.choose_precision(config.precision,
                                                distribute.gpu_compute_capabilities())
    replicas = strategy.num_replicas_in_sync
    # TensorFlow's chief: "chief", else worker 0 of a cluster without one (its BackupAndRestore's)
    return _Run(strategy, kind, precision, strategy.extended.should_checkpoint, replicas,
                config.batch_size * replicas)


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The sharded dataset and the input pipelines read from it."""

    manifest: dict[str, Any]
    classes: list[str]
    image_size: int
    train_count: int
    validation_count: int
    steps: int  # per epoch
    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    monitor: str  # what the LR schedule and early stopping watch


def _read_inputs(dataset_dir: str, config: TrainConfig, run: _Run) -> _Inputs:
    """Reads the manifest and builds the train and validation pipelines."""
    manifest = read_manifest(dataset_dir)
    splits = manifest["splits"]
    train_count, validation_count = splits["train"]["count"], splits["validation"]["count"]
    if train_count == 0:
        raise TrainingError(f"the train split of {dataset_dir!r} is empty")
    batch = run.global_batch
    tf_keras.utils.set_random_seed(config.seed)
    train_data = train_input(dataset_dir, manifest, config, batch)
    even_batches = run.replicas > 1 and not distribute.gpu_compute_capabilities()
    if even_batches and validation_count % batch:
        log.warning("several CPU replicas: validation uses whole batches only, %d of %d "
                    "examples are left out", validation_count % batch, validation_count)
    validation, monitor = None, "loss"
    if validation_count and (not even_batches or validation_count >= batch):
        validation = validation_input(dataset_dir, manifest, config, batch, even_batches)
        monitor = "val_loss"
    else:
        log.warning("no validation batch: early stopping and the LR schedule watch the "
                    "training loss, and no validation metrics are reported")
    return _Inputs(manifest, manifest["classes"], manifest["image"]["height"], train_count,
                   validation_count, config.steps_per_epoch or math.ceil(train_count / batch),
                   train_data, validation, monitor)


def _callbacks(config: TrainConfig, state: RunState, phase: str, data: _Inputs, log_dir: str,
               trial: TrialReporter, notice: preemption.Notice, run: _Run,
               ) -> list[tf_keras.callbacks.Callback]:
    """A phase's built-in callbacks; LR and early stopping before the epoch's record/backup."""
    built_in: list[tf_keras.callbacks.Callback] = []
    if config.reduce_lr_patience:
        built_in.append(tf_keras.callbacks.ReduceLROnPlateau(
            monitor=data.monitor, factor=config.reduce_lr_factor,
            patience=config.reduce_lr_patience, min_lr=1e-7))
    if config.early_stopping_patience:
        built_in.append(tf_keras.callbacks.EarlyStopping(
            monitor=data.monitor, patience=config.early_stopping_patience,
            restore_best_weights=True))
    return [
        *built_in,
        tf_keras.callbacks.LambdaCallback(
            on_epoch_end=lambda done, logs: state.record_epoch(phase, done, logs)),
        Backup(state.path(f"backup-{phase}"), notice, config.checkpoint_every_steps,
               _sum_over_workers(run.strategy)),
        tf_keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=0,
                                       write_graph=False, profile_batch=0),
        # Mirrored folders (open-source Kubeflow) pushed after the epoch's backup and logs.
        tf_keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: push_mirrors()),
        tf_keras.callbacks.LambdaCallback(
            on_epoch_end=lambda done, logs: trial.report(logs or {}, int(done) + 1)),
    ]


def _fit(model: tf_keras.Model, phase: Phase, epoch: int, run: _Run, data: _Inputs,
         state: RunState, callbacks: list[tf_keras.callbacks.Callback],
         ) -> tuple[list[dict[str, Any]], int, int]:
    """Trains and seals one phase from `epoch`: (its records, next epoch, optimizer steps)."""
    learning_rate = phase.learning_rate * run.replicas  # linear scaling rule
    with run.strategy.scope():
        compile_model(model, learning_rate)
    log.info("phase %s: epochs %d-%d, learning rate %g", phase.name, epoch,
             epoch + phase.epochs - 1, learning_rate)
    fitted = model.fit(data.train, epochs=epoch + phase.epochs, initial_epoch=epoch,
                       steps_per_epoch=data.steps, validation_data=data.validation,
                       callbacks=callbacks, verbose=0)  # its History: this attempt's epochs
    # No epoch run here: BackupAndRestore found the phase already at its end.
    next_epoch = fitted.epoch[-1] + 1 if fitted.epoch else epoch + phase.epochs
    history = state.history(phase.name) if run.chief else [
        _record(done, {k: v[i] for k, v in fitted.history.items()})
        for i, done in enumerate(fitted.epoch)]
    steps = int(model.optimizer.iterations.numpy())
    state.finish(phase.name, weight_snapshot(model),  # every worker: may all-reduce
                 {"history": history, "next_epoch": next_epoch,
                  "epochs_run": next_epoch - epoch, "optimizer_steps": steps})
    return history, next_epoch, steps


def _metrics(run: _Run, data: _Inputs, phases: Sequence[Phase],
             history: dict[str, list[dict[str, Any]]], final: dict[str, float], epoch: int,
             architecture_name: str) -> dict[str, Any]:
    """The run's metrics and facts, None values left out."""
    last = next((records[-1] for records in reversed(history.values()) if records), {})
    metrics = {
        "train_loss": last.get("loss"),
        "train_accuracy": last.get("accuracy"),
        "val_loss": final.get("loss"),
        "val_accuracy": final.get("accuracy"),
        "epochs_run": epoch,
        **{f"{name}_epochs": len(records) for name, records in history.items()},
        "replicas": run.replicas,
        "global_batch_size": run.global_batch,
        "steps_per_epoch": data.steps,
        "learning_rate": phases[0].learning_rate * run.replicas,
        "precision": run.precision,
        "strategy": run.kind,
        "num_classes": len(data.classes),
        "classes": list(data.classes),
        "image_size": data.image_size,
        "train_examples": data.train_count,
        "validation_examples": data.validation_count,
        "framework": f"tf-keras {tf_keras.__version__}",
        "architecture": architecture_name,
    }
    return {k: v for k, v in metrics.items() if v is not None}


def _sum_over_workers(strategy: tf.distribute.Strategy):
    """The sum of an int over every worker (`preemption.any_rank`); None in one process."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    # traced once: run eagerly, the all-reduce of each step took longer than a tiny step
    summed = tf.function(lambda value: strategy.reduce(
        tf.distribute.ReduceOp.SUM, strategy.run(lambda: value), axis=None))
    return lambda value: int(summed(tf.constant(value)))  # each worker's own value


class Backup(tf_keras.callbacks.BackupAndRestore):
    """BackupAndRestore at each epoch's end, at a SIGTERM's step (then `preemption.Preempted`)
    and every `every_steps` steps; a mid-epoch resume draws a new shuffle of that epoch.
    """

    def __init__(self, backup_dir: str, notice: preemption.Notice, every_steps: int,
                 sum_over_workers):
        super().__init__(backup_dir, save_freq=every_steps or sys.maxsize)
        self.notice, self.sum_over_workers = notice, sum_over_workers
        self.epoch, self.first_step = 0, None

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        super().on_train_batch_begin(batch, logs)
        if self.first_step is None:  # this process's first step: where it resumed
            self.first_step = batch
            if batch:
                log.info("resumed mid-epoch: epoch %d from step %d", self.epoch, batch)

    def on_train_batch_end(self, batch, logs=None):
        stop = preemption.any_rank(self.notice.requested, self.sum_over_workers)
        self._saving_as(1 if stop else self.save_freq, super().on_train_batch_end, batch, logs)
        if stop:  # backed up by every worker, the chief's copy kept
            push_mirrors()
            raise preemption.Preempted(f"in {self.backup_dir} at epoch {self.epoch} "
                                       f"step {batch}")

    def on_epoch_end(self, epoch, logs=None):
        self._saving_as("epoch", super().on_epoch_end, epoch, logs)

    def _saving_as(self, save_freq, hook, *args) -> None:
        """Runs the base's `hook` as if made with `save_freq` (1: this step; "epoch")."""
        every, self.save_freq = self.save_freq, save_freq
        try:
            hook(*args)
        finally:
            self.save_freq = every


def _record(epoch: int, logs: Mapping[str, Any] | None) -> dict[str, Any]:
    """One epoch's metrics as the history holds them."""
    return {"epoch": int(epoch), **{k: float(v) for k, v in (logs or {}).items()}}


RUN_FILE = "run.json"  # marks the folder's owner only
RUN = run_state.StateFile(RUN_FILE, TrainingError, "other config, dataset or number of replicas",
                          marker=True, sort_keys=True, digits=64)


class RunState:
    """The resume state under the checkpoint folder (module docstring); the chief writes."""

    def __init__(self, root: str, chief: bool):
        self.root, self.chief = root, chief

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def claim(self, values: dict[str, Any], description: dict[str, Any]) -> None:
        """Records the run's fingerprint (`values`, hashed; `description`, for people), or
        fails if the folder holds another run."""
        if run_state.open_run(self.root, RUN, values, fresh=description,
                              write=self.chief).resumed:
            log.info("checkpoint folder %s belongs to this run: finished work is reused",
                     self.root)

    def finished(self, phase: str) -> dict[str, Any] | None:
        """The marker of a finished phase, or None."""
        return read_json(self.path(f"{phase}.done.json"), optional=True)

    def finished_weights(self, phase: str) -> dict[str, np.ndarray]:
        with np.load(self.path(f"{phase}.weights.npz"), allow_pickle=False) as data:
            return {key: data[key] for key in data.files}

    def finish(self, phase: str, snapshot: dict[str, np.ndarray],
               marker: dict[str, Any]) -> None:
        """Saves a finished phase: weights first, then the marker that vouches for them."""
        if self.chief:
            path = self.path(f"{phase}.weights.npz")
            with open(path + ".tmp", "wb") as f:
                np.savez(f, **snapshot)
            os.replace(path + ".tmp", path)
            write_json_atomically(self.path(f"{phase}.done.json"), marker)

    def history(self, phase: str) -> list[dict[str, Any]]:
        return read_json(self.path(f"history-{phase}.json"), optional=True) or []

    def record_epoch(self, phase: str, epoch: int, logs: Mapping[str, Any] | None) -> None:
        """Logs one epoch's metrics and (chief) adds them to the phase's history; a redone
        epoch replaces its earlier record."""
        record = _record(epoch, logs)
        log.info("%s epoch %d: %s", phase, epoch,
                 ", ".join(f"{k}={v:.4g}" for k, v in record.items() if k != "epoch"))
        if self.chief:
            records = [r for r in self.history(phase) if r["epoch"] != record["epoch"]]
            write_json_atomically(self.path(f"history-{phase}.json"),
                                  sorted([*records, record], key=lambda r: r["epoch"]))

    def clear(self, phases: Sequence[str]) -> None:
        """Deletes the state once the model is exported (and the folder if left empty)."""
        if self.chief:
            run_state.remove_leftovers(self.root, tuple(name for phase in phases for name in (
                f"backup-{phase}", f"history-{phase}.json", f"{phase}.weights.npz",
                f"{phase}.done.json")))
            # The run file last: finished phases never outlive their owner.
            run_state.remove_leftovers(self.root, (RUN_FILE,))
            if os.path.isdir(self.root) and not os.listdir(self.root):
                os.rmdir(self.root)
