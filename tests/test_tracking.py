"""MLflow tracking: the records logged, the file store, the URIs a step can use (whole runs
are tracked in test_run_local.py, test_text_pipeline.py, test_lm_pipeline.py)."""

import json
import os

import pytest
from mlflow import MlflowClient

from components.preflight.checks import preflight
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
        preflight("lm", "/no/corpus", {"tracking_uri": "s3://b/m"})
    # gs:// is a file store through Vertex's /gcs mount; here there is none
    with pytest.raises(TrackingError, match="mount, which this machine lacks"):
        tracking_store("gs://bucket/mlruns")
    # open-source KFP's pods have a /gcs, a scratch folder: refused there, not lost
    kubeflow_pod = {"OBJECT_STORE_MOUNTED": "0"}
    with pytest.raises(TrackingError, match="scratch folder of the pod"):
        check_tracking_uri("gs://bucket/mlruns", kubeflow_pod)
    check_tracking_uri("http://mlflow.mlflow:5000", kubeflow_pod)


def test_a_step_logs_once_into_the_run_kfp_made_for_it_and_the_version_links_to_it(
        tmp_path, monkeypatch):
    from types import SimpleNamespace

    from components.register.component import register_in_mlflow
    from components.track.component import track_classifier

    store = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    # as KFP 2.17's MLflow plugin makes them: the pipeline run's, one nested run per task
    kfp_experiment = client.create_experiment("kfp")
    parent = client.create_run(kfp_experiment, run_name="pipeline-run-1",
                               tags={"kfp.pipeline_run_id": "r-1"}).info.run_id
    nested = {task: client.create_run(kfp_experiment, run_name=task,
                                      tags={"mlflow.parentRunId": parent}).info.run_id
              for task in ("track-run", "register-model")}
    (tmp_path / "history.json").write_text(json.dumps(
        {"head": [{"epoch": 0, "loss": 2.0}], "full": [{"epoch": 1, "loss": 1.5}]}))
    (tmp_path / "metrics.json").write_text(json.dumps(
        {"task": "single_label", "num_examples": 4, "accuracy": 0.75, "per_class": {}}))
    model = SimpleNamespace(path=str(tmp_path), uri="s3://b/model", metadata={
        "parameters": {"epochs": 2.0}, "git_sha": "abc"})
    evaluation = SimpleNamespace(path=str(tmp_path))

    def track(tracking_uri: str) -> str:
        return track_classifier(model, evaluation, tracking_uri, "pipeline-run-1", "pets",
                                "image")

    def register(tracking_uri: str) -> str | None:
        registered = SimpleNamespace(path=str(tmp_path / "registered"), metadata={},
                                     uri="s3://b/registered")
        version = register_in_mlflow(model, registered, tracking_uri, "pets", "text",
                                     "img", "pipeline-run-1").version
        return client.get_model_version("pets", version).run_id

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_RUN_ID", nested["track-run"])
    assert track(store) == track(store) == nested["track-run"]  # the pod retried
    run = client.get_run(nested["track-run"])
    assert metric_history(client, run, "loss") == [(0, 2.0), (1, 1.5)]  # once each
    assert metric_history(client, run, "test_accuracy") == [(0, 0.75)]
    assert run.data.params == {"epochs": "2"} and run.data.tags["pipeline_run"] == "pipeline-run-1"
    # still KFP's: its parent, its name, running until KFP's launcher ends it
    assert (run.data.tags["mlflow.parentRunId"], run.info.run_name, run.info.status) == (
        parent, "track-run", "RUNNING")
    assert client.get_experiment_by_name("pets") is None  # no run of our own
    monkeypatch.setenv("MLFLOW_RUN_ID", nested["register-model"])
    assert register(store) == nested["register-model"]

    # tracking_uri naming another store wins, as without KFP's variables: a run of its own
    elsewhere = str(tmp_path / "mlruns")
    assert track(elsewhere) != nested["track-run"] and register(store) == nested["register-model"]
    monkeypatch.delenv("MLFLOW_RUN_ID")
    assert register(store) is None
    track(store)
    assert len(client.search_runs([kfp_experiment])) == 3
    assert only_run(client, "pets", "pipeline-run-1").info.status == "FINISHED"
    monkeypatch.setenv(FILE_STORE_SWITCH, "true")
    other = MlflowClient(tracking_uri=tracking_store(elsewhere))
    assert only_run(other, "pets", "pipeline-run-1").data.params == {"epochs": "2"}
