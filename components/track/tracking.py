"""One MLflow run per pipeline run, read back from what the trainers wrote: a light step
after training, so a tracking server down or slow cannot fail or stall a GPU job."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Mapping
from typing import Any
from unittest import mock
from urllib.parse import urlparse

from components.common.storage import gcs_mount_prefix, local_path, read_json
from components.track.contract import TrackingError, check_tracking_uri, platform_run

# Tags every run carries; `pipeline_run` finds a retried step's earlier run.
RUN_TAG = "pipeline_run"
# MLflow 3's opt-in for its file store (folders and gs:// stores).
FILE_STORE_SWITCH = "MLFLOW_ALLOW_FILE_STORE"
# MLflow's per-request limits of `log_batch`.
_BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
_PARAM_CHARS = 6000


@dataclasses.dataclass
class RunRecord:
    """What one pipeline run logs: parameters (as text), per-epoch `series` of
    `(step, value)`, final metrics (`test_...`), provenance tags."""

    params: dict[str, str]
    series: dict[str, list[tuple[int, float]]]
    metrics: dict[str, float]
    tags: dict[str, str]


def tracking_store(uri: str) -> str:
    """The MLflow tracking URI for a pipeline's `tracking_uri` parameter.

    Args:
        uri: An MLflow server or database URL, a local folder, or a gs:// folder.

    Returns:
        A URI `mlflow.MlflowClient` takes.

    Raises:
        TrackingError: An unknown scheme, or gs:// where no /gcs mount exists.
    """
    check_tracking_uri(uri)
    scheme = urlparse(uri).scheme
    if scheme == "gs":
        mount = gcs_mount_prefix()
        if not os.path.isdir(mount):
            raise TrackingError(
                f"tracking_uri {uri!r}: a bucket folder is written through Vertex's {mount} "
                "mount, which this machine lacks; give an MLflow server URL or a local folder")
        return "file://" + local_path(uri)
    return uri if scheme else "file://" + os.path.abspath(uri)


def _param_text(value: Any) -> str:
    # Artifact metadata is a protobuf Struct: its whole numbers come back as 3.0.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:_PARAM_CHARS]


def _test_metrics(evaluation: Mapping[str, Any] | None) -> dict[str, float]:
    if evaluation is None:
        return {}
    from components.common.metrics import scalar_summary

    return {f"test_{name}": value for name, value in scalar_summary(evaluation).items()}


def _add_row(series: dict[str, list[tuple[int, float]]], step: int, row: Mapping[str, Any],
             skip: tuple[str, ...], prefix: str = "") -> None:
    """Appends each number of a history row (not in `skip`) to `series[prefix + name]`."""
    for name, value in row.items():
        if name not in skip and isinstance(value, (int, float)) and not isinstance(value, bool):
            series.setdefault(prefix + name, []).append((step, float(value)))


def _record(metadata: Mapping[str, Any], uri: str, series: dict[str, list[tuple[int, float]]],
            metrics: dict[str, float], params: str = "parameters", **tags: str) -> RunRecord:
    """A run record: `metadata[params]` as text, `series`, `metrics`, provenance and `tags`."""
    provenance = {key: str(metadata[key]) for key in ("git_sha", "data_sha256", "framework",
                                                      "architecture", "arch", "precision")
                  if metadata.get(key) is not None}
    return RunRecord({k: _param_text(v) for k, v in metadata.get(params, {}).items()}, series,
                     metrics, {"model_uri": uri, **provenance, **tags})


def image_record(model_dir: str, metadata: Mapping[str, Any], model_uri: str,
                 evaluation: Mapping[str, Any] | None) -> RunRecord:
    """The run record of the DenseNet trainer: Keras history per epoch, numbered across
    both phases (the `phases` tag says where each starts).

    Args:
        model_dir: The trainer's model folder (holds history.json).
        metadata: The model artifact's metadata (parameters, git sha, data sha256).
        model_uri: The model artifact's URI.
        evaluation: The evaluation's metrics.json, or None.
    """
    from components.train_image.contract import HISTORY_FILE

    history = read_json(os.path.join(model_dir, HISTORY_FILE))
    series: dict[str, list[tuple[int, float]]] = {}
    phases, step = [], 0
    for phase, rows in history.items():
        if rows:
            phases.append(f"{phase} from epoch {rows[0].get('epoch', step)}")
        for row in rows:
            step = int(row.get("epoch", step))
            _add_row(series, step, row, ("epoch",))
            step += 1
    return _record(metadata, model_uri, series, _test_metrics(evaluation),
                   phases="; ".join(phases))


def text_record(model_dir: str, metadata: Mapping[str, Any], model_uri: str,
                evaluation: Mapping[str, Any] | None) -> RunRecord:
    """The run record of the ULMFiT classifier: `lm/<metric>` and `classifier/<metric>`
    series, each counting its own epochs from 1.

    Args:
        model_dir, metadata, model_uri, evaluation: As `image_record`'s (the model folder
            holds metrics.json).
    """
    from components.text_common.contract import TRAINING_METRICS_FILE

    training = read_json(os.path.join(model_dir, TRAINING_METRICS_FILE))
    series: dict[str, list[tuple[int, float]]] = {}
    counts: dict[str, int] = {}
    for row in training["history"]:
        step = counts[row["model"]] = counts.get(row["model"], 0) + 1
        _add_row(series, step, row, ("epoch", "stage", "model"), f"{row['model']}/")
    return _record(metadata, model_uri, series, _test_metrics(evaluation),
                   precision=str(training["run"].get("precision")),
                   unfreeze=_param_text(training["run"].get("unfreeze")))


def lm_record(assets_dir: str, metadata: Mapping[str, Any], assets_uri: str) -> RunRecord:
    """The run record of the language model trainer: `lm/<metric>` (forward) and
    `lm_backward/<metric>` series, and the held-out final metrics.

    Args:
        assets_dir: The LM assets folder (holds lm_metrics.json).
        metadata: The assets artifact's metadata (config, corpus sha256).
        assets_uri: The assets artifact's URI.
    """
    from components.train_lm.contract import METRICS_FILE

    result = read_json(os.path.join(assets_dir, METRICS_FILE))
    series: dict[str, list[tuple[int, float]]] = {}
    final: dict[str, float] = {}
    for direction, run in result["directions"].items():
        prefix = "lm" if direction == "forward" else f"lm_{direction}"
        for row in run["history"]:
            _add_row(series, row["epoch"], row, ("epoch",), f"{prefix}/")
        for name in ("perplexity", "accuracy", "valid_loss"):
            if run.get(name) is not None:
                final[f"{prefix}/final_{name}"] = float(run[name])
    corpus = metadata.get("corpus", {})
    data = {"data_sha256": str(corpus["sha256"])} if corpus.get("sha256") else {}
    return _record(metadata, assets_uri, series, final, "config", **data)


def log_run(tracking_uri: str, experiment: str, run_name: str, record: RunRecord,
            extra_tags: Mapping[str, str] = (),
            environ: Mapping[str, str] | None = None) -> str:
    """Logs a run record as one MLflow run named `run_name` in `experiment` (an earlier
    attempt's deleted first), or into the run KFP's MLflow plugin made for the step (a retry
    logs there only what an earlier attempt did not).

    Args:
        tracking_uri: The pipeline's `tracking_uri` (see `tracking_store`).
        experiment: MLflow experiment name; created when missing.
        run_name: The pipeline run's name.
        record: What to log.
        extra_tags: More tags.
        environ: The step's environment (`os.environ` when None), naming KFP's run.

    Returns:
        The MLflow run id.
    """
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    kfp_run = platform_run(tracking_uri, os.environ if environ is None else environ)
    store = tracking_store(tracking_uri)
    tags = {RUN_TAG: run_name, **record.tags, **dict(extra_tags)}
    # MLflow 3's file store switch, on for the step's own calls only
    with (mock.patch.dict(os.environ, {FILE_STORE_SWITCH: "true"})
          if store.startswith("file://") else contextlib.nullcontext()):
        client = MlflowClient(tracking_uri=store)
        logged, params_logged = set(), {}
        if kfp_run:  # a retried pod gets the same run: skip what an earlier attempt logged
            run_id, data = kfp_run, client.get_run(kfp_run).data
            logged = {(key, m.step) for key in data.metrics
                      for m in client.get_metric_history(run_id, key)}
            params_logged = data.params
            client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])
        else:
            run_id = _new_run(client, experiment, run_name, tags)
        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, points in record.series.items()
                   for step, value in points]
        metrics += [Metric(name, value, now, 0) for name, value in record.metrics.items()]
        metrics = [m for m in metrics if (m.key, m.step) not in logged]
        params = [Param(name, value) for name, value in record.params.items()
                  if name not in params_logged]
        for kind, items in (("metrics", metrics), ("params", params)):
            size = _BATCH_LIMITS[kind]
            for start in range(0, len(items), size):
                client.log_batch(run_id, **{kind: items[start:start + size]})
        if not kfp_run:  # KFP's launcher ends its run with the task's state
            client.set_terminated(run_id)
    return run_id


def _new_run(client, experiment: str, run_name: str, tags: dict[str, str]) -> str:
    """A new run in `experiment` (created when missing), after deleting earlier attempts'."""
    from mlflow.exceptions import MlflowException

    try:
        experiment_id = client.create_experiment(experiment)
    except MlflowException:  # it exists (or another run created it meanwhile)
        experiment_id = client.get_experiment_by_name(experiment).experiment_id
    for run in client.search_runs([experiment_id],
                                  filter_string=f"tags.{RUN_TAG} = '{run_name}'"):
        client.delete_run(run.info.run_id)
    return client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
