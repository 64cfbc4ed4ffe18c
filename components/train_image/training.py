"""Train the DenseNet image classifier on a sharded dataset: the driver, the callbacks of
its phases, and its resume state.

Two phases with pretrained weights: "head" trains only the new top on a frozen
base, then "fine_tune" unfreezes the top dense blocks at a lower learning rate.
Without pretrained weights there is nothing to protect, so one "full" phase trains
everything for `epochs + fine_tune_epochs` epochs at `learning_rate`.
Epochs are numbered across phases (fine-tuning continues the head's count), so
TensorBoard shows one continuous curve. The model, its phases' plan and the input
pipelines are in `model`, the artifact writing in `artifact`.

Restarts (Vertex may restart a worker at any time) resume from the last finished
epoch. Under `checkpoint_dir`:
  run.json                 fingerprint of config + dataset + replicas; a different
                           run refuses to resume someone else's state
  backup-<phase>/          tf-keras BackupAndRestore of the running phase (weights,
                           optimizer, epoch); one folder per phase because each phase
                           has its own optimizer and trainable set
  history-<phase>.json     per-epoch metrics so far (survives restarts)
  <phase>.weights.npz      the phase's final weights (after EarlyStopping restored the
                           best ones), then
  <phase>.done.json        the marker, written last: the phase is finished
A restarted run loads the weights of finished phases, skips them, and lets
BackupAndRestore resume the unfinished one. Everything here is deleted once the
model is exported.

Keras: tf-keras everywhere, see `components.train_image.model` for why.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
import tf_keras

from components.common import run_state
from components.common.gpus import require_tensorflow_gpus
from components.common.hypertune import TrialReporter
from components.common.storage import (
    filesystem,
    is_remote,
    local_path,
    push_mirrors,
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
    read_snapshot,
    save_snapshot,
    set_trainable,
    train_input,
    validation_input,
    weight_snapshot,
)

log = logging.getLogger(__name__)


def resolve_dirs(model_dir: str, checkpoint_dir: str | None = None,
                 tensorboard_dir: str | None = None,
                 environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """Checkpoint and TensorBoard folders: the given ones, else Vertex's for this task.

    Vertex sets AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR when the job has a
    base output directory; every run shares them, so this task's own sub-folder is
    used (`storage.run_folder`).

    Args:
        model_dir: The step's model output folder (names the task's sub-folder).
        checkpoint_dir: Explicit folder, or None/"" for the environment's.
        tensorboard_dir: Explicit folder, or None/"" for the environment's.
        environ: Environment to read; default `os.environ`, read now.

    Returns:
        `(checkpoint_dir, tensorboard_dir)`; None where neither is set (`train`
        then uses folders inside its output folder).
    """
    # gs:// is written through the /gcs/ FUSE mount, like everything else here.
    return (local_path(checkpoint_dir) if checkpoint_dir
            else run_folder("AIP_CHECKPOINT_DIR", model_dir, None, environ),
            local_path(tensorboard_dir) if tensorboard_dir
            else run_folder("AIP_TENSORBOARD_LOG_DIR", model_dir, None, environ))


def fetch_weights(weights: str | None, workdir: str) -> str | None:
    """Makes a weights setting loadable: gs:// files are copied into `workdir`.

    Args:
        weights: "imagenet", "none"/None, a local path or a gs:// URI.
        workdir: Local folder for the copy.

    Returns:
        "imagenet", None, or a local file path.
    """
    weights = normalize_weights(weights)
    if weights is None or weights == "imagenet" or not is_remote(weights):
        return weights
    fs, path = filesystem(weights)
    local = os.path.join(workdir, os.path.basename(path.rstrip("/")) or "weights.h5")
    log.info("copying weights %s to %s", weights, local)
    fs.get(path, local)
    return local


# --------------------------------------------------------------------------- training


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What `train` settles before it builds the model: distribution, data, resume state."""

    strategy: tf.distribute.Strategy
    kind: str  # distribute's name of the strategy
    precision: str
    chief: bool
    replicas: int
    global_batch: int
    steps: int  # per epoch
    manifest: dict[str, Any]
    state: RunState
    phases: list[Phase]
    finished: dict[str, dict[str, Any] | None]  # phase -> its marker from an earlier attempt

    @property
    def classes(self) -> list[str]:
        return self.manifest["classes"]

    @property
    def image_size(self) -> int:
        return self.manifest["image"]["height"]

    def count(self, split: str) -> int:
        return self.manifest["splits"][split]["count"]


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The input pipelines and the value the LR schedule and early stopping watch."""

    train: tf.data.Dataset
    validation: tf.data.Dataset | None
    monitor: str  # "val_loss", or "loss" without a validation batch


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
        dataset_dir: Folder written by the sharding step (`manifest.json` + shards).
        output_dir: Folder for the artifact: model.keras, saved_model/, labels.json,
            preprocessing.json, history.json. Only the chief worker writes here.
        config: How to train.
        checkpoint_dir: Folder of the resume state; default `<output_dir>/checkpoints`.
            Must be shared by all workers (gs:// on Vertex).
        tensorboard_dir: TensorBoard logs; default `<output_dir>/tensorboard`. Written by
            the chief only (other workers log to their local disk, then delete it).
        strategy: A strategy to use instead of the one chosen from TF_CONFIG /
            CLUSTER_SPEC and the GPUs (tests use this for logical devices).
        callbacks: Extra tf-keras callbacks, run after the built-in ones each phase.
        hypertune_metric: In a Vertex tuning trial, the epoch value reported to the
            tuning service after each epoch (e.g. "val_accuracy"); None reports nothing.
        serving: False leaves saved_model/ out of the artifact: a model kept for its
            weights alone (tools.datamakers.glyph_start).

    Returns:
        Final metrics and facts of the run: train_loss, train_accuracy (last epoch),
        val_loss, val_accuracy (final model on the validation split), epochs_run,
        <phase>_epochs, replicas, global_batch_size, steps_per_epoch, learning_rate
        (scaled), precision, strategy, num_classes, classes (label index order),
        image_size, train_examples, validation_examples, framework, architecture
        (e.g. "DenseNet121").

    Raises:
        TrainingError: Bad settings, or a checkpoint folder of another run.
        FileNotFoundError: The dataset folder is not a complete sharded dataset.
    """
    require_tensorflow_gpus()  # before anything is read: a job without its GPUs ends now
    setup = _prepare(dataset_dir, output_dir, config, checkpoint_dir, strategy)
    tensorboard_dir = tensorboard_dir or os.path.join(output_dir, "tensorboard")
    inputs = _inputs(dataset_dir, config, setup)
    trial = TrialReporter(hypertune_metric)
    with dtype_policy(setup.precision), tempfile.TemporaryDirectory() as workdir:
        weights = fetch_weights(config.weights, workdir)
        with setup.strategy.scope():
            model = build_model(len(setup.classes), setup.image_size, weights, config.dropout)
        # Every worker runs the TensorBoard callback; tf-keras has the others write their
        # own copy into `<log_dir>/workertemp_<task>` and delete it at the end. In the
        # default log folder that is inside the model folder, which only the chief writes
        # (a killed worker's copy would ship with the model): theirs stay on local disk.
        logs = tensorboard_dir if setup.chief else os.path.join(workdir, "tensorboard")
        history, epoch = _run_phases(model, setup, config, inputs, logs, trial, callbacks)
        final = {}
        if inputs.validation is not None:
            final = model.evaluate(inputs.validation, verbose=0, return_dict=True)
        snapshot = weight_snapshot(model)

    metrics = _metrics(setup, history, final, epoch, architecture(model))
    if setup.chief:
        write_artifact(output_dir, snapshot, setup.manifest, config, history, metrics,
                       serving=serving)
        setup.state.clear([p.name for p in setup.phases])
    _barrier(setup.strategy)
    log.info("finished: %s", metrics)
    return metrics


