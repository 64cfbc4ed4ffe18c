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
import os

atexit.register(gc.freeze)

_gcs = os.environ.get("REHEARSAL_GCS_MOUNT")
_pod = os.environ.get("REHEARSAL_POD_ROOT")
if _gcs or _pod:
    from kfp.dsl.types import artifact_types

    if _gcs:
        artifact_types._GCS_LOCAL_MOUNT_PREFIX = _gcs.rstrip("/") + "/"
    if _pod:
        for _name, _folder in (("_GCS_LOCAL_MOUNT_PREFIX", "gcs"),
                               ("_MINIO_LOCAL_MOUNT_PREFIX", "minio"),
                               ("_S3_LOCAL_MOUNT_PREFIX", "s3")):
            setattr(artifact_types, _name, os.path.join(_pod, _folder) + "/")
