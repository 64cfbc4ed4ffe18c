"""The Model Registry part of a pipeline: upload a model that cleared the gate, as a new
version of the model with the same display name when one exists (Vertex only)."""

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from kfp import dsl

# Filled in by Vertex at run time: the project and region the pipeline runs in.
PIPELINE_LOCATION = "{{$.pipeline_google_cloud_location}}"
PIPELINE_PROJECT = "{{$.pipeline_google_cloud_project_id}}"
# Where the fastai image's server (`pipelines.serve`) listens when Vertex serves a text model.
SERVING_PORT = 8080
SERVING_ROUTES = {"health_route": "/health", "predict_route": "/predict"}
RUNTIME_SERVING = {"subdir": ".", "port": SERVING_PORT, **SERVING_ROUTES}


class UploadOps(NamedTuple):
    """The upload's `serving_model` and `find_registered_model` components, serving image
    and more `serving_model` arguments (subdir, port, routes)."""

    serving_model: Callable
    find_model: Callable
    serving_image: str
    serving: Mapping[str, Any]


def local_registration(would_register: bool) -> dict:
    """The `registration` section of a local run's summary: the gate's decision only."""
    return {"would_register": bool(would_register), "uploaded": False,
            "note": "the local run never uploads to the Vertex Model Registry"}


def add_upload(ops: UploadOps, gate, model, display_name,
               encryption_spec_key_name: str) -> None:
    """Adds the steps that upload `model` when `gate` says so: a new version of the model
    of `display_name` when one exists, else a new model.

    Args:
        ops: The light steps' components and the serving container.
        gate: The registration gate task (its "Output" is the decision).
        model: The trained model output.
        display_name: The Model Registry display name (a pipeline parameter).
        encryption_spec_key_name: CMEK key for the model, or "".
    """
    from google_cloud_pipeline_components.v1.model import ModelUploadOp

    with dsl.If(gate.outputs["Output"] == True, name="model-clears-threshold"):  # noqa: E712
        served = ops.serving_model(model=model, serving_image=ops.serving_image,
                                   run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, **ops.serving,
                                   ).set_display_name("serving-model")
        found = ops.find_model(display_name=display_name, location=PIPELINE_LOCATION,
                               project=PIPELINE_PROJECT).set_display_name("find-registered-model")
        found.set_caching_options(False)  # the registry changes between runs
        upload = {"display_name": display_name, "location": PIPELINE_LOCATION,
                  "unmanaged_container_model": served.outputs["unmanaged_model"],
                  "labels": served.outputs["labels"],
                  "encryption_spec_key_name": encryption_spec_key_name}
        with dsl.If(found.outputs["exists"] == True, name="model-exists"):  # noqa: E712
            ModelUploadOp(parent_model=found.outputs["parent"], **upload,
                          ).set_display_name("register-model-version")
        with dsl.Else(name="new-model"):
            ModelUploadOp(**upload).set_display_name("register-model")
