"""MLflow tracking: the records the tracking step logs, the file store, and the URIs a
step can use. Whole runs are tracked where they already run, read back through MLflow's own
client: the image run in tests/test_run_local.py against a real MLflow server on 127.0.0.1
(SQLite backend), the text run in tests/test_text_pipeline.py and the language model in
tests/test_lm_pipeline.py in a file store (no run made only to be tracked)."""

import json
import os

import pytest
from mlflow import MlflowClient

from components.preflight.checks import check_tracking
from components.preflight.parameters import PreflightError
from components.track.contract import TrackingError, check_tracking_uri
from components.track.tracking import (
    FILE_STORE_SWITCH,
    RunRecord,
    image_record,
    log_run,
    tracking_store,
)
from tests.mlflow_reads import metric_history, only_run


def test_image_epochs_are_counted_across_the_head_and_fine_tune_phases(tmp_path):
    # early stopping ended the head phase after 2 of its epochs: fine-tuning went on at 2
    history = {"head": [{"epoch": 0, "loss": 2.0}, {"epoch": 1, "loss": 1.5}],
               "full": [{"epoch": 2, "loss": 1.2}]}
    (tmp_path / "history.json").write_text(json.dumps(history))
    record = image_record(str(tmp_path), {"parameters": {"epochs": 2.0}, "git_sha": "abc"},
                          "gs://b/model", None)
    assert record.series == {"loss": [(0, 2.0), (1, 1.5), (2, 1.2)]}
    assert record.tags == {"model_uri": "gs://b/model", "git_sha": "abc",
                           "phases": "head from epoch 0; full from epoch 2"}
    assert record.params == {"epochs": "2"} and record.metrics == {}


def test_a_retried_step_replaces_its_run_and_a_folder_is_a_file_store(tmp_path, monkeypatch):
    record = RunRecord(params={"epochs": "2"}, series={"loss": [(0, 1.0), (1, 0.5)]},
                       metrics={"test_accuracy": 0.9}, tags={"git_sha": "abc"})
    store = str(tmp_path / "mlruns")
    first = log_run(store, "exp", "pipeline-run-1", record)
    second = log_run(store, "exp", "pipeline-run-1", record)  # the step ran again
    assert FILE_STORE_SWITCH not in os.environ  # switched on for the step's own calls only
    monkeypatch.setenv(FILE_STORE_SWITCH, "true")  # as a reader of a file store sets it
    client = MlflowClient(tracking_uri=tracking_store(store))
    run = only_run(client, "exp", "pipeline-run-1")
    assert run.info.run_id == second != first
    assert metric_history(client, run, "loss") == [(0, 1.0), (1, 0.5)]
    assert client.get_run(first).info.lifecycle_stage == "deleted"


def test_tracking_uris_a_step_could_not_use_are_refused():
    for good in ("", "http://mlflow.internal:5000", "gs://b/mlruns", "sqlite:///m.db", "runs"):
        check_tracking_uri(good)
    with pytest.raises(TrackingError, match="unknown scheme 'ftp'"):
        check_tracking_uri("ftp://host/mlruns")
    with pytest.raises(PreflightError, match="tracking_uri 's3://b/m'"):
        check_tracking({"tracking_uri": "s3://b/m"})
    # gs:// is a file store through Vertex's /gcs mount; here there is none
    with pytest.raises(TrackingError, match="mount, which this machine lacks"):
        tracking_store("gs://bucket/mlruns")
    # open-source KFP's pods have a /gcs, a scratch folder: refused there, not lost
    kubeflow_pod = {"OBJECT_STORE_MOUNTED": "0"}
    with pytest.raises(TrackingError, match="scratch folder of the pod"):
        check_tracking_uri("gs://bucket/mlruns", kubeflow_pod)
    check_tracking_uri("http://mlflow.mlflow:5000", kubeflow_pod)