def _prepare(dataset_dir: str, output_dir: str, config: TrainConfig,
             checkpoint_dir: str | None, strategy: tf.distribute.Strategy | None) -> _Setup:
    """Chooses the strategy and precision, reads the manifest, claims the checkpoint folder.

    Raises:
        TrainingError: An empty train split, or a checkpoint folder of another run.
    """
    # The strategy comes first: MultiWorkerMirroredStrategy must exist before any
    # TensorFlow op runs.
    if strategy is None:
        environment = distribute.prepare_environment(config.precision)
        strategy = distribute.make_strategy(environment.strategy_kind)
        kind, precision = environment.strategy_kind, environment.precision
    else:
        kind = distribute.strategy_kind_of(strategy)
        precision = distribute.choose_precision(config.precision,
                                                distribute.gpu_compute_capabilities())
    chief = distribute.strategy_is_chief(strategy)
    replicas = strategy.num_replicas_in_sync
    global_batch = config.batch_size * replicas

    manifest = read_manifest(dataset_dir)
    train_count = manifest["splits"]["train"]["count"]
    if train_count == 0:
        raise TrainingError(f"the train split of {dataset_dir!r} is empty")
    steps = config.steps_per_epoch or math.ceil(train_count / global_batch)

    state = RunState(checkpoint_dir or os.path.join(output_dir, "checkpoints"), chief)
    state.claim(run_values(config, manifest, replicas),
                {"config": dataclasses.asdict(config), "replicas": replicas})
    phases = plan_phases(config)
    setup = _Setup(strategy, kind, precision, chief, replicas, global_batch, steps, manifest,
                   state, phases, {p.name: state.finished(p.name) for p in phases})
    log.info("training on %d examples of %d classes: strategy %s, %d replica(s), global "
             "batch %d, %d steps/epoch, precision %s, phases %s", train_count,
             len(setup.classes), kind, replicas, global_batch, steps, precision,
             [p.name for p in phases])
    return setup


