"""Uniform access to local paths and object store URIs (gs://, s3://).

gs:// goes through fsspec/gcsfs (which honours `STORAGE_EMULATOR_HOST`, used by the
tests), never through the `gsutil` command or TensorFlow's own GCS client. s3:// (AWS, or
MinIO and Ceph through `AWS_ENDPOINT_URL`) goes through s3fs, with botocore's own
credentials chain (the environment, a mounted profile, the pod's role).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
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


def _gcs_options() -> dict:
    # Read at call time, not import: against an emulator there are no credentials.
    return {"token": "anon"} if os.environ.get("STORAGE_EMULATOR_HOST") else {}


def _s3_options() -> dict:
    # Read at call time: MinIO, Ceph and the tests' S3 server are named by an endpoint.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Returns the filesystem serving `uri` and the path inside it.

    Args:
        uri: A local path, a `gs://bucket/prefix` or an `s3://bucket/prefix` URI.

    Returns:
        `(fs, path)`: an fsspec filesystem and the path to pass to its methods.
    """
    if uri.startswith("gs://"):
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        return url_to_fs(uri, **_gcs_options())
    if uri.startswith("s3://"):
        return url_to_fs(uri, **_s3_options())
    return url_to_fs(os.path.abspath(uri))


def gcs_mount_prefix() -> str:
    """Where Vertex's Cloud Storage FUSE mount shows buckets: KFP's `/gcs/`.

    Asked of KFP at call time (an artifact's `path` for the bucket-less `gs://`), not
    copied, so that artifact paths and our own gs:// mapping always agree, also in
    `rehearsal`, which points KFP's prefix elsewhere.
    """
    from kfp.dsl import Artifact

    return Artifact(uri="gs://").path


def local_path(uri: str) -> str:
    """Maps a gs:// URI onto the Cloud Storage FUSE mount Vertex provides.

    Vertex mounts buckets at `/gcs/<bucket>/`, which is also how KFP exposes
    artifact paths, so outputs are written as ordinary files.

    Args:
        uri: A local path or a `gs://` URI.

    Returns:
        A local filesystem path.
    """
    if uri.startswith("gs://"):
        return gcs_mount_prefix() + uri[len("gs://"):]
    return uri


def run_folder(variable: str, output_path: str, default: str | None,
               environ: Mapping[str, str] | None = None) -> str:
    """A job folder Vertex names in `variable`, narrowed to this pipeline task.

    Vertex sets `AIP_CHECKPOINT_DIR` and `AIP_TENSORBOARD_LOG_DIR` (gs:// URIs) from the
    job's base output directory, a compile-time setting that every run of the pipeline
    shares. A sub-folder named after the task's output (`<pipeline job>/<task>`) keeps
    runs apart, while a restarted job of the same task, which gets the same output
    path, finds its own state again. gs:// is reached through the FUSE mount on Vertex.
    Where no object store is mounted (open-source Kubeflow: s3://, or gs:// with
    `OBJECT_STORE_MOUNTED=0`), the folder is a local mirror of the remote one
    (`mirrored_folder`): checked and pulled now, before any training, pushed whenever a
    state file is saved and at exit.

    Args:
        variable: The environment variable, e.g. "AIP_CHECKPOINT_DIR".
        output_path: The step's output artifact path (`.../<job>/<task>/<output>`).
        default: Returned when the variable is unset (e.g. a folder inside the output).
        environ: Environment to read; `os.environ` (at call time) when None.

    Returns:
        A local folder path, or `default`.

    Raises:
        CheckpointStoreError: The remote folder cannot be listed, written or read.
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


# Set to "0" where gs:// is not mounted at /gcs (open-source KFP's /gcs is a scratch folder
# the launcher fills; what is written there dies with the pod).
MOUNTED_VARIABLE = "OBJECT_STORE_MOUNTED"
# Files pushed after the others (a checkpoint's pointer, the trainers' state files and the
# transformer checkpoints' seal), so a pod killed mid-push leaves the remote pointing at a
# checkpoint that is whole.
_POINTERS = ("checkpoint", "run.json", "state.json", "lm_state.json", "sealed")
_MIRRORS: dict[str, Mirror] = {}  # remote -> its mirror in this process
# A push (or the check when a mirror is made) is tried this many times, waiting
# PUSH_BACKOFF_S, then twice that, ... in between: a store that hiccups (a 503, a MinIO
# restarting) costs seconds, one that stays down fails the step within about a minute.
PUSH_ATTEMPTS = 4
PUSH_BACKOFF_S = 2.0
# Errors no retry mends: no such bucket (or local file), no permission.
_PERMANENT = (FileNotFoundError, PermissionError)
_ADVICE = ("check that the bucket exists, that the step's credentials may list, write and "
           "delete there (Kubeflow: the --storage-secret keys) and that the store's endpoint "
           "answers (--s3-endpoint, AWS_ENDPOINT_URL_S3)")


class CheckpointStoreError(RuntimeError):
    """The object store folder a mirror keeps (checkpoints, TensorBoard logs) cannot be
    listed, written or pushed to: what the step saves would not outlive its pod."""


def _process_start(pid: int) -> str:
    """The start time of process `pid` (clock ticks since boot; "" without /proc): with
    the pid, a name no later process of the machine takes again."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22, after the name
    except (OSError, IndexError):
        return ""


