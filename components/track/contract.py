"""What other steps may know of the tracking step: which tracking URIs it takes."""

from __future__ import annotations

from urllib.parse import urlparse

# Stores MLflow's client writes to directly; gs:// becomes a file store under /gcs.
MLFLOW_SCHEMES = ("http", "https", "sqlite", "file", "postgresql", "mysql", "databricks")


class TrackingError(ValueError):
    """The tracking URI cannot be used; the message says what to give instead."""


def check_tracking_uri(uri: str) -> None:
    """Refuses a `tracking_uri` no tracking step could use (empty: no tracking).

    Raises:
        TrackingError: The scheme is not one MLflow writes to, gs:// or a local folder.
    """
    scheme = urlparse(uri).scheme
    if uri and scheme not in (*MLFLOW_SCHEMES, "gs", ""):
        raise TrackingError(f"tracking_uri {uri!r}: unknown scheme {scheme!r}; give an MLflow "
                            "server URL (http/https), a gs:// or local folder, or "
                            "sqlite:///FILE")
