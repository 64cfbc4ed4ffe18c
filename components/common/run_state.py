"""The state file that ties a checkpoint folder to one training run, for every trainer: its
"fingerprint" hashes what defines the run; the same run resumes, another run's folder is
refused (never resumed nor wiped), a folder with no state is free (`open_run`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

from components.common.storage import (
    TMP_PREFIX,
    is_remote,
    local_path,
    push_mirrors,
    read_json,
    run_folder,
    write_json_atomically,
)

# The default checkpoint folder inside a step's output (when Vertex names none).
CHECKPOINTS = "checkpoints"


def fingerprint(values: Mapping[str, Any], length: int = 16) -> str:
    """A stable hash of what defines a run (JSON-like `values`, key order aside; other
    values as `str()`): `length` hex digits of the SHA-256 (64: all)."""
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def checkpoint_folder(output_dir: str, environ: Mapping[str, str] | None = None) -> str:
    """Where a trainer's checkpoints go when none is given: this task's folder under
    `AIP_CHECKPOINT_DIR` (`storage.run_folder`), else `<output_dir>/checkpoints`."""
    return run_folder("AIP_CHECKPOINT_DIR", output_dir, os.path.join(output_dir, CHECKPOINTS),
                      environ)


def inside_output(folder: str, output_dir: str) -> bool:
    """Whether `folder` is `<output_dir>/checkpoints` (removed once done: it would ship)."""
    return os.path.abspath(folder) == os.path.abspath(os.path.join(output_dir, CHECKPOINTS))


def save(folder: str, name: str, state: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    """Writes the state file `name` (the state holds the run's "fingerprint") in `folder`
    (made when missing) whole or not at all, under a temporary name of its own (several
    processes may save it at once), then pushes a mirrored folder."""
    os.makedirs(folder, exist_ok=True)
    write_json_atomically(os.path.join(folder, name), state, sort_keys=sort_keys, unique=True)
    # A saved state marks a whole checkpoint: a retried pod resumes from what is pushed.
    push_mirrors(folder)


@dataclasses.dataclass(frozen=True)
class StateFile:
    """What a trainer's state file is: everything `open_run` does differently per trainer."""

    name: str  # in the checkpoint folder
    error: type[Exception]  # the trainer's, raised for another run's state
    differs: str  # what may differ in another run, for the message
    version: int | None = None  # the state format written (another is refused); None: none
    leftovers: tuple[str, ...] = ()  # files and folders a free folder loses (and temporaries)
    leftover_suffixes: tuple[str, ...] = ()  # endings of such files (e.g. ".pth")
    marker: bool = False  # the file only marks the owner: a free folder is claimed at once
    sort_keys: bool = False  # of the JSON
    digits: int = 16  # hex digits of the fingerprint


@dataclasses.dataclass
class Resume:
    """One run's state in its checkpoint folder (`open_run`)."""

    folder: str
    file: StateFile
    state: dict[str, Any]  # the saved one when `resumed`, else a fresh one; the trainer's to update
    resumed: bool  # whether the folder already held this run's state

    def save(self) -> None:
        """Writes `state` to the state file (`save`)."""
        save(self.folder, self.file.name, self.state, sort_keys=self.file.sort_keys)

    def path(self, name: str) -> str:
        """The path of the file `name` in the checkpoint folder."""
        return os.path.join(self.folder, name)

    def drop(self, name: str | None, *keep: str | None) -> None:
        """Removes checkpoint file `name` (once the state no longer points at it), unless
        it is one of `keep` or missing."""
        if name and name not in keep and os.path.exists(self.path(name)):
            os.remove(self.path(name))


def open_run(folder: str, file: StateFile, run_values: Mapping[str, Any], *,
             fresh: Mapping[str, Any] | None = None, write: bool = True) -> Resume:
    """Resumes this run's state in `folder`, or starts a fresh one there (a free folder
    loses `file.leftovers`; a marker file is written at once).

    Args:
        folder: The checkpoint folder (a local path).
        file: What the trainer's state file is.
        run_values: What defines the run, hashed into the state's "fingerprint".
        fresh: The state of a run that has done nothing yet (after version, fingerprint).
        write: Whether this process writes (False: only check, as other machines do).

    Returns:
        The run's `Resume`.

    Raises:
        file.error: The folder holds another run's state, or `folder` is a gs:// URI.
    """
    if is_remote(folder):
        # os would take it for a relative folder named "gs:" and resume nothing on Vertex.
        raise file.error(f"checkpoint folder {folder!r} is an object store URI; give a local "
                         f"path (gs://: its Cloud Storage FUSE path {local_path(folder)!r}): "
                         "checkpoints are local files")
    run_fingerprint = fingerprint(run_values, file.digits)
    saved = read_json(os.path.join(folder, file.name), optional=True)
    if saved is not None:
        if saved.get("fingerprint") != run_fingerprint or \
                (file.version is not None and saved.get("version") != file.version):
            raise file.error(
                f"checkpoint folder {folder!r} holds the state of a different run "
                f"({file.differs}); resuming it would mix the two. Use another checkpoint "
                "folder or delete that one.")
        return Resume(folder, file, saved, resumed=True)
    version = {} if file.version is None else {"version": file.version}
    # A copy: the trainer updates its state in place, never the `fresh` it was given.
    state = {**version, "fingerprint": run_fingerprint, **copy.deepcopy(dict(fresh or {}))}
    resume = Resume(folder, file, state, resumed=False)
    if write:  # the others' removals could take the writer's temporary file mid-save
        remove_leftovers(folder, (file.name, *file.leftovers), file.leftover_suffixes)
        if file.marker:
            resume.save()
    return resume


def remove_leftovers(folder: str, names: tuple[str, ...], suffixes: tuple[str, ...] = ()
                     ) -> None:
    """Removes `names`, their `save` temporaries and files ending in `suffixes`, if any."""
    if not os.path.isdir(folder):
        return
    temporaries = tuple(f"{TMP_PREFIX}{name}." for name in names)
    for entry in os.listdir(folder):
        if entry in names or entry.startswith(temporaries) or entry.endswith(suffixes):
            path = os.path.join(folder, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