def _inputs(dataset_dir: str, config: TrainConfig, setup: _Setup) -> _Inputs:
    """Seeds tf-keras, then builds the training and validation pipelines."""
    tf_keras.utils.set_random_seed(config.seed)
    manifest, global_batch = setup.manifest, setup.global_batch
    train_data = train_input(dataset_dir, manifest, config, global_batch)
    validation_count = setup.count("validation")
    even_batches = setup.replicas > 1 and not distribute.gpu_compute_capabilities()
    if even_batches and validation_count % global_batch:
        log.warning("several CPU replicas: validation uses whole batches only, %d of %d "
                    "examples are left out", validation_count % global_batch, validation_count)
    if validation_count and (not even_batches or validation_count >= global_batch):
        return _Inputs(train_data, validation_input(dataset_dir, manifest, config,
                                                    global_batch, even_batches), "val_loss")
    log.warning("no validation batch: early stopping and the LR schedule watch the "
                "training loss, and no validation metrics are reported")
    return _Inputs(train_data, None, "loss")


def _run_phases(model, setup: _Setup, config: TrainConfig, inputs: _Inputs,
                tensorboard_dir: str, trial: TrialReporter,
                callbacks: Sequence[tf_keras.callbacks.Callback],
                ) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Runs every phase in turn; one finished in an earlier attempt is loaded, not rerun.

    Leaves the model compiled, ready to evaluate.

    Returns:
        `(history: phase -> per-epoch records, the number of epochs run in all)`.
    """
    history: dict[str, list[dict[str, Any]]] = {}
    epoch = 0
    compiled = False
    for phase in setup.phases:
        with setup.strategy.scope():
            trainable = set_trainable(model, phase.name, config.unfreeze_blocks)
        marker = setup.finished[phase.name]
        if marker is not None:
            with setup.strategy.scope():
                load_snapshot(model, setup.state.finished_weights(phase.name))
            history[phase.name] = marker["history"]
            epoch = marker["next_epoch"]
            log.info("phase %s finished in an earlier attempt: weights loaded", phase.name)
            continue
        history[phase.name], epoch = _fit_phase(model, setup, config, inputs, phase, epoch,
                                                len(trainable), tensorboard_dir,
                                                [TrialReport(trial), *callbacks])
        compiled = True
    if not compiled:  # every phase was finished earlier: compile to evaluate
        with setup.strategy.scope():
            compile_model(model, setup.phases[-1].learning_rate * setup.replicas)
    return history, epoch


def _fit_phase(model, setup: _Setup, config: TrainConfig, inputs: _Inputs, phase: Phase,
               epoch: int, trainable: int, tensorboard_dir: str,
               extra: Sequence[tf_keras.callbacks.Callback],
               ) -> tuple[list[dict[str, Any]], int]:
    """Compiles and fits one phase from `epoch` (BackupAndRestore resumes it), then saves
    its weights and marker.

    Returns:
        `(the phase's per-epoch records, the epoch the next phase starts at)`.
    """
    learning_rate = phase.learning_rate * setup.replicas  # linear scaling rule
    with setup.strategy.scope():
        compile_model(model, learning_rate)
    log.info("phase %s: epochs %d-%d, learning rate %g, %d trainable base layers",
             phase.name, epoch, epoch + phase.epochs - 1, learning_rate, trainable)
    recorder = EpochRecorder(setup.state, phase.name)
    model.fit(
        inputs.train,
        epochs=epoch + phase.epochs,
        initial_epoch=epoch,
        steps_per_epoch=setup.steps,
        validation_data=inputs.validation,
        callbacks=phase_callbacks(config, setup.state, phase, recorder, tensorboard_dir,
                                  inputs.monitor) + list(extra),
        verbose=0,
    )
    # Epochs run in this process; none means BackupAndRestore found the phase
    # already at its end (restarted after its last epoch was saved).
    next_epoch = (recorder.records[-1]["epoch"] + 1 if recorder.records
                  else epoch + phase.epochs)
    records = setup.state.history(phase.name) if setup.chief else recorder.records
    snapshot = weight_snapshot(model)  # every worker: may all-reduce
    setup.state.finish(phase.name, snapshot, {"history": records, "next_epoch": next_epoch,
                                              "epochs_run": next_epoch - epoch})
    return records, next_epoch


def _metrics(setup: _Setup, history: dict[str, list[dict[str, Any]]], final: dict[str, Any],
             epochs: int, architecture: str) -> dict[str, Any]:
    """The run's final metrics and facts (`train`'s Returns), None values left out."""
    last = next((records[-1] for records in reversed(history.values()) if records), {})
    metrics: dict[str, Any] = {
        "train_loss": last.get("loss"),
        "train_accuracy": last.get("accuracy"),
        "val_loss": final.get("loss"),
        "val_accuracy": final.get("accuracy"),
        "epochs_run": epochs,
        **{f"{name}_epochs": len(records) for name, records in history.items()},
        "replicas": setup.replicas,
        "global_batch_size": setup.global_batch,
        "steps_per_epoch": setup.steps,
        "learning_rate": setup.phases[0].learning_rate * setup.replicas,
        "precision": setup.precision,
        "strategy": setup.kind,
        "num_classes": len(setup.classes),
        "classes": list(setup.classes),
        "image_size": setup.image_size,
        "train_examples": setup.count("train"),
        "validation_examples": setup.count("validation"),
        "framework": f"tf-keras {tf_keras.__version__}",
        "architecture": architecture,
    }
    return {k: v for k, v in metrics.items() if v is not None}


def _barrier(strategy) -> None:
    """Waits for every worker: the others must not exit while the chief still writes
    (the chief's coordination service reports workers that stop as crashed)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)


# --------------------------------------------------------------------------- callbacks


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


# --------------------------------------------------------------------------- resume state


def _read_json(path: str) -> Any:
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


_write_json = write_json_atomically  # checkpoint folders are local paths (gs:// via /gcs/)

RUN_FILE = "run.json"  # the run's fingerprint, config and replicas
# It only marks the folder's owner: BackupAndRestore and the phase files hold the state.
# The whole digest, as run.json has always held.
RUN = run_state.StateFile(RUN_FILE, TrainingError, "other config, dataset or number of replicas",
                          marker=True, sort_keys=True, digits=64)


class RunState:
    """The resume state under the checkpoint folder (layout in the module docstring).

    Only the chief writes; every worker reads the finished phases at start-up.
    """

    def __init__(self, root: str, chief: bool):
        self.root = root
        self.chief = chief

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def backup_dir(self, phase: str) -> str:
        return self._path(f"backup-{phase}")

    def claim(self, values: dict[str, Any], description: dict[str, Any]) -> None:
        """Records the run's fingerprint, or fails if the folder holds another run.

        Args:
            values: What defines the run (`run_values`), hashed into run.json.
            description: More for run.json, for people (the settings).
        """
        if run_state.open_run(self.root, RUN, values, fresh=description,
                              write=self.chief).resumed:
            log.info("checkpoint folder %s belongs to this run: finished work is reused",
                     self.root)

    def finished(self, phase: str) -> dict[str, Any] | None:
        """The marker of a finished phase, or None."""
        path = self._path(f"{phase}.done.json")
        return _read_json(path) if tf.io.gfile.exists(path) else None

    def finished_weights(self, phase: str):
        return read_snapshot(self._path(f"{phase}.weights.npz"))

    def finish(self, phase: str, snapshot, marker: dict[str, Any]) -> None:
        """Saves a finished phase: weights first, then the marker that vouches for them."""
        if self.chief:
            save_snapshot(snapshot, self._path(f"{phase}.weights.npz"))
            _write_json(self._path(f"{phase}.done.json"), marker)

    def history(self, phase: str) -> list[dict[str, Any]]:
        path = self._path(f"history-{phase}.json")
        return _read_json(path) if tf.io.gfile.exists(path) else []

    def record_epoch(self, phase: str, record: dict[str, Any]) -> None:
        """Adds one epoch's metrics; a redone epoch replaces its earlier record."""
        if not self.chief:
            return
        records = [r for r in self.history(phase) if r["epoch"] != record["epoch"]]
        records.append(record)
        # Rewritten whole: gs:// objects cannot be appended to.
        _write_json(self._path(f"history-{phase}.json"), sorted(records, key=lambda r: r["epoch"]))

    def clear(self, phases: Sequence[str]) -> None:
        """Deletes the state once the model is exported (and the folder if left empty)."""
        if not self.chief or not tf.io.gfile.exists(self.root):
            return
        # The run file last: a job killed part-way through leaves a folder still marked as
        # this run's, never finished phases without their owner, which a run with other
        # settings would find free and take up as its own.
        names = [name for phase in phases for name in (
            f"backup-{phase}", f"history-{phase}.json", f"{phase}.weights.npz",
            f"{phase}.done.json")]
        for name in [*names, RUN_FILE]:
            path = self._path(name)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            elif tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
        if not tf.io.gfile.listdir(self.root):
            tf.io.gfile.rmtree(self.root)


def run_values(config: TrainConfig, manifest: dict[str, Any], replicas: int) -> dict[str, Any]:
    """What defines a run, for its fingerprint: config, dataset content (shard digests)
    and replica count."""
    shards = {split: [s["sha256"] for s in info["shards"]]
              for split, info in manifest["splits"].items()}
    return {"config": dataclasses.asdict(config), "classes": manifest["classes"],
            "shards": shards, "replicas": replicas}
