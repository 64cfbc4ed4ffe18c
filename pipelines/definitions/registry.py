"""The Model Registry part of a pipeline: upload a model that cleared the gate, as a new
version of the model with the same display name when one exists (Vertex only)."""

from kfp import dsl

from components.register import component as register_component

# Filled in by Vertex at run time: the project and region the pipeline runs in.
PIPELINE_LOCATION = "{{$.pipeline_google_cloud_location}}"
PIPELINE_PROJECT = "{{$.pipeline_google_cloud_project_id}}"


def local_registration(would_register: bool) -> dict:
    """The `registration` section of a local run's summary: the gate's decision only."""
    return {"would_register": bool(would_register), "uploaded": False,
            "note": "the local run never uploads to the Vertex Model Registry"}


def add_upload(image: str, gate, model, display_name, serving_image: str,
               encryption_spec_key_name: str, **serving) -> None:
    """Adds, inside a pipeline body, the steps that upload `model` when `gate` says so.

    Under the gate's condition: `serving-model` (the served files, their container and
    the run/data labels), `find-registered-model` (the display name's model, if any),
    then one of two `ModelUploadOp`s: `register-model-version` with `parent_model` when
    the model exists, `register-model` creating it otherwise.

    Args:
        image: The runtime image of the light steps.
        gate: The registration gate task (its "Output" is the decision).
        model: The trained model output to upload.
        display_name: The Model Registry display name (a pipeline parameter).
        serving_image: The pinned image that serves the model.
        encryption_spec_key_name: CMEK key for the model, or "".
        **serving: More `serving_model` arguments (subdir, port, routes).
    """
    from google_cloud_pipeline_components.v1.model import ModelUploadOp

    serving_op = register_component.build_serving_model(image)
    find_op = register_component.build_find_model(image)
    with dsl.If(gate.outputs["Output"] == True, name="model-clears-threshold"):  # noqa: E712
        served = serving_op(model=model, serving_image=serving_image,
                            run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, **serving,
                            ).set_display_name("serving-model")
        found = find_op(display_name=display_name, location=PIPELINE_LOCATION,
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
