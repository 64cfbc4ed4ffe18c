"""KFP faces of the tracking step: one MLflow run per pipeline run, after training."""

from kfp.dsl import Artifact, Input, Model


def track_classifier(
    model: Input[Model],
    evaluation: Input[Artifact],
    tracking_uri: str,
    run_name: str,
    experiment: str,
    kind: str,
) -> str:
    """Logs a classifier's run to MLflow: parameters, per-epoch series, test metrics, provenance.

    Args:
        model: The trainer's model folder (its history and metadata).
        evaluation: The evaluation step's folder holding metrics.json.
        tracking_uri: MLflow server URL (http/https), sqlite:///FILE, or a gs:// or local folder (a file store).
        run_name: The MLflow run's name: the pipeline run's.
        experiment: MLflow experiment, created when missing: the pipeline's name.
        kind: "image" (DenseNet history) or "text" (ULMFiT history).

    Returns:
        The MLflow run id.
    """
    from components.common.metrics import read_evaluation
    from components.track.tracking import image_record, log_run, text_record

    records = {"image": image_record, "text": text_record}
    if kind not in records:
        raise ValueError(f"kind must be one of {sorted(records)}, got {kind!r}")
    record = records[kind](model.path, model.metadata, model.uri,
                           read_evaluation(evaluation.path))
    run_id = log_run(tracking_uri, experiment, run_name, record, {"pipeline": experiment})
    print(f"MLflow run {run_id} ({run_name!r} in experiment {experiment!r}): "
          f"{len(record.params)} parameters, {len(record.series)} series, "
          f"{len(record.metrics)} test metrics")
    return run_id


def track_language_model(
    lm_assets: Input[Artifact],
    tracking_uri: str,
    run_name: str,
    experiment: str,
) -> str:
    """Logs a language model's run to MLflow: its config, per-epoch series per direction, final perplexity.

    Args:
        lm_assets: The language model trainer's assets folder (lm_metrics.json and metadata).
        tracking_uri: MLflow server URL (http/https), sqlite:///FILE, or a gs:// or local folder (a file store).
        run_name: The MLflow run's name: the pipeline run's.
        experiment: MLflow experiment, created when missing: the pipeline's name.

    Returns:
        The MLflow run id.
    """
    from components.track.tracking import lm_record, log_run

    record = lm_record(lm_assets.path, lm_assets.metadata, lm_assets.uri)
    run_id = log_run(tracking_uri, experiment, run_name, record, {"pipeline": experiment})
    print(f"MLflow run {run_id} ({run_name!r} in experiment {experiment!r}): "
          f"{len(record.params)} parameters, {len(record.series)} series")
    return run_id
