"""MLflow tracking: tiny pipelines run through kfp.local against a real MLflow server on
127.0.0.1 (SQLite backend), read back through MLflow's own client. The image pipeline's
tracking is read from tests/test_run_local.py's image run (one image run fewer)."""

import json
import os
import re

import pytest
from mlflow import MlflowClient

from components.preflight.checks import check_tracking
from components.preflight.parameters import PreflightError
from components.track.contract import TrackingError, check_tracking_uri
from components.track.tracking import (
    FILE_STORE_SWITCH,
    RUN_TAG,
    RunRecord,
    image_record,
    log_run,
    tracking_store,
)
from pipelines import run_local
from tools.datamakers.demo_text import write_reviews_csv
from tools.rehearsal import kubeflow_demo

TINY_TEXT = '{"emb_sz": 16, "n_hid": 24, "n_layers": 1}'


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a free loopback port, as a team would run it (SQLite store)."""
    with kubeflow_demo.mlflow_server(str(tmp_path_factory.mktemp("mlflow"))) as url:
        yield url


@pytest.mark.slow
def test_the_tracking_server_starts_no_job_consumers(mlflow_server):
    """MLflow's job execution (7 huey consumers polling the store, ~0.5 of a core while the
    server lives) is off: the server is its process and uvicorn's."""
    import psutil

    port = mlflow_server.rsplit(":", 1)[1]
    (server,) = [p for p in psutil.process_iter(["cmdline"])
                 if (p.info["cmdline"] or [])[1:4] == ["-m", "mlflow", "server"]
                 and port in p.info["cmdline"]]
    commands = [" ".join(p.cmdline()) for p in server.children(recursive=True)]
    assert len(commands) == 1 and "uvicorn" in commands[0], commands
    assert server.is_running()


@pytest.fixture(autouse=True)
def _no_vertex_dirs(monkeypatch):
    for name in ("AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR"):
        monkeypatch.delenv(name, raising=False)


def _only_run(client, experiment, run_name):
    (run,) = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id],
        filter_string=f"tags.{RUN_TAG} = '{run_name}'")
    return run


def _history(client, run, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                              key=lambda m: m.step)]


def _model_metadata(output) -> dict:
    """The model artifact's metadata as kfp.local recorded it (its executor output)."""
    (path,) = [os.path.join(root, "executor_output.json")
               for root, _, files in os.walk(output / "kfp")
               if "executor_output.json" in files and os.path.basename(root).startswith("train")]
    artifacts = json.loads(open(path).read())["artifacts"]
    name = "lm_assets" if "lm_assets" in artifacts else "model"
    return artifacts[name]["artifacts"][0]["metadata"]


@pytest.mark.slow
def test_text_run_is_tracked_with_epochs_test_metrics_and_provenance(mlflow_server, tmp_path):
    data = tmp_path / "reviews.csv"
    write_reviews_csv(str(data), rows=80, seed=3)
    out = tmp_path / "text"
    summary = run_local.run("text", str(data), str(out), {
        "lang": "fr", "pretrained": False, "lm_epochs": 0, "epochs": 3, "min_freq": 1,
        "seq_len": 16,
        "model_config": TINY_TEXT, "tracking_uri": mlflow_server})
    client = MlflowClient(tracking_uri=mlflow_server)
    run_name = os.path.basename(os.path.dirname(os.path.dirname(
        summary["artifacts"]["model"])))  # kfp.local's run folder: the pipeline run's name
    run = _only_run(client, "text-classifier", run_name)

    assert run.info.run_name == run_name and run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "3" and run.data.params["lang"] == "fr"
    assert json.loads(run.data.params["model_config"]) == json.loads(TINY_TEXT)
    training = json.loads(open(os.path.join(summary["artifacts"]["model"],
                                            "metrics.json")).read())
    losses = [row["valid_loss"] for row in training["history"]]
    assert _history(client, run, "classifier/valid_loss") == [
        (step, pytest.approx(value)) for step, value in enumerate(losses, start=1)]
    assert len(_history(client, run, "classifier/train_loss")) == 3
    assert run.data.metrics["test_micro_f1"] == pytest.approx(summary["metrics"]["micro_f1"])
    metadata = _model_metadata(out)
    assert run.data.tags["git_sha"] == metadata["git_sha"] == "unknown"  # set by the images
    assert run.data.tags["data_sha256"] == metadata["data_sha256"]
    assert run.data.tags["model_uri"].endswith("/model")
    assert run.data.tags["pipeline"] == "text-classifier"


@pytest.mark.slow
def test_language_model_run_is_tracked(mlflow_server, tmp_path):
    corpus = tmp_path / "corpus.csv"
    write_reviews_csv(str(corpus), rows=60, seed=2)
    summary = run_local.run("lm", str(corpus), str(tmp_path / "lm"), {
        "lang": "fr", "epochs": 2, "batch_size": 8, "seq_len": 16, "min_freq": 1,
        "model_config": '{"emb_sz": 16, "n_hid": 24, "n_layers": 2}',
        "tracking_uri": mlflow_server})
    client = MlflowClient(tracking_uri=mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("language-model").experiment_id])
    assert [step for step, _ in _history(client, run, "lm/perplexity")] == [1, 2]
    assert run.data.metrics["lm/final_perplexity"] == pytest.approx(
        summary["metrics"]["perplexity"])
    assert run.data.params["lang"] == "fr"
    assert re.fullmatch(r"[0-9a-f]{64}", run.data.tags["data_sha256"])


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
    run = _only_run(client, "exp", "pipeline-run-1")
    assert run.info.run_id == second != first
    assert _history(client, run, "loss") == [(0, 1.0), (1, 0.5)]
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
