"""KFP faces of the registration gate and of the model handed to `ModelUploadOp`."""

from google_cloud_pipeline_components.types.artifact_types import UnmanagedContainerModel
from kfp import dsl
from kfp.dsl import Artifact, Input, Model, Output


def registration_gate(
    evaluation: Input[Artifact],
    metric: str = "accuracy",
    threshold: float = 0.8,
    enabled: bool = True,
) -> bool:
    """Says whether the evaluated model is good enough to register.

    Args:
        evaluation: The evaluation step's folder holding metrics.json.
        metric: Top-level number of metrics.json compared with the threshold, e.g. "accuracy" or "macro_f1".
        threshold: Register when the metric is at least this.
        enabled: False never registers.

    Returns:
        True when the model should be uploaded to the Model Registry.
    """
    from components.common.metrics import read_evaluation
    from components.register.registration import gate

    register, reason = gate(read_evaluation(evaluation.path), metric, threshold, enabled)
    print(reason)
    return register


def serving_model(
    model: Input[Model],
    serving_image: str,
    unmanaged_model: Output[UnmanagedContainerModel],
    subdir: str = "saved_model",
):
    """Turns the trained model's SavedModel into the artifact `ModelUploadOp` takes.

    Args:
        model: The trainer's model folder.
        serving_image: Prediction container that serves it (a Vertex prebuilt TensorFlow image, or your own).
        unmanaged_model: The SavedModel and its serving container, for the Model Registry.
        subdir: Folder inside the model that is served.
    """
    from components.register.registration import copy_serving_model

    copy_serving_model(model.path, subdir, unmanaged_model.path)
    unmanaged_model.metadata["containerSpec"] = {"imageUri": serving_image}
    for key in ("git_sha", "data_sha256", "classes"):
        if key in model.metadata:
            unmanaged_model.metadata[key] = model.metadata[key]


def build_gate(image: str):
    """The registration gate component, run in the container `image`."""
    return dsl.component(registration_gate, base_image=image, install_kfp_package=False)


def build_serving_model(image: str):
    """The serving-model component, run in the container `image`."""
    return dsl.component(serving_model, base_image=image, install_kfp_package=False)
