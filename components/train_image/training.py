"""Train the DenseNet121 image classifier on a sharded dataset.

Two phases with pretrained weights: "head" trains only the new top on a frozen
base, then "fine_tune" unfreezes the top dense blocks at a lower learning rate.
Without pretrained weights there is nothing to protect, so one "full" phase trains
everything for `epochs + fine_tune_epochs` epochs at `learning_rate`.
Epochs are numbered across phases (fine-tuning continues the head's count), so
TensorBoard shows one continuous curve.

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

import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf
import tf_keras

from components.common import run_state
from components.common.hypertune import TrialReporter
from components.common.storage import filesystem, local_path, run_folder, write_json_atomically
from components.formats.shards import make_dataset
from components.shard.contract import read_manifest
from components.train_image import distribute, serving
from components.train_image.contract import (
    BYTES_INPUT_NAME,
    HISTORY_FILE,
    LABEL_OUTPUT_NAME,
    LABELS_FILE,
    MODEL_FILE,
    PIXELS_SIGNATURE,
    PREPROCESSING_FILE,
    SAVED_MODEL_DIR,
    SERVING_SIGNATURE,
    TrainConfig,
    TrainingError,
    normalize_weights,
)
from components.train_image.model import (
    INPUT_NAME,
    OUTPUT_NAME,
    build_model,
    load_snapshot,
    read_snapshot,
    save_snapshot,
    set_trainable,
    weight_snapshot,
)

log = logging.getLogger(__name__)

# Tests only: seconds the chief sleeps before writing the model folder (read at call time),
# so that a worker which did not wait for the chief would finish before the outputs exist.
SLOW_CHIEF_VARIABLE = "TRAIN_IMAGE_TEST_CHIEF_DELAY"


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
    if weights is None or weights == "imagenet" or not weights.startswith("gs://"):
        return weights
    fs, path = filesystem(weights)
    local = os.path.join(workdir, os.path.basename(path.rstrip("/")) or "weights.h5")
    log.info("copying weights %s to %s", weights, local)
    fs.get(path, local)
    return local


# --------------------------------------------------------------------------- input


def random_affine(batch_size, height: int, width: int, seed, flip: bool, rotation: float,
                  zoom: float) -> tf.Tensor:
    """Per-image random flip/rotation/zoom as projective transforms (output -> input).

    One transform per image combines all three, so each image is resampled once.

    Args:
        batch_size: Number of images (scalar tensor).
        height: Image height.
        width: Image width.
        seed: Shape [2] int seed for the stateless random ops.
        flip: Mirror left-right with probability 1/2.
        rotation: Rotate by up to +-rotation of a full turn.
        zoom: Scale by a factor in [1 - zoom, 1 + zoom] (> 1 shows more: zoom out).

    Returns:
        [batch_size, 8] float32 transforms for `ImageProjectiveTransformV3`.
    """
    seeds = tf.random.experimental.stateless_split(seed, 3)
    shape = tf.reshape(batch_size, [1])
    ones = tf.ones(shape, tf.float32)
    sign = ones
    if flip:
        sign = tf.where(tf.random.stateless_uniform(shape, seeds[0]) < 0.5, -ones, ones)
    angle = tf.random.stateless_uniform(shape, seeds[1], -rotation, rotation) * 2.0 * math.pi
    scale = tf.random.stateless_uniform(shape, seeds[2], 1.0 - zoom, 1.0 + zoom)
    cos, sin = tf.cos(angle), tf.sin(angle)
    # input = scale * R(angle) @ diag(sign, 1) @ (output - center) + center
    a0, a1 = scale * cos * sign, -scale * sin
    b0, b1 = scale * sin * sign, scale * cos
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    a2 = cx - a0 * cx - a1 * cy
    b2 = cy - b0 * cx - b1 * cy
    zeros = tf.zeros_like(ones)
    return tf.stack([a0, a1, a2, b0, b1, b2, zeros, zeros], axis=1)


def augment_images(images: tf.Tensor, seed, flip: bool, rotation: float,
                   zoom: float) -> tf.Tensor:
    """Randomly flips, rotates and zooms a float32 batch [N, H, W, 3].

    Borders are filled by reflection, so no black corners teach the model a shortcut.
    """
    if not flip and rotation == 0 and zoom == 0:
        return images
    height, width = images.shape[1], images.shape[2]
    transforms = random_affine(tf.shape(images)[0], height, width, seed, flip, rotation, zoom)
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms, output_shape=tf.constant([height, width]),
        fill_value=0.0, interpolation="BILINEAR", fill_mode="REFLECT")


def _to_float(images, labels):
    return tf.cast(images, tf.float32), labels


def train_input(dataset_dir: str, manifest: dict[str, Any], config: TrainConfig,
                global_batch: int) -> tf.data.Dataset:
    """The training pipeline: endless, shuffled, live-augmented batches.

    Files are read in shuffled, interleaved, non-deterministic order; examples are
    shuffled, batched, then augmented one batch at a time (one vectorised op per
    batch is much cheaper than one per image) with fresh randomness every epoch.
    Under MultiWorkerMirroredStrategy, Keras shards the files across workers.
    """
    count = manifest["splits"]["train"]["count"]
    dataset = make_dataset(dataset_dir, "train", manifest=manifest, shuffle_files=True,
                           seed=config.seed, deterministic=False)
    dataset = dataset.shuffle(min(config.shuffle_buffer, max(count, 1)), seed=config.seed,
                              reshuffle_each_iteration=True)
    # Endless, with steps_per_epoch fixed, so every worker runs the same number of
    # steps even when their file shards hold different numbers of examples.
    dataset = dataset.repeat().batch(global_batch, drop_remainder=True)
    # A generator (not stateful ops with a seed, which replay the same numbers each
    # epoch, nor a zipped Dataset.random, which defeats file-level auto-sharding).
    with tf.device("/cpu:0"):
        generator = tf.random.Generator.from_seed(config.seed)

    def augment(images, labels):
        images = tf.cast(images, tf.float32)
        seed = generator.make_seeds(1)[:, 0]
        return augment_images(images, seed, config.flip, config.rotation, config.zoom), labels

    dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return dataset.prefetch(tf.data.AUTOTUNE)


def validation_input(dataset_dir: str, manifest: dict[str, Any], config: TrainConfig,
                     global_batch: int, even_batches: bool = False) -> tf.data.Dataset:
    """The validation pipeline: every example once, in order, never augmented.

    Args:
        dataset_dir: Folder written by the sharding step.
        manifest: Its manifest.
        config: How to train (validation_steps).
        global_batch: Examples per step over all replicas.
        even_batches: Only whole global batches, and every worker reads all of them.
            Needed with several CPU replicas: a replica handed an empty batch (the
            tail of an uneven split) makes oneDNN's Conv2D return its input unchanged
            and BatchNorm then fails on the channel count (TF 2.21). Drops up to
            global_batch - 1 examples; metrics stay exact means. GPUs are not affected.
    """
    dataset = make_dataset(dataset_dir, "validation", manifest=manifest)
    dataset = dataset.batch(global_batch, drop_remainder=even_batches)
    dataset = dataset.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    if even_batches:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
    if config.validation_steps:
        dataset = dataset.take(config.validation_steps)
    return dataset.prefetch(tf.data.AUTOTUNE)


# --------------------------------------------------------------------------- state


def _read_json(path: str) -> Any:
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


_write_json = write_json_atomically  # checkpoint folders are local paths (gs:// via /gcs/)

RUN_FILE = "run.json"  # the run's fingerprint (run_state.claim), config and replicas


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

    def claim(self, fingerprint: str, description: dict[str, Any]) -> None:
        """Records the run's fingerprint, or fails if the folder holds another run."""
        if run_state.claim(self.root, RUN_FILE, fingerprint, error=TrainingError,
                           differs="other config, dataset or number of replicas",
                           record=description, write=self.chief):
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
        names = [RUN_FILE]
        for phase in phases:
            names += [f"backup-{phase}", f"history-{phase}.json", f"{phase}.weights.npz",
                      f"{phase}.done.json"]
        for name in names:
            path = self._path(name)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            elif tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
        if not tf.io.gfile.listdir(self.root):
            tf.io.gfile.rmtree(self.root)


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


