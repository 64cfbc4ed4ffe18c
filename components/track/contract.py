"""What other steps may know of the tracking step: the tracking URIs it takes, and the run
KFP made for a step."""

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
        environ: The step's environment (`os.environ` when None): whether gs:// is mounted.

    Raises:
        TrackingError: An unknown scheme, or gs:// where no bucket is mounted.
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


# What KFP 2.17's MLflow plugin (plugins/mlflow/handler.go) gives a task: its own run,
# nested under the pipeline run's, which KFP's launcher ends; a retried pod keeps it.
KFP_RUN_VARIABLE, KFP_URI_VARIABLE = "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"


def platform_run(tracking_uri: str, environ: Mapping[str, str]) -> str:
    """The MLflow run KFP made for this step, where it is in the store `tracking_uri`
    names (the user's `tracking_uri` wins over KFP's: the step then says so).

    Args:
        tracking_uri: The step's `tracking_uri`.
        environ: The step's environment.

    Returns:
        The run's id, or "" (no run injected, or one in another store).
    """
    run_id, uri = environ.get(KFP_RUN_VARIABLE, ""), environ.get(KFP_URI_VARIABLE, "")
    if not run_id:
        return ""
    if uri.rstrip("/") != tracking_uri.rstrip("/"):
        print(f"KFP's MLflow run {run_id} is in {uri}, not in tracking_uri {tracking_uri}: "
              f"left alone (give tracking_uri={uri} to log into it)")
        return ""
    print(f"logging into KFP's MLflow run {run_id} of this step, in {uri}")
    return run_id
