"""What a trained model was made from (code version, data fingerprint, parameters), for
every `Model` artifact's metadata."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from components.common.storage import filesystem

# Set by the container images from their build argument (containers/*/Dockerfile).
GIT_SHA_ENV = "VERTEX_GPU_PIPELINES_GIT_SHA"


def git_sha() -> str:
    """The git commit the running image was built from ("unknown" outside an image)."""
    return os.environ.get(GIT_SHA_ENV) or "unknown"


def provenance(data_file: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """`{"git_sha", "data_sha256", "parameters"}`: a model's code, the hash of the file
    that pins its training data (a dataset's manifest) and its step's parameters."""
    fs, path = filesystem(data_file)  # local or gs://
    with fs.open(path, "rb") as f:
        data_sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return {"git_sha": git_sha(), "data_sha256": data_sha256, "parameters": dict(parameters)}
