"""What other steps may know of the tracking step: which tracking URIs it takes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlparse

# Stores MLflow's client writes to directly; gs:// becomes a file store under /gcs.
MLFLOW_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "databricks")


class TrackingError(ValueError):
    """The tracking URI cannot be used; the message says what to give instead."""


def check_tracking_uri(uri: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuses a `tracking_uri` no tracking step could use (empty: no tracking).

    Args:
        uri: The pipeline's `tracking_uri`.
        environ: The step's environment (`os.environ` at call time when None): where it
            says gs:// is not mounted (open-source Kubeflow), a gs:// file store would be
            written into a scratch folder of the pod and lost.

    Raises:
        TrackingError: The scheme is not one MLflow writes to, gs:// or a local folder, or
            gs:// where no bucket is mounted.
    """
    from components.common.storage import MOUNTED_VARIABLE

    environ = os.environ if environ is None else environ
    scheme = urlparse(uri).scheme
    if uri and scheme not in (*MLFLOW_SCHEMES, "gs", ""):
        raise TrackingError(f"tracking_uri {uri!r}: unknown scheme {scheme!r}; give an MLflow "
                            "server URL (http/https), a gs:// or local folder, or "
                            "sqlite:///FILE")
    if scheme == "gs" and environ.get(MOUNTED_VARIABLE, "1") == "0":
        raise TrackingError(f"tracking_uri {uri!r}: a gs:// file store is written through "
                            "Vertex's /gcs mount; here /gcs is a scratch folder of the pod "
                            "and what is written there is lost. Give an MLflow server URL "
                            "(http/https) the pods reach")
