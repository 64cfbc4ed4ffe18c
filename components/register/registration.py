"""Whether a trained model goes to the Vertex Model Registry, and what is uploaded (GCPC's
`ModelUploadOp` does the upload)."""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

from components.common.baselines import beats
from components.register.contract import gate_problems


def gate(metrics: dict[str, Any], metric: str, threshold: float, enabled: bool = True,
         beat_baselines: bool = False) -> tuple[bool, str]:
    """Decides whether the model clears the bar for registration.

    Args:
        metrics: The evaluation's `metrics.json`.
        metric: Name of a top-level number in it.
        threshold: The model is registered when `metrics[metric] >= threshold`.
        enabled: False never registers.
        beat_baselines: Also require `metric` above every baseline (`common.baselines`).

    Returns:
        `(register, reason)`: the decision and a sentence saying why.

    Raises:
        ValueError: `metric` is not a finite number, or the threshold not one in [0, 1].
    """
    numbers = sorted(k for k, v in metrics.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)
                     and math.isfinite(v))
    if metric not in numbers:
        found = "absent" if metric not in metrics else f"{metrics[metric]!r}, not a finite number"
        raise ValueError(f"registration metric {metric!r} is {found} in the evaluation's "
                         f"metrics; choose one of {numbers}")
    if problems := gate_problems(metric, threshold):
        raise ValueError("; ".join(problems))
    if not enabled:
        return False, "registration is switched off (register_model=false)"
    value = metrics[metric]
    # repr, not a rounded figure: 0.79996 must not read as 0.8000 < 0.8.
    if value < threshold:
        return False, f"{metric} = {value!r} < {threshold}: not registering"
    if beat_baselines:
        beaten, why = beats(metrics, metric)
        if not beaten:
            return False, f"{why}: not registering (beat_baselines is on)"
        return True, f"{metric} = {value!r} >= {threshold} and {why}: registering"
    return True, f"{metric} = {value!r} >= {threshold}: registering"


def copy_serving_model(model_dir: str, subdir: str, out_dir: str) -> None:
    """Copies the servable part of a model folder to `out_dir`, emptied first (a retry's).

    Raises:
        FileNotFoundError: `model_dir/subdir` does not exist.
        ValueError: `subdir` is empty or absolute (it would copy more than the model).
    """
    if not subdir or os.path.isabs(subdir) or ".." in subdir.split("/"):
        raise ValueError(f"subdir must be a folder inside the model (\".\" for all of it), "
                         f"got {subdir!r}")
    source = os.path.join(model_dir, subdir)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source} not found: the model folder has no {subdir!r} to serve")
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(source, out_dir)


# How long a custom serving container may take to load its model (a base-size encoder
# and torch take minutes on a cold replica).
STARTUP_ALLOWANCE_S = 1200
# Vertex: "period must be less than timeout"; 15 s lets a busy replica answer.
PROBE_PERIOD_S = 10
PROBE_TIMEOUT_S = 15
VERTEX_DEFAULT_PORT = 8080


def container_spec(serving_image: str, port: int = 0, health_route: str = "",
                   predict_route: str = "") -> dict[str, Any]:
    """The Model Registry's `containerSpec` (camelCase); a custom server (a `health_route`)
    gets startup and health probes and a deployment timeout sized for a large model.

    Args:
        serving_image: The prediction container's image URI.
        port: Port it listens on; 0 for Vertex's default (8080).
        health_route: Its health route; empty for a prebuilt image's default.
        predict_route: Its prediction route; empty for the default.
    """
    spec: dict[str, Any] = {"imageUri": serving_image}
    if port:
        spec["ports"] = [{"containerPort": port}]
    if predict_route:
        spec["predictRoute"] = predict_route
    if health_route:
        check = {"httpGet": {"path": health_route, "port": port or VERTEX_DEFAULT_PORT},
                 "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": PROBE_TIMEOUT_S}
        spec.update({
            "healthRoute": health_route,
            "startupProbe": {**check,
                             "failureThreshold": STARTUP_ALLOWANCE_S // PROBE_PERIOD_S},
            "healthProbe": {**check, "failureThreshold": 3},
            "deploymentTimeout": f"{STARTUP_ALLOWANCE_S + 600}s",
        })
    return spec


_LABEL_VALUE = re.compile(r"[^a-z0-9_-]+")


def model_labels(run_name: str, metadata: Mapping[str, Any]) -> dict[str, str]:
    """Model Registry labels (lowercase, digits, "_", "-"; the sha256 cut to 16 digits)
    naming the run (`run_name`) and the data and code (`metadata`) of a model version."""
    def value(text: str, length: int = 63) -> str:
        return _LABEL_VALUE.sub("-", str(text).lower())[:length].strip("-")

    labels = {"pipeline_run": value(run_name)}
    if metadata.get("data_sha256"):
        labels["data_sha256"] = value(metadata["data_sha256"], 16)
    if metadata.get("git_sha") and metadata["git_sha"] != "unknown":
        labels["git_sha"] = value(metadata["git_sha"], 12)
    return {k: v for k, v in labels.items() if v}


def find_model(display_name: str, project: str, location: str,
               credentials=None) -> str | None:
    """The resource name of the latest updated Model Registry model called `display_name`
    in `project` and `location` (`credentials`: None for the default), or None."""
    from google.cloud import aiplatform

    escaped = display_name.replace("\\", "\\\\").replace('"', '\\"')
    models = aiplatform.Model.list(filter=f'display_name="{escaped}"',
                                   order_by="update_time desc", project=project,
                                   location=location, credentials=credentials)
    return models[0].resource_name if models else None
