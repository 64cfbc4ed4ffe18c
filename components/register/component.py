"""KFP faces of the registration gate and of MLflow registration (Vertex's: `vertex_upload`)."""

from typing import NamedTuple

from kfp.dsl import Artifact, Input, Markdown, Model, Output


def registration_gate(
    evaluation: Input[Artifact],
    decision: Output[Markdown],
    metric: str,
    threshold: float,
    enabled: bool = True,
    beat_baselines: bool = False,
) -> bool:
    """Says whether the evaluated model is good enough to register.

    Args:
        evaluation: The evaluation step's folder holding metrics.json.
        decision: The decision and its reason, shown in the console either way.
        metric: Top-level number of metrics.json compared with the threshold, e.g. "accuracy", "micro_f1" or "macro_f1" (each pipeline has its own default).
        threshold: Register when the metric is at least this.
        enabled: False never registers.
        beat_baselines: Also require the metric above every cheap baseline the evaluation scored on the same split (logistic regression on TF-IDF or downscaled pixels, and the constant answer).

    Returns:
        True when the model should be uploaded to the Model Registry.
    """
    from components.common.metrics import read_evaluation
    from components.register.registration import gate

    register, reason = gate(read_evaluation(evaluation.path), metric, threshold, enabled,
                            beat_baselines)
    print(reason)
    verdict = "registered" if register else "not registered"
    with open(decision.path, "w") as f:
        f.write(f"# Model Registry: {verdict}\n\n{reason}\n")
    decision.metadata.update({"register": register, "reason": reason, "metric": metric,
                              "threshold": threshold, "beat_baselines": beat_baselines})
    return register


def register_in_mlflow(
    model: Input[Model],
    registered: Output[Artifact],
    tracking_uri: str,
    model_display_name: str,
    kind: str,
    serving_image: str = "",
    run_name: str = "",
) -> NamedTuple("Registered", [("version", str)]):
    """Registers the model in MLflow's Model Registry and writes the KServe InferenceService that serves it (where there is no Vertex Model Registry).

    Args:
        model: The trainer's model folder.
        registered: Output folder: inferenceservice.yaml (kubectl apply -f it) and, for image models, the SavedModel in TF Serving's numbered layout (served/1/).
        tracking_uri: MLflow tracking server URL (http/https) or sqlite:///FILE; its Model Registry gets the version.
        model_display_name: The registered model's name (a later run adds a version); also names the InferenceService.
        kind: "image" (served by KServe's TensorFlow Serving runtime) or "text"/"transformer" (served by the runtime image's own server).
        serving_image: The image that serves text models (the runtime image); unused for image models.
        run_name: The pipeline run, recorded as a tag of the version.

    Returns:
        version: The MLflow model version, which the alias "challenger" now names.
    """
    import os
    from collections import namedtuple

    import yaml

    from components.register import mlflow_registry as registry
    from components.register.registration import model_labels
    from components.track.contract import platform_run

    if kind == "image":
        source = registered.uri.rstrip("/") + "/" + registry.SERVED_FOLDER
        registry.stage_tf_serving(model.path, os.path.join(registered.path,
                                                           registry.SERVED_FOLDER))
    else:
        source = model.uri
    source = registry.served_uri(source)
    tags = model_labels(run_name, model.metadata)
    version = registry.register_version(tracking_uri, model_display_name, source, tags,
                                        platform_run(tracking_uri, os.environ))
    name = registry.service_name(model_display_name)
    manifest = registry.inference_service(name, kind, source, serving_image, {
        "mlflow-model": name, "mlflow-version": version})
    os.makedirs(registered.path, exist_ok=True)
    with open(os.path.join(registered.path, registry.MANIFEST_FILE), "w") as f:
        yaml.safe_dump(manifest, f, sort_keys=False)
    registered.metadata.update({"mlflow_model": model_display_name, "version": version,
                                "alias": registry.ALIAS, "storage_uri": source,
                                "inference_service": name})
    print(f"registered {model_display_name} version {version} ({registry.ALIAS}) in "
          f"{tracking_uri}; serve it: kubectl apply -f {registered.uri}/{registry.MANIFEST_FILE}")
    return namedtuple("Registered", ["version"])(version)


def registration_skipped(reason: str, note: Output[Markdown]) -> None:
    """Says in the run why a model that cleared the gate was not registered.

    Args:
        reason: What was missing and how to register next time.
        note: The reason, shown in the run's console.
    """
    print(reason)
    with open(note.path, "w") as f:
        f.write(f"# Model Registry: nothing registered\n\n{reason}\n")
    note.metadata["reason"] = reason
