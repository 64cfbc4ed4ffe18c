"""The text pipeline: whole through kfp.local, its summary, and its compiled Vertex spec."""

import hashlib
import json
import os
import types

import numpy as np
import pandas as pd
import pytest
from kfp import compiler, local

from components.common.metrics import multi_label_metrics
from components.predict.contract import read_predictions
from pipelines import predict as predict_cli
from pipelines.definitions import text
from pipelines.definitions.vertex import VertexSettings
from tests.browser import check_report
from tests.mlflow_reads import metric_history, model_metadata, only_run
from tools.datamakers import demo_text

# Small enough for a CPU test, big enough to learn the demo in 8 epochs.
SMALL = json.dumps({"emb_sz": 32, "n_hid": 64, "n_layers": 1})


def test_compiled_spec_runs_training_on_a_t4(tmp_path):
    path = str(tmp_path / "text.json")
    compiler.Compiler().compile(text.build("r-docker.pkg.dev/p/r/fastai:abc", VertexSettings()),
                                path)
    spec = json.loads(open(path).read())
    pools = {name: c["inputDefinitions"]["parameters"]["worker_pool_specs"]["defaultValue"]
             for name, c in spec["components"].items()
             if "worker_pool_specs" in c["inputDefinitions"]["parameters"]}
    # the light steps (preflight, the registration gate and what uploads a model that
    # clears it) run on Vertex's default machine, not as jobs; the conditions are DAGs
    assert {name for name in set(spec["components"]) - set(pools)
            if not name.startswith("comp-condition")} == {
        "comp-preflight-text", "comp-registration-gate", "comp-serving-model",
        "comp-find-registered-model", "comp-model-upload", "comp-model-upload-2",
        "comp-track-classifier"}
    assert set(pools) == {"comp-prepare-text-data", "comp-train-text-classifier",
                          "comp-evaluate-text-classifier", "comp-predict"}
    assert pools["comp-train-text-classifier"][0]["machine_spec"] == {
        "machine_type": "n1-standard-8", "accelerator_type": "NVIDIA_TESLA_T4",
        "accelerator_count": 1.0}
    assert "accelerator_type" not in pools["comp-evaluate-text-classifier"][0]["machine_spec"]
    container = pools["comp-train-text-classifier"][0]["container_spec"]
    assert container["image_uri"] == "r-docker.pkg.dev/p/r/fastai:abc"
    root = spec["root"]
    params = root["inputDefinitions"]["parameters"]
    # 12 epochs, the one of best validation F1 kept (docs/measurements.md, ULMFiT)
    assert (params["epochs"]["defaultValue"], params["monitor"]["defaultValue"]) == (
        12, "f1_score")
    # a console user who sets only data_uri starts from fastai's English model
    assert (params["lang"]["defaultValue"], params["pretrained"]["defaultValue"]) == ("en", True)
    assert set(root["outputDefinitions"]["artifacts"]) == {
        "metrics", "report", "evaluation", "model", "dataset"}
    assert set(root["outputDefinitions"]["parameters"]) == {"register"}
    assert params["registration_metric"]["defaultValue"] == "micro_f1"


def test_demo_csv_is_reproducible(tmp_path):
    a, b = str(tmp_path / "a.csv"), str(tmp_path / "b.csv")
    counts = demo_text.write_reviews_csv(a, rows=50, seed=4)
    demo_text.write_reviews_csv(b, rows=50, seed=4)
    assert open(a).read() == open(b).read()
    assert sum(1 for _ in open(a)) == 51
    assert counts["none"] > 0 and all(counts[label] > 0 for label in demo_text.LABEL_WORDS)
    assert demo_text.main([str(tmp_path / "c.csv"), "--rows", "5"]) == 0
    assert len((tmp_path / "c.csv").read_text().splitlines()) == 6  # header + 5 rows


