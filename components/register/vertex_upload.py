"""KFP faces of the Vertex upload (GCPC's artifact types: only a Vertex compile imports it)."""
# Docstrings: one line per parameter, shown as the console's help (as in component.py).
# ruff: noqa: E501

from typing import NamedTuple

from google_cloud_pipeline_components.types.artifact_types import (
    UnmanagedContainerModel,
    VertexModel,
)
from kfp.dsl import Input, Model, Output


def serving_model(
    model: Input[Model],
    serving_image: str,
    unmanaged_model: Output[UnmanagedContainerModel],
    subdir: str = "saved_model",
    run_name: str = "",
    port: int = 0,
    health_route: str = "",
    predict_route: str = "",
) -> NamedTuple("Outputs", [("labels", dict)]):
    """Turns the trained model into the artifact `ModelUploadOp` takes, and its labels.

    Args:
        model: The trainer's model folder.
        serving_image: Prediction container that serves it (a Vertex prebuilt TensorFlow image, or your own).
        unmanaged_model: The served files and their serving container, for the Model Registry.
        subdir: Folder inside the model that is served ("." for all of it).
        run_name: The pipeline run, recorded as the model version's "pipeline_run" label.
        port: Port the serving container listens on; 0 for Vertex's default (8080).
        health_route: Health-check path of a custom serving container (it gets startup and health probes that allow 20 minutes for loading the model); empty for the default.
        predict_route: Prediction path of a custom serving container; empty for the default.

    Returns:
        labels: Model Registry labels: the run, the data's sha256 prefix and the git sha.
    """
    from collections import namedtuple

    from components.register.registration import container_spec, copy_serving_model, model_labels

    copy_serving_model(model.path, subdir, unmanaged_model.path)
    unmanaged_model.metadata["containerSpec"] = container_spec(serving_image, port,
                                                               health_route, predict_route)
    for key in ("git_sha", "data_sha256", "classes"):
        if key in model.metadata:
            unmanaged_model.metadata[key] = model.metadata[key]
    return namedtuple("Outputs", ["labels"])(model_labels(run_name, model.metadata))


def find_registered_model(
    display_name: str,
    location: str,
    project: str,
    parent: Output[VertexModel],
) -> NamedTuple("Outputs", [("exists", bool)]):
    """Looks up the Model Registry model the upload adds a version to.

    Args:
        display_name: Display name the pipeline uploads its model under.
        location: Vertex region of the Model Registry.
        project: Google Cloud project of the Model Registry.
        parent: The existing model (its resource name in metadata), when there is one.

    Returns:
        exists: True when a model with this display name exists: the upload becomes its new version.
    """
    from collections import namedtuple

    from components.register.registration import find_model

    name = find_model(display_name, project, location)
    print(f"{display_name!r}: " + (f"new version of {name}" if name else "no such model yet: "
                                   "the upload creates it"))
    if name:
        parent.metadata["resourceName"] = name
        parent.uri = f"https://{location}-aiplatform.googleapis.com/v1/{name}"
    return namedtuple("Outputs", ["exists"])(name is not None)
