"""Registration without a Vertex Model Registry: an MLflow model version (alias
`challenger`; promoting it to `champion` is a person's call) and the KServe
`InferenceService` that serves it (image models: TF Serving; text: the project's server)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from components.common.storage import filesystem
from components.train_image.contract import SAVED_MODEL_DIR

ALIAS = "challenger"
# tensorflow/serving's release matching the trainer's TensorFlow: every op is known.
TF_SERVING_VERSION = "2.21.0"
SERVED_FOLDER = "served"
MANIFEST_FILE = "inferenceservice.yaml"
# Where KServe's storage initializer puts a custom container's STORAGE_URI.
KSERVE_MODEL_MOUNT = "/mnt/models"
SERVER_PORT = 8080
# Knative Serving names a route after the service: KServe advises at most 45 characters.
_MAX_NAME = 45
# The text server's start-up window (a large model loads for minutes); Knative's progress
# deadline (600 s by default) is raised to the window plus a margin.
STARTUP_PERIOD_S, STARTUP_CHECKS = 10, 120
PROGRESS_DEADLINE = "serving.knative.dev/progress-deadline"


def served_uri(uri: str) -> str:
    """The URI KServe reads for an artifact URI (KFP's `minio://b/k` is its `s3://b/k`)."""
    return "s3://" + uri[len("minio://"):] if uri.startswith("minio://") else uri


def service_name(display_name: str) -> str:
    """A Kubernetes name for the InferenceService from the model's display name.

    Raises:
        ValueError: Nothing of the name is left (no letter or digit).
    """
    name = re.sub(r"[^a-z0-9-]+", "-", display_name.lower()).strip("-")[:_MAX_NAME].strip("-")
    if not name or not name[0].isalpha():
        name = f"m-{name}".strip("-")[:_MAX_NAME]
    if not re.search(r"[a-z0-9]", name.removeprefix("m")):
        raise ValueError(f"model_display_name {display_name!r} has no letter or digit to name "
                         "the InferenceService with")
    return name


def inference_service(name: str, kind: str, storage_uri: str, serving_image: str,
                      labels: Mapping[str, str]) -> dict[str, Any]:
    """The KServe v1beta1 `InferenceService` of one registered model version.

    Args:
        name: Its Kubernetes name (`service_name`).
        kind: "image" (TF Serving) or "text"/"transformer" (the project's server).
        storage_uri: The served folder.
        serving_image: The runtime image whose default command is the server (text).
        labels: Kubernetes labels.
    """
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if kind == "image":
        predictor: dict[str, Any] = {"model": {
            "modelFormat": {"name": "tensorflow"}, "runtimeVersion": TF_SERVING_VERSION,
            "storageUri": storage_uri}}
    else:
        env = {"STORAGE_URI": storage_uri, "AIP_STORAGE_URI": KSERVE_MODEL_MOUNT,
               "AIP_HTTP_PORT": str(SERVER_PORT), "AIP_HEALTH_ROUTE": "/health",
               "AIP_PREDICT_ROUTE": "/predict"}
        probe = {"httpGet": {"path": "/health", "port": SERVER_PORT},
                 "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": 5}
        predictor = {"containers": [{
            "name": "kserve-container", "image": serving_image,
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "ports": [{"containerPort": SERVER_PORT, "protocol": "TCP"}],
            "readinessProbe": probe,
            "startupProbe": {**probe, "failureThreshold": STARTUP_CHECKS},
        }]}
        metadata["annotations"] = {PROGRESS_DEADLINE: f"{STARTUP_PERIOD_S * STARTUP_CHECKS + 300}s"}
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": metadata, "spec": {"predictor": predictor}}


def stage_tf_serving(model_dir: str, out_dir: str, subdir: str = SAVED_MODEL_DIR) -> str:
    """Copies the image model's SavedModel into TF Serving's layout `<out_dir>/1/`.

    Returns:
        `out_dir`, the folder KServe's storageUri names.

    Raises:
        FileNotFoundError: The model folder has no SavedModel.
    """
    fs, root = filesystem(model_dir)
    source = root.rstrip("/") + "/" + subdir
    if not fs.isfile(source + "/saved_model.pb"):
        raise FileNotFoundError(f"{model_dir}/{subdir} has no saved_model.pb: not an image "
                                "model folder the trainer wrote")
    fs.get(source + "/", os.path.join(out_dir, "1") + "/", recursive=True)
    return out_dir


def register_version(tracking_uri: str, name: str, source: str,
                     tags: Mapping[str, str], run_id: str = "") -> str:
    """Adds a version of model `name` (created when new) of `source` with `tags` (and the
    step's MLflow `run_id`), and points the alias `challenger` at it.

    Returns:
        The version number, as MLflow gives it.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(name, source=source, tags=dict(tags),
                                          run_id=run_id or None)
    client.set_registered_model_alias(name, ALIAS, version.version)
    return str(version.version)