class TrialReport(tf_keras.callbacks.Callback):
    """Reports the tuning metric after each epoch (epochs counted across both phases)."""

    def __init__(self, reporter: TrialReporter):
        super().__init__()
        self.reporter = reporter

    def on_epoch_end(self, epoch, logs=None):
        self.reporter.report(logs or {}, int(epoch) + 1)


def fingerprint(config: TrainConfig, manifest: dict[str, Any], replicas: int) -> str:
    """Identifies a run: config, dataset content (shard digests) and replica count."""
    shards = {split: [s["sha256"] for s in info["shards"]]
              for split, info in manifest["splits"].items()}
    payload = {"config": dataclasses.asdict(config), "classes": manifest["classes"],
               "shards": shards, "replicas": replicas}
    return run_state.fingerprint(payload, length=64)  # the whole digest, as run.json holds


@contextlib.contextmanager
def dtype_policy(name: str):
    """Sets the global tf-keras dtype policy for the block, restoring the old one."""
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


# --------------------------------------------------------------------------- training


def _compile(model, learning_rate: float) -> None:
    model.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )


def _callbacks(config: TrainConfig, state: RunState, phase: Phase, recorder: EpochRecorder,
               tensorboard_dir: str, monitor: str) -> list:
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
    ]
    return callbacks


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

    Returns:
        Final metrics and facts of the run: train_loss, train_accuracy (last epoch),
        val_loss, val_accuracy (final model on the validation split), epochs_run,
        <phase>_epochs, replicas, global_batch_size, steps_per_epoch, learning_rate
        (scaled), precision, strategy, num_classes, classes (label index order),
        image_size, train_examples, validation_examples, framework.

    Raises:
        TrainingError: Bad settings, or a checkpoint folder of another run.
        FileNotFoundError: The dataset folder is not a complete sharded dataset.
    """
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

    metrics = _metrics(setup, history, final, epoch)
    if setup.chief:
        _slow_down_for_tests()
        write_artifact(output_dir, snapshot, setup.manifest, config, history, metrics)
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
    state.claim(fingerprint(config, manifest, replicas),
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
            _compile(model, setup.phases[-1].learning_rate * setup.replicas)
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
        _compile(model, learning_rate)
    log.info("phase %s: epochs %d-%d, learning rate %g, %d trainable base layers",
             phase.name, epoch, epoch + phase.epochs - 1, learning_rate, trainable)
    recorder = EpochRecorder(setup.state, phase.name)
    model.fit(
        inputs.train,
        epochs=epoch + phase.epochs,
        initial_epoch=epoch,
        steps_per_epoch=setup.steps,
        validation_data=inputs.validation,
        callbacks=_callbacks(config, setup.state, phase, recorder, tensorboard_dir,
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
             epochs: int) -> dict[str, Any]:
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
    }
    return {k: v for k, v in metrics.items() if v is not None}


def _slow_down_for_tests() -> None:
    """Sleeps `SLOW_CHIEF_VARIABLE` seconds when a test sets it; nothing otherwise."""
    delay = float(os.environ.get(SLOW_CHIEF_VARIABLE) or 0)
    if delay > 0:
        log.warning("%s=%s: the chief waits %.1f s before writing (a test)",
                    SLOW_CHIEF_VARIABLE, delay, delay)
        time.sleep(delay)


def _barrier(strategy) -> None:
    """Waits for every worker: the others must not exit while the chief still writes
    (the chief's coordination service reports workers that stop as crashed)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)


def write_artifact(output_dir: str, snapshot, manifest: dict[str, Any], config: TrainConfig,
                   history: dict[str, list], metrics: dict[str, Any]) -> None:
    """Writes model.keras, saved_model/, labels.json, preprocessing.json, history.json.

    The saved model is a float32 copy, whatever the training precision: float16
    on a CPU (a likely place for evaluation or serving) is ~95x slower, and the
    weights are float32 anyway. It is built outside any strategy scope, so it holds
    plain variables.
    """
    image_size = manifest["image"]["height"]
    classes = manifest["classes"]
    tf.io.gfile.makedirs(output_dir)
    with dtype_policy("float32"):
        model = build_model(len(classes), image_size, None, config.dropout,
                            frozen_batchnorm=config.pretrained)
    load_snapshot(model, snapshot)
    last_lr = plan_phases(config)[-1].learning_rate
    _compile(model, last_lr)
    model.save(os.path.join(output_dir, MODEL_FILE))
    preprocessing = {
        "image_size": image_size,
        "input": "float32 RGB 0..255",
        "scaling": "densenet121 preprocess_input inside the model",
        "resize_method": manifest["image"].get("resize_method"),
        # how the shards stored the pixels: prediction repeats the JPEG round trip
        "image_format": manifest["image"]["format"],
        "jpeg_quality": manifest["image"].get("jpeg_quality"),
        "serving_signature": SERVING_SIGNATURE,
        "serving_input": f"{BYTES_INPUT_NAME}: encoded image files (JSON {{\"b64\": ...}})",
        "serving_outputs": [OUTPUT_NAME, LABEL_OUTPUT_NAME],
        "pixels_signature": PIXELS_SIGNATURE,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "dtype": "float32",
        "training_precision": metrics.get("precision"),
    }
    export_saved_model(model, os.path.join(output_dir, SAVED_MODEL_DIR), preprocessing, classes)
    _write_json(os.path.join(output_dir, LABELS_FILE), {"classes": classes})
    _write_json(os.path.join(output_dir, PREPROCESSING_FILE), preprocessing)
    _write_json(os.path.join(output_dir, HISTORY_FILE), history)
    log.info("model written to %s", output_dir)


def export_saved_model(model: tf_keras.Model, path: str, preprocessing: Mapping[str, Any],
                       classes: Sequence[str]) -> None:
    """Exports a SavedModel with two signatures.

    `serving_default`: "image_bytes" (a batch of JPEG/PNG/GIF/BMP files) -> "probabilities"
    and "label" (the top class name), decoding and resizing in the graph as the sharding
    step did (`serving.preprocess_batch`): what Vertex endpoints call with `{"b64": ...}`.
    `serving_pixels`: "image" float32 RGB 0..255 at the model's size -> "probabilities".

    Uses tf-keras's ExportArchive: it saves the forward pass and the variables, not
    the Keras object graph, so loading needs neither Keras nor this package.
    """
    size = preprocessing["image_size"]
    method = preprocessing.get("resize_method") or "crop"
    quality = preprocessing.get("jpeg_quality") if preprocessing.get("image_format") == "jpeg" \
        else None
    archive = tf_keras.export.ExportArchive()
    archive.track(model)
    names = tf.constant(list(classes))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=BYTES_INPUT_NAME)])
    def serve_bytes(image_bytes):
        pixels = serving.preprocess_batch(image_bytes, size, method, quality)
        probabilities = model(pixels, training=False)
        return {OUTPUT_NAME: probabilities,
                LABEL_OUTPUT_NAME: tf.gather(names, tf.argmax(probabilities, axis=1))}

    @tf.function(input_signature=[
        tf.TensorSpec([None, size, size, 3], tf.float32, name=INPUT_NAME)])
    def serve_pixels(image):
        return {OUTPUT_NAME: model(image, training=False)}

    archive.add_endpoint(SERVING_SIGNATURE, serve_bytes)
    archive.add_endpoint(PIXELS_SIGNATURE, serve_pixels)
    # write_out prints every captured variable to stdout unless interactive
    # logging is off; it then goes to the logging module instead.
    interactive = tf_keras.utils.is_interactive_logging_enabled()
    tf_keras.utils.disable_interactive_logging()
    try:
        archive.write_out(path)
    finally:
        if interactive:
            tf_keras.utils.enable_interactive_logging()


def predict_fn(saved_model_dir: str, signature: str = PIXELS_SIGNATURE
               ) -> Callable[[Any], dict[str, tf.Tensor]]:
    """A signature of an exported SavedModel as a function of its one input.

    `PIXELS_SIGNATURE` takes float32 images, `SERVING_SIGNATURE` encoded files' bytes;
    both return a dict of outputs ("probabilities", and "label" for the bytes one).
    """
    loaded = tf.saved_model.load(saved_model_dir)
    input_name = BYTES_INPUT_NAME if signature == SERVING_SIGNATURE else INPUT_NAME
    dtype = tf.string if signature == SERVING_SIGNATURE else tf.float32

    def predict(inputs):
        # Looked up through `loaded`, which must stay alive: it owns the variables.
        function = loaded.signatures[signature]
        return function(**{input_name: tf.convert_to_tensor(inputs, dtype)})

    return predict
