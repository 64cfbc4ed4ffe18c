"""Uniform access to local paths and object store URIs (gs://, s3://).

gs:// goes through fsspec/gcsfs (which honours `STORAGE_EMULATOR_HOST`, used by the
tests), never through the `gsutil` command or TensorFlow's own GCS client. s3:// (AWS, or
MinIO and Ceph through `AWS_ENDPOINT_URL`) goes through s3fs, with botocore's own
credentials chain (the environment, a mounted profile, the pod's role).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.core import url_to_fs

# Files being written carry this prefix until they are complete (then renamed).
TMP_PREFIX = ".tmp-"
# Object stores reached through fsspec rather than as local files.
REMOTE_SCHEMES = ("gs://", "s3://")


def is_remote(uri: str) -> bool:
    """Whether `uri` names an object store location (gs://, s3://), not a local path."""
    return uri.startswith(REMOTE_SCHEMES)


def _gcs_options() -> dict:
    # Read at call time, not import: against an emulator there are no credentials.
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return {"token": "anon"}
    return {}


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

    Read from KFP at call time (not copied) so that artifact paths and our own gs://
    mapping always agree, also in `rehearsal`, which points it elsewhere.
    """
    from kfp.dsl.types import artifact_types

    # KFP's private name: KFP offers the prefix under no public one.
    return artifact_types._GCS_LOCAL_MOUNT_PREFIX


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
    (`mirrored_folder`): pulled now, pushed whenever a state file is saved and at exit.

    Args:
        variable: The environment variable, e.g. "AIP_CHECKPOINT_DIR".
        output_path: The step's output artifact path (`.../<job>/<task>/<output>`).
        default: Returned when the variable is unset (e.g. a folder inside the output).
        environ: Environment to read; `os.environ` (at call time) when None.

    Returns:
        A local folder path, or `default`.
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


class Mirror:
    """A local folder kept as a copy of an object store folder, for what must outlive a
    pod (checkpoints, TensorBoard logs) where the store is not mounted.

    The local folder is the same for every process of the pod (a name derived from the
    remote), filled once under a file lock: the per-GPU processes of a DDP run share it as
    they share a checkpoint folder. Only the first process (RANK 0, or no RANK) pushes.

    Args:
        remote: The gs:// or s3:// folder.
    """

    def __init__(self, remote: str):
        import fcntl
        import hashlib

        self.remote = remote.rstrip("/")
        self.fs, self.root = filesystem(self.remote)
        digest = hashlib.sha1(self.remote.encode()).hexdigest()[:16]
        self.local = os.path.join(tempfile.gettempdir(), "mirrors", digest)
        os.makedirs(self.local, exist_ok=True)
        filled = os.path.join(self.local, f"{TMP_PREFIX}filled")
        with open(os.path.join(self.local, f"{TMP_PREFIX}lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(filled):
                if self.fs.isdir(self.root):
                    self.fs.get(self.root + "/", self.local + "/", recursive=True)
                open(filled, "w").close()
        self.pushed = self._local_files()

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
        trainer removed: the remote never points at a checkpoint it does not hold. A
        failed upload is logged and tried again at the next push, not raised: a store
        that hiccups must not end hours of training."""
        if os.environ.get("RANK", "0") != "0":
            return
        files = self._local_files()
        changed = [rel for rel, stat in files.items() if self.pushed.get(rel) != stat]
        try:
            for rel in sorted(changed, key=lambda rel: os.path.basename(rel) in _POINTERS):
                self.fs.put(os.path.join(self.local, rel), f"{self.root}/{rel}")
            for rel in set(self.pushed) - set(files):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(f"{self.root}/{rel}")
        except Exception as err:  # any store error: the next push retries all of it
            logging.getLogger(__name__).warning("could not push %s to %s (%s); the next "
                                                "push tries again", self.local, self.remote,
                                                err)
            return
        self.pushed = files


def mirrored_folder(remote: str) -> str:
    """The local mirror of `remote` (made, and filled once per pod, on first use)."""
    if remote not in _MIRRORS:
        if not _MIRRORS:
            atexit.register(push_mirrors)
        _MIRRORS[remote] = Mirror(remote)
    return _MIRRORS[remote].local


def push_mirrors(folder: str | None = None) -> None:
    """Pushes every mirror (or the one holding `folder`) to its object store folder.

    Called when a trainer saves its state (`run_state.save`), at a Keras epoch's end or a
    Trainer save, and at exit; a no-op where nothing is mirrored (Vertex, local runs).
    """
    for mirror in _MIRRORS.values():
        if folder is None or os.path.commonpath(
                [os.path.abspath(folder), mirror.local]) == mirror.local:
            mirror.push()


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
