"""The image trainer's resume state under the checkpoint folder, and what defines its run.

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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from components.common import run_state
from components.common.storage import write_json_atomically
from components.train_image.contract import TrainConfig, TrainingError
from components.train_image.model import read_snapshot, save_snapshot

log = logging.getLogger(__name__)


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
