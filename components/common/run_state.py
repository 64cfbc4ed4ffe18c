"""The state file that ties a checkpoint folder to one training run, for every trainer: its
"fingerprint" hashes what defines the run; the same run resumes, another run's folder is
refused (never resumed nor wiped), a folder with no state is free (`remove_leftovers`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

from components.common.storage import (
    TMP_PREFIX,
    is_remote,
    local_path,
    push_mirrors,
    read_json,
    run_folder,
)

# The default checkpoint folder inside a step's output (when Vertex names none).
CHECKPOINTS = "checkpoints"


def fingerprint(values: Mapping[str, Any], length: int = 16) -> str:
    """A stable hash of what defines a run (key order does not matter).

    Args:
        values: JSON-like description of the run; other values are hashed as `str()`.
        length: Hex digits kept of the SHA-256 (64: all).
    """
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def checkpoint_folder(output_dir: str, environ: Mapping[str, str] | None = None) -> str:
    """Where a trainer's checkpoints go when none is given: this task's folder under
    `AIP_CHECKPOINT_DIR` (`storage.run_folder`), else `<output_dir>/checkpoints`.

    Args:
        output_dir: The step's output folder.
        environ: Environment to read; `os.environ` when None.
    """
    return run_folder("AIP_CHECKPOINT_DIR", output_dir, os.path.join(output_dir, CHECKPOINTS),
                      environ)


def inside_output(folder: str, output_dir: str) -> bool:
    """Whether `folder` is `<output_dir>/checkpoints` (removed once done: it would ship)."""
    return os.path.abspath(folder) == os.path.abspath(os.path.join(output_dir, CHECKPOINTS))


def load(folder: str, name: str, run_fingerprint: str, *, error: type[Exception],
         differs: str, version: int | None = None) -> dict[str, Any] | None:
    """The state file `name` of this run in `folder`, or None when the folder holds none.

    Args:
        folder: The checkpoint folder.
        name: The state file's name in it.
        run_fingerprint: This run's `fingerprint`.
        error, differs, version: As `StateFile`'s.

    Raises:
        error: The file is another run's (or version's), or `folder` is a gs:// URI.
    """
    if is_remote(folder):
        # os would take it for a relative folder named "gs:" and resume nothing on Vertex.
        raise error(f"checkpoint folder {folder!r} is an object store URI; give a local "
                    f"path (gs://: its Cloud Storage FUSE path {local_path(folder)!r}): "
                    "checkpoints are local files")
    state = read_json(os.path.join(folder, name), optional=True)
    if state is None:
        return None
    if state.get("fingerprint") != run_fingerprint or \
            (version is not None and state.get("version") != version):
        raise error(
            f"checkpoint folder {folder!r} holds the state of a different run ({differs}); "
            "resuming it would mix the two. Use another checkpoint folder or delete that one.")
    return state


def save(folder: str, name: str, state: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    """Writes the state file whole or not at all, then pushes a mirrored folder. Its
    temporary name is its own (`mkstemp`): a fixed one failed 9 of 600 concurrent saves.

    Args:
        folder: The checkpoint folder; created when missing.
        name: The state file's name in it.
        state: The state, holding this run's "fingerprint".
        sort_keys: Sort the JSON's keys.
    """
    os.makedirs(folder, exist_ok=True)
    text = json.dumps(state, indent=2, sort_keys=sort_keys) + "\n"
    handle, temporary = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{name}.", dir=folder)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
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
    run_fingerprint = fingerprint(run_values, file.digits)
    saved = load(folder, file.name, run_fingerprint, error=file.error, differs=file.differs,
                 version=file.version)
    if saved is not None:
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


def remove_leftovers(folder: str, names: Iterable[str] = (), suffixes: Iterable[str] = ()
                     ) -> None:
    """Removes a trainer's files (named, their `save` temporaries, those ending in
    `suffixes`) from a folder that holds no state.

    Args:
        folder: The checkpoint folder (nothing happens when it does not exist).
        names: Files or folders to remove.
        suffixes: Endings of files to remove (e.g. ".pth").
    """
    if not os.path.isdir(folder):
        return
    names, suffixes = set(names), tuple(suffixes)
    temporaries = tuple(f"{TMP_PREFIX}{name}." for name in names)
    for entry in os.listdir(folder):
        if (entry in names or (temporaries and entry.startswith(temporaries))
                or (suffixes and entry.endswith(suffixes))):
            path = os.path.join(folder, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
