"""Loaded only by the step processes `rehearsal` starts (this folder is on their
PYTHONPATH): points KFP's mount prefixes (`/gcs/`, `/minio/`, `/s3/`) at the rehearsal's
stand-in folders, so `artifact.path` and `storage.local_path` land there.

At exit (this handler, registered first, runs last) every object leaves the garbage
collector's reach, so teardown skips its full collections (~2 s after torch or TensorFlow).
"""

import atexit
import gc
import json
import os

atexit.register(gc.freeze)

# The step's mounts (`runtimes.step_env`): its path -> the local folder behind it.
_mounts = json.loads(os.environ.get("REHEARSAL_MOUNTS") or "{}")
if _mounts:
    from kfp.dsl.types import artifact_types

    for _name in ("_GCS_LOCAL_MOUNT_PREFIX", "_MINIO_LOCAL_MOUNT_PREFIX", "_S3_LOCAL_MOUNT_PREFIX"):
        _folder = _mounts.get(getattr(artifact_types, _name).rstrip("/"))
        if _folder:
            setattr(artifact_types, _name, _folder.rstrip("/") + "/")
