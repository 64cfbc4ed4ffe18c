"""Loaded only by the step processes `rehearsal` starts (it puts this folder on
PYTHONPATH): points KFP's Cloud Storage FUSE prefix (`/gcs/`, which Vertex mounts) at the
rehearsal's stand-in folder, so `artifact.path` and `components.common.storage.local_path`
land there. Nothing else changes; outside a rehearsal this file is never imported.
"""

import os

_root = os.environ.get("REHEARSAL_GCS_MOUNT")
if _root:
    from kfp.dsl.types import artifact_types

    artifact_types._GCS_LOCAL_MOUNT_PREFIX = _root.rstrip("/") + "/"
