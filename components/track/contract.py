"""What other steps may know of the tracking step: which tracking URIs it takes, and which
run KFP made for a step."""

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


# What KFP 2.17's MLflow plugin puts in a task's container when its settings say
# `injectUserEnvVars` (kubeflow/pipelines backend/src/v2/common/plugins/mlflow/handler.go,
# `RetrieveUserContainerEnvVars`): the task's own run, which the driver created nested under
# the pipeline run's (tag `mlflow.parentRunId`, `ParentRunTagKey` in common/plugins/mlflow/
# client.go) and the launcher ends. A retried pod keeps it, and a retried KFP run reopens it
# (apiserver/plugins/mlflow/run_start.go, `RunSyncModeRetry`). Also MLFLOW_EXPERIMENT_ID and
# the auth variables MLflow's client reads itself.
KFP_RUN_VARIABLE, KFP_URI_VARIABLE = "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"


def platform_run(tracking_uri: str, environ: Mapping[str, str]) -> str:
    """The MLflow run KFP made for this step, where it is in the store `tracking_uri` names.

    `tracking_uri` wins over KFP's URI: a run id means nothing in another store, and the
    pipeline runs its MLflow steps only when the user set `tracking_uri`, so a different one
    is their choice; the step then logs as without KFP's run, and says so.

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
