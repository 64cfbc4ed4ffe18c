"""Local paths and object store URIs (gs:// through gcsfs, s3:// through s3fs), one way."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import pathlib
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import tenacity
from fsspec.core import url_to_fs

from components.common.borrowed import before_thread_pools_end

# Files being written carry this prefix until they are complete (then renamed).
TMP_PREFIX = ".tmp-"
# Object stores reached through fsspec rather than as local files.
REMOTE_SCHEMES = ("gs://", "s3://")


def is_remote(uri: str) -> bool:
    """Whether `uri` names an object store location (gs://, s3://), not a local path."""
    return uri.startswith(REMOTE_SCHEMES)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Returns `(fs, path)`: the fsspec filesystem serving `uri` (local, gs://, s3://) and
    the path inside it."""
    # The environment is read at call time: an emulator (no credentials), an S3 endpoint.
    if uri.startswith("gs://"):
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        return url_to_fs(uri, **({"token": "anon"} if os.environ.get("STORAGE_EMULATOR_HOST")
                                 else {}))
    if uri.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return url_to_fs(uri, **({"client_kwargs": {"endpoint_url": endpoint}} if endpoint
                                 else {}))
    return url_to_fs(os.path.abspath(uri))


def gcs_mount_prefix() -> str:
    """Where Vertex's Cloud Storage FUSE mount shows buckets: KFP's `/gcs/`, asked of KFP
    at call time so artifact paths and ours agree (`rehearsal` moves it)."""
    from kfp.dsl import Artifact

    return Artifact(uri="gs://").path


def local_path(uri: str) -> str:
    """Maps a gs:// URI onto Vertex's Cloud Storage FUSE mount; other paths unchanged."""
    if uri.startswith("gs://"):
        return gcs_mount_prefix() + uri[len("gs://"):]
    return uri


def run_folder(variable: str, output_path: str, default: str | None,
               environ: Mapping[str, str] | None = None) -> str:
    """The local folder of the job folder Vertex names in `variable` (e.g.
    "AIP_CHECKPOINT_DIR"; unset: `default`), narrowed to this task's `<pipeline job>/<task>`
    of `output_path` (`.../<job>/<task>/<output>`): runs kept apart, a restarted task finds
    its state. gs:// is read through the FUSE mount, else (s3://, `OBJECT_STORE_MOUNTED=0`)
    through a `mirrored_folder`; `environ` defaults to `os.environ`.

    Raises:
        CheckpointStoreError: A mirrored folder cannot be listed, written or read.
    """
    environ = os.environ if environ is None else environ
    root = environ.get(variable, "").strip()
    if not root:
        return default
    run = os.path.normpath(output_path).split(os.sep)[-3:-1]
    if root.startswith("s3://") or (is_remote(root) and
                                    environ.get(MOUNTED_VARIABLE, "1") == "0"):
        return mirrored_folder("/".join([root.rstrip("/"), *run]))
    return os.path.join(local_path(root), *run)


# "0" where gs:// is not mounted at /gcs (open-source KFP's /gcs dies with the pod).
MOUNTED_VARIABLE = "OBJECT_STORE_MOUNTED"
# Pushed last, so a pod killed mid-push leaves the remote pointing at a whole checkpoint.
_POINTERS = ("checkpoint", "run.json", "state.json", "lm_state.json", "sealed")
_MIRRORS: dict[str, Mirror] = {}  # remote -> its mirror in this process
# Tries of a push or probe, waiting PUSH_BACKOFF_S, then twice that...: about a minute.
PUSH_ATTEMPTS = 4
PUSH_BACKOFF_S = 2.0
# Errors no retry mends: no such bucket (or local file), no permission.
_PERMANENT = (FileNotFoundError, PermissionError)
_ADVICE = ("check that the bucket exists, that the step's credentials may list, write and "
           "delete there (Kubeflow: the --storage-secret keys) and that the store's endpoint "
           "answers (--s3-endpoint, AWS_ENDPOINT_URL_S3)")


class CheckpointStoreError(RuntimeError):
    """A mirror's object store folder cannot be listed, written or pushed to."""


def mirror_path(remote: str) -> str:
    """The local folder of this process's mirror of `remote` (gs:// or s3://; not made
    here), named by the remote and the process that started the job: DDP ranks under
    torch's launcher (TORCHELASTIC_RUN_ID) share their parent's; other processes never do."""
    pid = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid()
    try:  # the process's start time: with the pid, a unique name
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]  # field 22, after the name
    except (OSError, IndexError):
        start = ""  # no /proc
    key = f"{remote.rstrip('/')}\n{pid}.{start}"
    return os.path.join(tempfile.gettempdir(), "mirrors",
                        hashlib.sha1(key.encode()).hexdigest()[:16])


def _retrying(action: Callable[[], None], what: str) -> None:
    """Runs `action` up to PUSH_ATTEMPTS times (not after `_PERMANENT` errors), else raises
    CheckpointStoreError naming `what`."""
    retrying = tenacity.Retrying(  # made per call: tests shorten the two constants
        stop=tenacity.stop_after_attempt(PUSH_ATTEMPTS), reraise=True,
        wait=tenacity.wait_exponential(multiplier=PUSH_BACKOFF_S),
        retry=tenacity.retry_if_exception(  # any store error, never a KeyboardInterrupt
            lambda err: isinstance(err, Exception) and not isinstance(err, _PERMANENT)),
        before_sleep=lambda state: logging.getLogger(__name__).warning(
            "%s failed (%r); trying again", what, state.outcome.exception()))
    try:
        retrying(action)
    except Exception as err:
        tries = retrying.statistics["attempt_number"]
        raise CheckpointStoreError(f"{what} failed ({type(err).__name__}: {err}) after {tries} "
                                   f"attempt{'s' * (tries > 1)}; {_ADVICE}") from err


class Mirror:
    """A local copy of `remote`, an object store folder that is not mounted (checkpoints,
    logs), filled once under a file lock; only RANK 0 pushes, and checks first that it can
    write, list and delete there, before hours of training are lost.

    Raises:
        CheckpointStoreError: The remote folder cannot be listed, written or read.
    """

    def __init__(self, remote: str):
        import fcntl

        self.remote = remote.rstrip("/")
        self.fs, self.root = filesystem(self.remote)
        if _pushes():
            # Before the pull: a bucket that does not exist reads as an empty folder.
            _retrying(self._probe, f"listing and writing the object store folder {self.remote}")
        self.local = mirror_path(self.remote)
        os.makedirs(self.local, exist_ok=True)
        filled = os.path.join(self.local, f"{TMP_PREFIX}filled")
        with open(os.path.join(self.local, f"{TMP_PREFIX}lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(filled):
                _retrying(self._pull, f"reading the object store folder {self.remote}")
                open(filled, "w").close()
        self.pushed = self._local_files()

    def _probe(self) -> None:
        """Writes, lists and deletes a small object in the remote folder."""
        probe = f"{self.root}/{TMP_PREFIX}probe-{uuid.uuid4().hex}"
        self.fs.pipe(probe, b"can this step keep its checkpoints here?")
        try:
            self.fs.invalidate_cache(self.root)
            self.fs.ls(self.root, detail=False)  # holds the probe: not found is an error
        except Exception:
            with contextlib.suppress(Exception):  # the listing's error is the one to name
                self.fs.rm(probe)
            raise
        self.fs.rm(probe)

    def _pull(self) -> None:
        """Copies the remote folder here, less temporaries (another rank's probe may go)."""
        if not self.fs.isdir(self.root):
            return
        keys = [key for key in self.fs.find(self.root)
                if not os.path.basename(key).startswith(TMP_PREFIX)]
        if keys:
            self.fs.get(keys, [os.path.join(self.local, key[len(self.root):].lstrip("/"))
                               for key in keys])

    def _local_files(self) -> dict[str, tuple[int, int, int]]:
        """Each file's (size, mtime, inode: os.replace of a same-size file in one mtime tick),
        by its path in the mirror; temporaries left out."""
        stats = {str(path.relative_to(self.local)): path.stat()
                 for path in pathlib.Path(self.local).rglob("*")
                 if not path.name.startswith(TMP_PREFIX) and path.is_file()}
        return {rel: (stat.st_size, stat.st_mtime_ns, stat.st_ino) for rel, stat in stats.items()}

    def push(self) -> None:
        """Uploads what changed (pointers last), then removes what the trainer removed; a
        failed upload is tried again from the file that failed.

        Raises:
            CheckpointStoreError: The store refused the push PUSH_ATTEMPTS times.
        """
        if not _pushes():
            return
        files = self._local_files()
        todo = sorted((rel for rel, stat in files.items() if self.pushed.get(rel) != stat),
                      key=lambda rel: os.path.basename(rel) in _POINTERS)
        gone = sorted(set(self.pushed) - set(files))

        def upload() -> None:
            while todo:  # what is done stays done across tries
                local = os.path.join(self.local, todo[0])
                try:
                    self.fs.put(local, f"{self.root}/{todo[0]}")
                except FileNotFoundError:
                    if os.path.exists(local):  # the store's: no such bucket
                        raise
                    # removed by the trainer since it was listed: gone at the next push
                todo.pop(0)
            while gone:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(f"{self.root}/{gone[0]}")
                gone.pop(0)

        _retrying(upload, f"pushing {self.local} to {self.remote} (what this step saved there "
                  "since its last push is not kept)")
        self.pushed = files


def _pushes() -> bool:
    """Whether this process pushes: the first DDP rank, or a process outside DDP."""
    return os.environ.get("RANK", "0") == "0"


def mirrored_folder(remote: str) -> str:
    """The local mirror of `remote` (made, checked and filled on first use).

    Raises:
        CheckpointStoreError: `remote` cannot be listed, written or read.
    """
    if remote not in _MIRRORS:
        mirror = Mirror(remote)
        if not _MIRRORS:
            # Not atexit: s3fs resolves the endpoint's name in a thread pool, shut by then.
            before_thread_pools_end(functools.partial(_push_at_exit, os.getpid()))
        _MIRRORS[remote] = mirror
    return _MIRRORS[remote].local


def push_mirrors(folder: str | None = None) -> None:
    """Pushes every mirror (or the one holding `folder`); a no-op where nothing is mirrored.

    Raises:
        CheckpointStoreError: A push failed (see `Mirror.push`).
    """
    for mirror in _MIRRORS.values():
        if folder is None or os.path.commonpath(
                [os.path.abspath(folder), mirror.local]) == mirror.local:
            mirror.push()


def _push_at_exit(pid: int) -> None:
    """The last push, at exit, in process `pid` only (forked workers inherit the hook); a
    failure exits with 1 (an exception at exit leaves the status 0)."""
    if os.getpid() != pid:
        return
    try:
        push_mirrors()
    except Exception as err:
        logging.getLogger(__name__).error("%s", err)
        logging.shutdown()  # os._exit skips the handlers that flush
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def read_json(path: str, *, optional: bool = False) -> Any:
    """The value of a local JSON file; with `optional`, None where there is no such file."""
    if optional and not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_json_atomically(path: str, payload: Any, *, sort_keys: bool = True,
                          allow_nan: bool = True, unique: bool = False) -> None:
    """Writes JSON under a temporary name, then renames it: whole or not at all
    (`allow_nan=False` refuses NaN and infinities; `unique`: `write_text_atomically`'s)."""
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=sort_keys,
                                           allow_nan=allow_nan) + "\n", unique=unique)


def write_text_atomically(path: str, text: str, unique: bool = False) -> None:
    """Writes a text file under a temporary name, then renames it: whole or not at all. The
    temporary is `.tmp-<name>`, or with `unique` one of its own (`mkstemp`: processes saving
    one file at once never rename each other's away), removed if the write fails."""
    folder, name = os.path.split(path)
    temporary, handle = os.path.join(folder, TMP_PREFIX + name), None
    if unique:  # written through mkstemp's own handle: the temporary is opened once
        handle, temporary = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{name}.", dir=folder or os.curdir)
    try:
        with open(temporary, "w") if handle is None else os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        raise
