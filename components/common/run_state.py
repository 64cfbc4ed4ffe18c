"""The state file that ties a checkpoint folder to one training run, for every trainer.

A trainer that resumes after a restart keeps a JSON state file in its checkpoint folder
whose "fingerprint" is a hash of what defines the run (settings, data, output folder...).
A restarted job of the same run finds its own fingerprint and resumes; a run with another
fingerprint is refused, never resumed (that would mix the two runs) nor wiped (that would
destroy the other run's work). A folder with no state file is free: another run's
leftovers there are removed (`remove_leftovers`), since there is nothing to resume.

Every trainer resumes the same way, through `open_run`: what differs between them is
data, a `StateFile` (its name, `run.json`, `state.json` or `lm_state.json`; its format
version; the leftovers a free folder loses; whether it only marks the folder's owner).
`open_run` returns a `Resume`: this run's saved state (resumed) or a fresh one, which the
trainer updates and `save`s. This module imports neither TensorFlow nor torch: the tf-keras
and the fastai images both use it.

Checkpoint folders are local paths: a gs:// folder reaches the trainers as its Cloud
Storage FUSE path (`storage.local_path`, `storage.run_folder`), as their checkpoints do;
a gs:// URI itself is refused (`load`).
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
    run_folder,
)

# The default checkpoint folder inside a step's output (when Vertex names none).
CHECKPOINTS = "checkpoints"


def fingerprint(values: Mapping[str, Any], length: int = 16) -> str:
    """A stable hash of what defines a run (key order does not matter).

    Args:
        values: JSON-like description of the run; other values are hashed as `str()`.
        length: Hex digits kept (64: the whole SHA-256).

    Returns:
        The first `length` hex digits of the SHA-256 of the sorted JSON.
    """
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def checkpoint_folder(output_dir: str, environ: Mapping[str, str] | None = None) -> str:
    """Where a trainer's checkpoints and state file go when none is given.

    Under `AIP_CHECKPOINT_DIR` (set by Vertex when the job has a base output directory)
    in a folder of this pipeline task (`storage.run_folder`), else `<output_dir>/checkpoints`,
    which a restarted job of the same pipeline task writes to again.

    Args:
        output_dir: The step's output folder.
        environ: Environment to read; `os.environ` (at call time) when None.

    Returns:
        A local folder path.
    """
    return run_folder("AIP_CHECKPOINT_DIR", output_dir, os.path.join(output_dir, CHECKPOINTS),
                      environ)


def inside_output(folder: str, output_dir: str) -> bool:
    """Whether `folder` is the default one inside the output (`<output_dir>/checkpoints`).

    There its files would ship with the output, so a trainer removes it once done.
    """
    return os.path.abspath(folder) == os.path.abspath(os.path.join(output_dir, CHECKPOINTS))


def load(folder: str, name: str, run_fingerprint: str, *, error: type[Exception],
         differs: str, version: int | None = None) -> dict[str, Any] | None:
    """The state file `name` of this run in `folder`, or None when the folder holds none.

    Args:
        folder: The checkpoint folder.
        name: The state file's name in it.
        run_fingerprint: This run's `fingerprint`.
        error: The trainer's exception class, raised for another run's state.
        differs: What may differ in another run, for the message (e.g. "other config,
            dataset or model folder").
        version: The state format this trainer writes; a file of another version is
            refused like another run's. None: the file has no version.

    Returns:
        The file's content (a dict), or None when there is no such file.

    Raises:
        error: The file belongs to another run (or another state version), or `folder`
            is a gs:// URI (its FUSE path is what the trainers write to).
    """
    if is_remote(folder):
        # os would take it for a relative folder named "gs:" and resume nothing on Vertex.
        raise error(f"checkpoint folder {folder!r} is an object store URI; give a local "
                    f"path (gs://: its Cloud Storage FUSE path {local_path(folder)!r}): "
                    "checkpoints are local files")
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        state = json.load(f)
    if state.get("fingerprint") != run_fingerprint or \
            (version is not None and state.get("version") != version):
        raise error(
            f"checkpoint folder {folder!r} holds the state of a different run ({differs}); "
            "resuming it would mix the two. Use another checkpoint folder or delete that one.")
    return state


def save(folder: str, name: str, state: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    """Writes the state file whole or not at all (a kill mid-write keeps the old one).

    The temporary file has a name of its own (`tempfile.mkstemp` in `folder`, so the
    rename stays within one file system): processes saving the same file at once never
    rename or overwrite each other's temporary file, and the last rename wins whole. With
    one fixed temporary name, two processes saving 300 times each failed 5 and 4 times.

    Args:
        folder: The checkpoint folder; created when missing.
        name: The state file's name in it.
        state: The state, holding this run's "fingerprint".
        sort_keys: Sort the JSON's keys (the formats the trainers have always written).
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
    # A saved state marks a whole checkpoint: where the folder mirrors an object store
    # (open-source Kubeflow), it is pushed now, so a retried pod resumes from it.
    push_mirrors(folder)


@dataclasses.dataclass(frozen=True)
class StateFile:
    """What a trainer's state file is: everything `open_run` does differently per trainer.

    Attributes:
        name: The file's name in the checkpoint folder.
        error: The trainer's exception class, raised for another run's state.
        differs: What may differ in another run, for the message (e.g. "other config,
            dataset or model folder").
        version: The state format the trainer writes; a file of another version is refused
            like another run's. None: the file has no version.
        leftovers: Files and folders of the trainer that a free folder loses (another run's,
            with nothing to resume them); the temporaries of this file go too.
        leftover_suffixes: Endings of such files (e.g. ".pth").
        marker: The file only marks the folder's owner (the resume state lives elsewhere:
            Keras backups, `Trainer` checkpoints), so a free folder is claimed at once.
        sort_keys: Sort the JSON's keys (the formats the trainers have always written).
        digits: Hex digits of the fingerprint (`fingerprint`'s `length`).
    """

    name: str
    error: type[Exception]
    differs: str
    version: int | None = None
    leftovers: tuple[str, ...] = ()
    leftover_suffixes: tuple[str, ...] = ()
    marker: bool = False
    sort_keys: bool = False
    digits: int = 16


@dataclasses.dataclass
class Resume:
    """One run's state in its checkpoint folder (`open_run`).

    Attributes:
        folder: The checkpoint folder.
        file: What the state file is.
        state: The saved state when `resumed`, else a fresh one; the trainer updates it.
        resumed: Whether the folder already held this run's state.
    """

    folder: str
    file: StateFile
    state: dict[str, Any]
    resumed: bool

    def save(self) -> None:
        """Writes `state` to the state file (`save`: whole or not at all)."""
        save(self.folder, self.file.name, self.state, sort_keys=self.file.sort_keys)

    def path(self, name: str) -> str:
        """The path of the file `name` in the checkpoint folder."""
        return os.path.join(self.folder, name)

    def drop(self, name: str | None, *keep: str | None) -> None:
        """Removes the checkpoint file `name`, unless it is one of `keep` or missing.

        Called only once the saved state no longer points at it: a job killed before that
        save resumes from it.
        """
        if name and name not in keep and os.path.exists(self.path(name)):
            os.remove(self.path(name))


def open_run(folder: str, file: StateFile, run_values: Mapping[str, Any], *,
             fresh: Mapping[str, Any] | None = None, write: bool = True) -> Resume:
    """Resumes this run's state in `folder`, or starts a fresh one there.

    A folder holding this run's state file resumes it; one holding another run's is
    refused. A free folder loses `file.leftovers`, and a marker file is written at once.

    Args:
        folder: The checkpoint folder (a local path; gs:// arrives as its FUSE path).
        file: What the trainer's state file is.
        run_values: What defines the run (settings, data, output folder...), hashed into
            the state's "fingerprint" (`fingerprint`).
        fresh: The state of a run that has done nothing yet, after its "version" and
            "fingerprint" (a marker: more for people to read, e.g. the settings).
        write: Whether this process writes (False on all but one of a multi-machine job's:
            they only check, and leave the one writer's files alone).

    Returns:
        The run's `Resume`.

    Raises:
        file.error: The folder holds another run's state (or another version of it), or
            `folder` is a gs:// URI.
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
    """Removes a trainer's files from a folder that holds no state (another run's, or none).

    Only the named files and folders, the temporaries `save` leaves of a named file when
    killed mid-write, and the files ending in `suffixes` go: the folder may be shared with
    other steps' files.

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
