"""Loaded only by the step processes `rehearsal` starts (it puts this folder on
PYTHONPATH): points KFP's mount prefixes at the rehearsal's stand-in folders, so
`artifact.path` and `components.common.storage.local_path` land there. On Vertex, the
Cloud Storage FUSE prefix (`/gcs/`) is the rehearsal's gcs/ folder; on open-source KFP,
`/gcs/`, `/minio/` and `/s3/` are folders of the pod, which a rehearsal makes afresh for
each attempt. Nothing else changes; outside a rehearsal this file is never imported.

A step's process ends once its outputs are written: at exit (this handler, registered
first, runs last) every object leaves the garbage collector's reach, so that teardown
skips its full collections (~2 s in a process that imported torch or TensorFlow, against
~0.3 s; tests/site/sitecustomize.py does the same for the tests' other processes).
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