def mirror_path(remote: str) -> str:
    """The local folder of this process's mirror of `remote` (not made here).

    Named by the remote and by the process that started the step's job in this pod: under
    torch's launcher (`torchrun`, `elastic_launch`; TORCHELASTIC_RUN_ID set) the DDP
    ranks are its children and share their parent's folder, as they share a checkpoint
    folder; any other process (the Keras and fastai trainers, a lone transformer process)
    is its own. Two unrelated processes of the machine naming the same remote never share
    one: each would pull, change and push the other's files.

    Args:
        remote: The gs:// or s3:// folder.
    """
    import hashlib

    pid = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else os.getpid()
    key = f"{remote.rstrip('/')}\n{pid}.{_process_start(pid)}"
    return os.path.join(tempfile.gettempdir(), "mirrors",
                        hashlib.sha1(key.encode()).hexdigest()[:16])


def _retrying(action: Callable[[], None], what: str) -> None:
    """Runs `action`, again after a failure (waiting PUSH_BACKOFF_S, then twice that, ...),
    at most PUSH_ATTEMPTS times; errors no retry mends (`_PERMANENT`) end it at once.

    Raises:
        CheckpointStoreError: The last failure, with `what` and the store's error.
    """
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
    """A local folder kept as a copy of an object store folder, for what must outlive a
    pod (checkpoints, TensorBoard logs) where the store is not mounted.

    The local folder is shared by the DDP ranks of the pod's job and by nothing else
    (`mirror_path`), filled once under a file lock. Only the first process (RANK 0, or no
    RANK) pushes. Made when a trainer asks for its folder, before it trains: the process
    that pushes checks there that it can write, list and delete in the remote folder, so
    a store it cannot keep anything in ends the step before hours of training are lost.

    Args:
        remote: The gs:// or s3:// folder.

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
        """Writes a small object in the remote folder, lists the folder, deletes it."""
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
        """Copies the remote folder here, less the temporaries in it: another process's
        probe (`_probe`), which it may remove between this listing and the copy (a DDP
        rank or another node pulling while rank 0 probes: NoSuchKey, not retried)."""
        if not self.fs.isdir(self.root):
            return
        keys = [key for key in self.fs.find(self.root)
                if not os.path.basename(key).startswith(TMP_PREFIX)]
        if keys:
            self.fs.get(keys, [os.path.join(self.local, key[len(self.root):].lstrip("/"))
                               for key in keys])

    def _local_files(self) -> dict[str, tuple[int, int, int]]:
        files = {}
        for folder, _, names in os.walk(self.local):
            for name in names:
                if not name.startswith(TMP_PREFIX):
                    path = os.path.join(folder, name)
                    stat = os.stat(path)
                    # the inode too: os.replace of a same-size file in one mtime tick
                    files[os.path.relpath(path, self.local)] = (
                        stat.st_size, stat.st_mtime_ns, stat.st_ino)
        return files

    def push(self) -> None:
        """Uploads what changed (pointers and state files last), then removes what the
        trainer removed: the remote never points at a checkpoint it does not hold.

        A failed upload is tried again (PUSH_ATTEMPTS, from the file that failed on). One
        that still fails raises, an epoch's push as well as the last: going on would train
        for hours while the store keeps nothing, and a retried pod would resume from an
        old checkpoint or none.

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
    """Pushes every mirror (or the one holding `folder`) to its object store folder.

    Called when a trainer saves its state (`run_state.save`), at a Keras epoch's end or a
    Trainer save, and at exit; a no-op where nothing is mirrored (Vertex, local runs).

    Raises:
        CheckpointStoreError: A push failed (see `Mirror.push`).
    """
    for mirror in _MIRRORS.values():
        if folder is None or os.path.commonpath(
                [os.path.abspath(folder), mirror.local]) == mirror.local:
            mirror.push()


def _push_at_exit(pid: int) -> None:
    """The last push, at exit (what changed since the trainer's last save: TensorBoard's
    last events, a checkpoint rotated out). Where it fails, the process exits with 1: an
    exception raised at exit is printed but leaves the exit status as it was (0 after a
    finished training), and the step must not pass with its state lost. Here, not in each
    trainer: it covers every trainer and every DDP rank 0, ending well or not, in one
    place. Only in the process that made the mirrors (`pid`): a forked child (a data
    loader's worker) inherits the hook, and multiprocessing runs it when the child ends.

    Args:
        pid: The process that registered the push.
    """
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
                          allow_nan: bool = True) -> None:
    """Writes JSON under a temporary name, then renames it: whole or not at all.

    A process killed mid-write leaves the previous file (or none), never half of one.
    `allow_nan=False` refuses NaN and infinities (not JSON) instead of writing them.
    """
    write_text_atomically(path, json.dumps(payload, indent=2, sort_keys=sort_keys,
                                           allow_nan=allow_nan) + "\n")


def write_text_atomically(path: str, text: str) -> None:
    """Writes a text file under a temporary name, then renames it: whole or not at all."""
    temporary = os.path.join(os.path.dirname(path), TMP_PREFIX + os.path.basename(path))
    with open(temporary, "w") as out:
        out.write(text)
    os.replace(temporary, path)