LABELS = [*demo_text.LABEL_WORDS, "other"]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """One whole text pipeline run through kfp.local on 200 generated reviews, tracked in
    an MLflow file store, read by the tests below (each checks one thing the run must have
    done)."""
    root = tmp_path_factory.mktemp("text-run")
    data = str(root / "reviews.csv")
    demo_text.write_reviews_csv(data, rows=200, seed=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("AIP_CHECKPOINT_DIR", raising=False)
        local.init(runner=local.SubprocessRunner(use_venv=False),
                   pipeline_root=str(root / "kfp"))
        task = text.build("local/vertex-gpu-pipelines:dev")(
            data_uri=data, lang="fr", pretrained=False, lm_epochs=0, epochs=8, batch_size=16,
            min_freq=1, seq_len=24, model_config=SMALL, predict_uri=data,
            tracking_uri=str(root / "mlruns"))
    artifacts = {name: artifact.path for name, artifact in task.outputs.items()
                 if name != "register"}
    return types.SimpleNamespace(root=root, data=data, task=task, artifacts=artifacts,
                                 summary=text.summarize_run(task.outputs))


@pytest.mark.slow
def test_text_run_learns_past_every_label_and_the_gate_decides(text_run):
    summary = text_run.summary
    # the gate (micro F1 >= 0.5 by default) decided; a local run never uploads
    assert summary["registration"]["would_register"] is (summary["metrics"]["micro_f1"] >= 0.5)
    assert summary["registration"]["uploaded"] is False
    metrics = summary["metrics"]
    assert metrics["task"] == "multi_label" and metrics["split"] == "test"
    assert list(metrics["per_label"]) == LABELS
    for values in metrics["per_label"].values():
        assert set(values) == {"precision", "recall", "f1", "support"}
    assert sum(v["support"] for v in metrics["per_label"].values()) >= 20
    # Learned: clearly better than predicting every label for every text (the demo's
    # labels follow keywords; this small model gets ~0.9 micro F1 here).
    positives = sum(v["support"] for v in metrics["per_label"].values())
    share = positives / (metrics["num_examples"] * len(metrics["per_label"]))
    every_label = 2 * share / (1 + share)
    assert metrics["micro_f1"] > every_label + 0.2, (metrics["micro_f1"], every_label)
    assert metrics["threshold"] == 0.3 and set(metrics["tuned_thresholds"]) == set(LABELS)
    assert summary["preparation"]["splits"] == {"train": 120, "validation": 30, "test": 50}
    assert summary["training"]["epochs"] == 8  # classifier only (the LM stage: test_text_train)
    assert len(summary["training"]["classifier_epoch_seconds"]) == 8
    assert summary["training"]["restarts"] == []


@pytest.mark.slow
def test_text_metrics_output_carries_the_scores_beside_the_baselines(text_run):
    """The pipeline's Metrics output (KFP metadata, the console's scalars) carries the
    evaluation's scores and the baselines fitted on the same train split."""
    metrics, baseline = text_run.summary["metrics"], text_run.summary["baseline"]
    scalars = text_run.task.outputs["metrics"].metadata
    assert scalars["micro_f1"] == pytest.approx(metrics["micro_f1"])
    assert "tuned_macro_f1" in scalars and "f1_prix" in scalars
    assert set(baseline) == {"tfidf_logreg", "every_label"}
    assert scalars["baseline_micro_f1"] == pytest.approx(baseline["tfidf_logreg"]["micro_f1"])
    assert scalars["every_label_micro_f1"] == pytest.approx(baseline["every_label"]["micro_f1"])
    # the templated reviews are learnt by any model; predicting every label is not
    assert baseline["tfidf_logreg"]["micro_f1"] > baseline["every_label"]["micro_f1"] + 0.3


@pytest.mark.slow
def test_text_model_folder_and_reports(text_run):
    model = text_run.artifacts["model"]
    assert sorted(os.listdir(model)) == ["export.pkl", "labels.json", "metrics.json",
                                         "per_label_metrics.json"]
    per_label = json.loads(open(os.path.join(model, "per_label_metrics.json")).read())
    assert set(per_label["labels"]["prix"]) >= {"precision", "recall", "f1", "accuracy",
                                                "support", "tuned_threshold", "tuned_f1"}
    assert "micro_f1" in per_label and "macro_f1" in per_label
    report = open(text_run.artifacts["report"]).read()
    assert "Per-label thresholds tuned on the validation split" in report
    # the HTML report in a browser: plots, labels and the test split's size from the page
    summary = text_run.summary
    page = check_report(summary["artifacts"]["report_html"], text_run.root / "text_report.png",
                        {"per-label", "curves", "cooccurrence", "training-classifier"},
                        LABELS, summary["preparation"]["splits"]["test"],
                        ["tfidf_logreg", "every_label"])
    assert "Largest mistakes" in page and "tuned threshold" in page


@pytest.mark.slow
def test_text_run_is_tracked_with_epochs_test_metrics_and_provenance(text_run, monkeypatch):
    from mlflow import MlflowClient

    from components.track.tracking import FILE_STORE_SWITCH, tracking_store

    monkeypatch.setenv(FILE_STORE_SWITCH, "true")  # as a reader of a file store sets it
    client = MlflowClient(tracking_uri=tracking_store(str(text_run.root / "mlruns")))
    model = text_run.artifacts["model"]
    run_name = os.path.basename(os.path.dirname(os.path.dirname(model)))  # kfp.local's run
    run = only_run(client, "text-classifier", run_name)

    assert run.info.run_name == run_name and run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "8" and run.data.params["lang"] == "fr"
    assert json.loads(run.data.params["model_config"]) == json.loads(SMALL)
    training = json.loads(open(os.path.join(model, "metrics.json")).read())
    losses = [row["valid_loss"] for row in training["history"]]
    assert metric_history(client, run, "classifier/valid_loss") == [
        (step, pytest.approx(value)) for step, value in enumerate(losses, start=1)]
    assert len(metric_history(client, run, "classifier/train_loss")) == 8
    assert run.data.metrics["test_micro_f1"] == pytest.approx(
        text_run.summary["metrics"]["micro_f1"])
    metadata = model_metadata(text_run.root / "kfp")
    assert run.data.tags["git_sha"] == metadata["git_sha"] == "unknown"  # set by the images
    assert run.data.tags["data_sha256"] == metadata["data_sha256"]
    assert run.data.tags["model_uri"].endswith("/model")
    assert run.data.tags["pipeline"] == "text-classifier"


@pytest.mark.slow
def test_text_model_names_its_code_data_and_parameters(text_run):
    model_meta = text_run.task.outputs["model"].metadata
    assert model_meta["git_sha"] == "unknown"  # set by the container image, not here
    manifest_path = os.path.join(text_run.artifacts["dataset"], "manifest.json")
    assert model_meta["data_sha256"] == hashlib.sha256(
        open(manifest_path, "rb").read()).hexdigest()
    assert json.load(open(manifest_path))["source_sha256"] == hashlib.sha256(
        open(text_run.data, "rb").read()).hexdigest()
    assert model_meta["parameters"]["epochs"] == 8 and model_meta["parameters"]["lang"] == "fr"


@pytest.mark.slow
def test_text_predictions_label_every_row_and_agree_with_the_evaluation(text_run, tmp_path):
    from pipelines import local_run

    model = text_run.artifacts["model"]
    # the predict step labelled every row of the CSV it was given
    predicted = local_run._predictions(model)
    assert (predicted["inputs"], predicted["errors"]) == (200, 0)
    assert [line["input"] for line in predicted["first"]] == [0, 1, 2]
    # the CLI on the test split, with two rows that cannot be labelled, agrees with the
    # evaluation: same micro F1 from the predicted label sets
    test = pd.read_csv(os.path.join(text_run.artifacts["dataset"], "test.csv"))
    with_blanks = tmp_path / "new.csv"
    pd.concat([test, pd.DataFrame({"text": ["", "  ", "\0\0\0"]})]).to_csv(with_blanks,
                                                                        index=False)
    out = tmp_path / "predictions.jsonl"
    assert predict_cli.main(["--model", model, "--data", str(with_blanks),
                             "--output", str(out), "--no-progress"]) == 0
    lines = read_predictions(str(out))
    assert [line["error"] for line in lines[-3:-1]] == ["empty text in column 'text'"] * 2
    assert lines[-1]["error"].startswith("not text: a NUL character at character 0")
    chosen = np.array([[label in line["labels"] for label in LABELS] for line in lines[:-3]])
    scored = multi_label_metrics(test[LABELS].to_numpy(), chosen.astype(float), LABELS, 0.5)
    assert scored["micro_f1"] == pytest.approx(text_run.summary["metrics"]["micro_f1"])
    pd.DataFrame({"review": ["x"]}).to_csv(tmp_path / "other.csv", index=False)
    assert predict_cli.main(["--model", model, "--data", str(tmp_path / "other.csv"),
                             "--output", str(tmp_path / "o.jsonl")]) == 2
    assert not (tmp_path / "o.jsonl").exists()
