"""The transformer text pipeline: its compiled Vertex spec, its preflight, and whole runs
(kfp.local through run_local, and the rehearsal of the compiled JSON) on real text with a
small BERT made here from the training texts (no Hub download)."""

import importlib
import json
import os

import pandas as pd
import pytest

import tools.rehearsal as rehearse
from components.preflight.checks import input_fingerprints, preflight
from components.preflight.parameters import PreflightError
from components.preflight.pipeline_checks import check_transformer_run, model_name_problems
from components.prepare_text.contract import PrepareConfig, read_split
from components.train_transformer import component as train_component
from components.tune import selection, trial
from components.tune.contract import DEFAULT_SPACES, TUNABLE
from pipelines import run_local
from pipelines.definitions import transformer
from tests.conftest import compile_once, free_port, http_json, served_as_on_vertex
from tools.datamakers import docstring_corpus

REGISTRY = "europe-west4-docker.pkg.dev/acme-ml/pipelines"
IMAGE = f"{REGISTRY}/fastai:0a1b2c3"
PIPELINE_PARAMETERS = [
    "data_uri", "text_column", "label_columns", "label_delimiter", "other_label",
    "validation_fraction", "test_fraction", "seed", "model_name", "epochs", "batch_size",
    "learning_rate", "weight_decay", "warmup_ratio", "max_length", "threshold", "monitor",
    "early_stopping_patience", "mixed_precision", "checkpoint_every_steps", "eval_split",
    "eval_batch_size", "register_model", "registration_metric", "registration_threshold",
    "registration_beats_baselines", "model_display_name", "predict_uri", "tracking_uri",
    "job_service_account"]
# A small BERT from scratch learns the docstrings in seconds on a CPU at these settings
# (the ones docs/users.md gives for it: many small steps at a high rate).
SMALL = {"epochs": 15, "batch_size": 8, "learning_rate": 1e-3, "max_length": 96,
         "early_stopping_patience": 3}
# Judged as the text defaults are (tests/test_text_real.py): every label + 0.25 and within
# TFIDF_MARGIN of TF-IDF on the same split. Test micro F1 at SMALL, seeds 1-3: 0.613-0.715
# on two threads, 0.564-0.672 on one (TF-IDF 0.686-0.696): an absolute 0.6 failed on one.
TFIDF_MARGIN = 0.15


def _compile(tmp_path, *extra):
    """The compiled folder, shared by the tests that pass the same flags (read only)."""
    return compile_once(tmp_path, "--registry", REGISTRY, "--tag", "0a1b2c3", *extra)


def _pools(spec: dict) -> dict[str, list[dict]]:
    return {name: c["inputDefinitions"]["parameters"]["worker_pool_specs"]["defaultValue"]
            for name, c in spec["components"].items()
            if "worker_pool_specs" in c["inputDefinitions"]["parameters"]}


def _defaults() -> dict:
    return {name: spec.default for name, spec in
            transformer.build("img:1").component_spec.inputs.items() if name != "data_uri"}


# --------------------------------------------------------------------------- compiled


def test_compiled_pipeline_trains_on_a_gpu_job_between_the_text_steps(tmp_path):
    out = _compile(tmp_path)
    spec = json.loads((out / "transformer_pipeline.json").read_text())
    assert spec["pipelineInfo"]["name"] == "text-transformer"
    pools = _pools(spec)
    # the text pipeline's steps around the new trainer; light steps run on Vertex's own
    # machine, not as jobs; the conditions are DAGs
    assert set(pools) == {"comp-prepare-text-data", "comp-train-transformer-classifier",
                          "comp-evaluate-text-classifier", "comp-predict"}
    assert {name for name in set(spec["components"]) - set(pools)
            if not name.startswith("comp-condition")} == {
        "comp-preflight-transformer", "comp-registration-gate", "comp-serving-model",
        "comp-find-registered-model", "comp-model-upload", "comp-model-upload-2",
        "comp-track-classifier"}
    (train,) = pools["comp-train-transformer-classifier"]
    # the text trainer's GPU machine by default
    assert train["machine_spec"] == {"machine_type": "n1-standard-8",
                                     "accelerator_type": "NVIDIA_TESLA_T4",
                                     "accelerator_count": 1.0}
    assert train["container_spec"]["image_uri"] == IMAGE
    assert "accelerator_type" not in pools["comp-evaluate-text-classifier"][0]["machine_spec"]

    root = spec["root"]
    params = root["inputDefinitions"]["parameters"]
    # in the signature's order (the console's form): the data's, the trainer's, the rest
    assert list(transformer.build("img:1").component_spec.inputs) == PIPELINE_PARAMETERS
    assert set(params) == set(PIPELINE_PARAMETERS)
    assert [n for n, p in params.items() if not p.get("isOptional")] == ["data_uri"]
    assert {name: params[name]["defaultValue"] for name in (
        "model_name", "epochs", "batch_size", "learning_rate", "weight_decay", "warmup_ratio",
        "max_length", "threshold", "monitor", "early_stopping_patience", "mixed_precision",
        "registration_metric", "model_display_name")} == {
        "model_name": "FacebookAI/xlm-roberta-base", "epochs": 6, "batch_size": 16,
        "learning_rate": 5e-5, "weight_decay": 0.01, "warmup_ratio": 0.1, "max_length": 256,
        "threshold": 0.5, "monitor": "loss", "early_stopping_patience": 2,
        "mixed_precision": True, "registration_metric": "micro_f1",
        "model_display_name": "transformer-text-classifier"}
    assert set(root["outputDefinitions"]["artifacts"]) == {
        "metrics", "report", "evaluation", "model", "dataset"}
    assert set(root["outputDefinitions"]["parameters"]) == {"register"}

    # the preflight's fingerprints keying the steps' caches: test_compile's
    # test_steps_reading_files_by_uri_are_keyed_on_their_fingerprints[transformer_pipeline]
    tasks = root["dag"]["tasks"]
    assert tasks["train-transformer-classifier"]["inputs"]["parameters"]["model_name"] == {
        "componentInputParameter": "model_name"}
    assert tasks["evaluate-text-classifier"]["inputs"]["artifacts"]["model"] == {
        "taskOutputArtifact": {"outputArtifactKey": "model",
                               "producerTask": "train-transformer-classifier"}}


def test_machine_options_reach_the_transformer_job_and_replicas_restart_together(tmp_path):
    out = _compile(tmp_path, "--train-transformer-machine-type", "g2-standard-8",
                   "--train-transformer-accelerator-type", "NVIDIA_L4",
                   "--train-transformer-replica-count", "2", "--pipelines", "transformer_pipeline")
    spec = json.loads((out / "transformer_pipeline.json").read_text())
    pools = _pools(spec)["comp-train-transformer-classifier"]
    # DDP across replicas: pool 0 the primary, pool 1 the other replica
    machine = {"machine_type": "g2-standard-8", "accelerator_type": "NVIDIA_L4",
               "accelerator_count": 1.0}
    assert [(p["replica_count"], p["machine_spec"]) for p in pools] == [(1.0, machine)] * 2
    params = spec["components"]["comp-train-transformer-classifier"]["inputDefinitions"][
        "parameters"]
    assert params["restart_job_on_worker_restart"]["defaultValue"] is True


def test_tuning_variant_searches_the_transformer_space_and_retrains_with_the_best(tmp_path):
    spec = json.loads((_compile(tmp_path) / "transformer_tuning_pipeline.json").read_text())
    assert spec["pipelineInfo"]["name"] == "text-transformer-tuning"
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["tune-train-transformer-classifier"]["dependentTasks"] == [
        "preflight-transformer", "prepare-text-data"]
    train = tasks["train-transformer-classifier"]["inputs"]["parameters"]
    for name in TUNABLE["transformer"]:
        assert train[name] == {"taskOutputParameter": {
            "outputParameterKey": name, "producerTask": "best-transformer-trial"}}
    assert train["epochs"] == {"componentInputParameter": "epochs"}
    job = spec["components"]["comp-tune-train-transformer-classifier"]["inputDefinitions"][
        "parameters"]
    (pool,) = job["worker_pool_specs"]["defaultValue"]
    assert pool["container_spec"]["args"][:4] == ["--kind", "transformer", "--metric",
                                                  "micro_f1"]
    assert pool["machine_spec"]["accelerator_type"] == "NVIDIA_TESLA_T4"
    searched = {p["parameter_id"] for p in job["study_spec_parameters"]["defaultValue"]}
    assert searched == set(DEFAULT_SPACES["transformer"]["parameters"])


def test_a_trial_runs_the_transformer_trainer_with_the_values_vertex_passes():
    assert trial.parse_hyperparameters("transformer", [
        "--learning_rate=3e-05", "--batch_size=32.0", "--warmup_ratio=0.05"]) == {
        "learning_rate": 3e-5, "batch_size": 32, "warmup_ratio": 0.05}
    with pytest.raises(trial.TrialError, match="the transformer trainer cannot tune it"):
        trial.parse_hyperparameters("transformer", ["--drop_mult=0.3"])
    module, name = trial.TRAINERS["transformer"]
    assert getattr(importlib.import_module(module), name) is \
        train_component.train_transformer_classifier
    assert trial.output_definitions(train_component.train_transformer_classifier) == {
        "model": "system.Model", "metrics": "system.Metrics"}


# --------------------------------------------------------------------------- preflight


def test_default_settings_pass_and_a_hub_name_is_not_fingerprinted():
    check_transformer_run(_defaults())
    assert input_fingerprints("transformer", _defaults()) == {"model_fingerprint": "",
                                                               "predict_fingerprint": ""}


@pytest.mark.parametrize("changes, message", [
    ({"epochs": 0}, "training: epochs must be >= 1"),
    ({"warmup_ratio": 1.0}, r"warmup_ratio must be >= 0 and < 1"),
    ({"monitor": "valid_loss"}, "monitor must be one of"),
    ({"learning_rate": "nan"}, "training: learning_rate: expected a finite number"),
    ({"validation_fraction": 0.0}, "preparation: validation_fraction must be > 0 and < 1"),
    ({"test_fraction": 0.0}, "test_fraction must be > 0 when eval_split is test"),
    ({"registration_metric": "accuracy"}, "registration_metric must be one of"),
    ({"model_name": "xlm roberta"}, "model_name 'xlm roberta' is neither an existing folder"),
    ({"model_name": "a/b/c"}, r"nor a Hub model name \(\[organisation/\]name"),
    ({"model_name": "/nonexistent/model"}, "model_name '/nonexistent/model' is not a folder"),
])
def test_settings_a_later_step_refuses(changes, message):
    with pytest.raises(PreflightError, match=message):
        check_transformer_run({**_defaults(), **changes})


def test_a_model_name_folder_needs_config_and_weights_and_is_fingerprinted(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    [problem] = model_name_problems(str(folder))
    assert problem.startswith(f"model_name {str(folder)!r} is not a transformer model folder: it "
                              "has no config.json;"), problem
    data = tmp_path / "texts.csv"
    data.write_text("text,a\nhello,1\n")
    with pytest.raises(PreflightError, match="my-model' is not a transformer model folder: "
                                             "it has no config.json"):
        preflight("transformer", str(data), {**_defaults(), "model_name": str(folder)})
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").unlink()
    assert "it has no model.safetensors or pytorch_model.bin" in model_name_problems(
        str(folder))[0]
    (folder / "model.safetensors").write_bytes(b"weights")
    assert model_name_problems(str(folder)) == []
    settings = {**_defaults(), "model_name": str(folder)}
    assert preflight("transformer", str(data), settings).startswith("sha256:")
    first = input_fingerprints("transformer", settings)["model_fingerprint"]
    assert first.endswith(":3")  # config, weights, tokenizer
    (folder / "model.safetensors").write_bytes(b"other weights")  # rewritten in place
    assert input_fingerprints("transformer", settings)["model_fingerprint"] != first
    # config.json and weights alone pass for a model, but transformers then builds a
    # tokenizer of the special tokens: every word [UNK], a model that learns nothing
    (folder / "tokenizer.json").unlink()
    [problem] = model_name_problems(str(folder))
    assert "it has no tokenizer.json or vocab.txt" in problem
    assert "tokenizer.save_pretrained(folder)" in problem


@pytest.mark.parametrize("config, tokenizer, limit", [
    ({"model_type": "bert", "max_position_embeddings": 512}, {"model_max_length": 512}, 512),
    # XLM-R: 514 positions, of which 512 hold tokens (positions start after padding id 1)
    ({"model_type": "xlm-roberta", "max_position_embeddings": 514, "pad_token_id": 1},
     {"model_max_length": 1000000000000000019884624838656}, 512),
    ({"model_type": "bert", "max_position_embeddings": 64}, {}, 64),
    ({"model_type": "bert", "max_position_embeddings": 512}, {"model_max_length": 128}, 128),
])
def test_max_length_beyond_the_models_positions_is_refused_naming_the_limit(
        tmp_path, config, tokenizer, limit):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    assert model_name_problems(str(folder), limit) == []
    [problem] = model_name_problems(str(folder), 100000)
    assert problem.startswith(f"max_length 100000 is more than model_name {str(folder)!r} "
                              f"reads: at most {limit} tokens"), problem
    with pytest.raises(PreflightError, match=f"at most {limit} tokens"):
        check_transformer_run({**_defaults(), "model_name": str(folder), "max_length": 100000})


def test_a_model_folder_whose_config_is_not_json_is_refused_naming_the_file(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{'model_type': 'bert'")  # cut off, single quotes
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "vocab.txt").write_text("[PAD]\n")
    [problem] = model_name_problems(str(folder), 128)
    assert problem.startswith(f"model_name {str(folder)!r}: config.json is not JSON (")
    assert problem.endswith("write the folder again with save_pretrained")


# --------------------------------------------------------------------------- whole runs


@pytest.fixture(scope="module")
def corpus_and_tiny_model(tmp_path_factory):
    """The docstring corpus, and a small BERT whose vocabulary is learnt from the train
    split the pipeline draws (the same preparation, seed and fractions: its defaults)."""
    from components.prepare_text.preparation import prepare_text_dataset
    from components.train_transformer.tiny import write_tiny_model

    root = tmp_path_factory.mktemp("transformer")
    csv = root / "docstrings.csv"
    docstring_corpus.write_docstring_corpus(str(csv))
    prepared = root / "prepared"
    prepare_text_dataset(str(csv), str(prepared), PrepareConfig())
    train = read_split(str(prepared), "train")
    write_tiny_model(train["text"], str(root / "tiny"))
    return csv, root / "tiny", train


@pytest.mark.slow
def test_run_local_fine_tunes_a_small_bert_on_real_text(corpus_and_tiny_model, tmp_path,
                                                        capsys):
    csv, tiny, train = corpus_and_tiny_model
    out = tmp_path / "run"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    assert run_local.main(["transformer", "--data", str(csv), "--output", str(out),
                           "--model-name", str(tiny), "--predict-uri", str(csv), *flags]) == 0
    summary = json.loads((out / "summary.json").read_text())
    dataset = summary["artifacts"]["dataset"]
    # the model's vocabulary came from exactly the split the pipeline trained on
    assert read_split(dataset, "train")["text"].tolist() == train["text"].tolist()

    metrics, baseline = summary["metrics"], summary["baseline"]
    assert metrics["task"] == "multi_label" and metrics["split"] == "test"
    # every docstring names its package: no row is given the other label
    assert list(metrics["per_label"]) == list(docstring_corpus.LABELS)
    every_label = baseline["every_label"]["micro_f1"]
    with capsys.disabled():  # the measured numbers, in the test log
        print(f"\ntransformer: test micro F1 {metrics['micro_f1']:.3f}, macro F1 "
              f"{metrics['macro_f1']:.3f}; every_label {every_label:.3f}, tfidf_logreg "
              f"{baseline['tfidf_logreg']['micro_f1']:.3f}; training "
              f"{summary['training']['seconds']} s")
    assert metrics["micro_f1"] >= every_label + 0.25, (metrics, baseline)
    assert metrics["micro_f1"] >= baseline["tfidf_logreg"]["micro_f1"] - TFIDF_MARGIN, \
        (metrics, baseline)

    training = summary["training"]
    assert training["model_name"] == str(tiny) and training["arch"] == \
        "BertForSequenceClassification"
    assert 1 <= training["epochs"] <= SMALL["epochs"]
    assert training["stopped_early"] is (training["epochs"] < SMALL["epochs"])
    assert len(training["classifier_epoch_seconds"]) == training["epochs"]
    assert training["device"] == "cpu" and training["precision"] == "fp32"
    assert training["world_size"] == 1 and training["parameters"] > 0
    assert training["best"]["monitor"] == "loss"

    model = summary["artifacts"]["model"]
    assert {"config.json", "model.safetensors", "labels.json", "metrics.json",
            "per_label_metrics.json"} <= set(os.listdir(model))
    assert not os.path.exists(os.path.join(model, "checkpoints"))  # not shipped
    labels = json.loads(open(os.path.join(model, "labels.json")).read())
    assert labels["framework"] == "transformers" and labels["max_length"] == 96
    assert os.path.isfile(summary["artifacts"]["report_html"])
    # the prediction step labelled every row of the CSV it was given
    rows = len(pd.read_csv(csv))
    assert (summary["predictions"]["inputs"], summary["predictions"]["errors"]) == (rows, 0)
    assert os.path.isfile(summary["artifacts"]["predictions"])
    assert summary["registration"]["would_register"] is (metrics["micro_f1"] >= 0.5)
    assert "transformer pipeline: test micro F1" in capsys.readouterr().out


@pytest.mark.slow
def test_compiled_pipeline_rehearsed_as_vertex_runs_it(corpus_and_tiny_model, minilm,
                                                      tmp_path):
    """The compiled JSON runs as Vertex would run it, from a real pretrained encoder (all-
    MiniLM-L6-v2 as a model folder) at the pipeline's defaults but for a short, faster
    schedule: preflight fingerprints the model folder, the GPU job's payload is Vertex's,
    the model clears the gate and its upload request is built with the text model's
    serving container, which serves the fine-tuned encoder."""
    csv, _, _ = corpus_and_tiny_model
    path = os.path.join(_compile(tmp_path), "transformer_pipeline.json")
    # One epoch at 64 tokens: what is checked is the way through, not what it learns.
    params = {"data_uri": str(csv), "model_name": minilm, "registration_threshold": "0",
              "epochs": "1", "max_length": "64", "learning_rate": "1e-4"}
    summary = rehearse.rehearse(path, str(tmp_path / "r"), params)
    states = {t["display_name"]: t["state"] for t in summary["rehearsal"]["tasks"]}
    succeeded = ("preflight", "prepare-text", "train-transformer", "evaluate-text",
                 "registration-gate", "serving-model")
    assert {name: states[name] for name in succeeded} == dict.fromkeys(succeeded, "succeeded")
    assert states["register-model"] == "not-executed"  # a Vertex API call, request checked
    assert states["prediction-requested"] == states["tracking-requested"] == "skipped"
    requests = {p.stem: json.loads(p.read_text())
                for p in (tmp_path / "r" / "vertex-requests").glob("*.json")}
    job = requests["train-transformer-classifier"]["request"]
    (pool,) = job["job_spec"]["worker_pool_specs"]
    assert pool["machine_spec"]["accelerator_type"] == "NVIDIA_TESLA_T4"
    (upload,) = [r["request"] for r in requests.values() if r["type"] == "UploadModel"]
    assert upload["display_name"] == "transformer-text-classifier"
    container = upload["container_spec"]
    assert container["image_uri"] == IMAGE and "command" not in container
    assert container["ports"] == [{"container_port": 8080}]
    evaluation = json.loads(open(os.path.join(summary["artifacts"]["evaluation"],
                                              "metrics.json")).read())
    # What Vertex does with the request: the image's server on the uploaded folder, with
    # AIP_* from the container spec; a prediction follows the route it was given.
    uploaded = upload["artifact_uri"].replace("gs://", str(tmp_path / "r" / "gcs") + "/")
    aip = {"AIP_HTTP_PORT": str(free_port()), "AIP_STORAGE_URI": uploaded,
           "AIP_HEALTH_ROUTE": container["health_route"],
           "AIP_PREDICT_ROUTE": container["predict_route"]}
    with served_as_on_vertex(aip, str(tmp_path / "serve.log")) as address:
        status, answer = http_json(address, "POST", container["predict_route"], json.dumps(
            {"instances": ["Create a new event loop and run the coroutine."]}).encode())
    assert status == 200 and set(answer["predictions"][0]) == {"labels", "scores"}
    assert set(answer["predictions"][0]["scores"]) == set(evaluation["per_label"])
    assert summary["metrics"]["micro_f1"] == evaluation["micro_f1"]
    assert summary["training"]["model_name"] == minilm
    assert summary["training"]["parameters"] > 20_000_000
    assert summary["registration"]["would_register"] is True


@pytest.mark.slow
def test_tuning_variant_rehearsed_trials_report_micro_f1_and_the_best_values_retrain(
        corpus_and_tiny_model, tmp_path):
    """Two trials run the transformer trainer as Vertex runs them (`--name=value` arguments,
    AIP_* folders per trial), report the study metric through hypertune each epoch, and
    the training step gets the best trial's values."""
    csv, tiny, _ = corpus_and_tiny_model
    out = _compile(tmp_path, "--tune-trials", "2", "--tune-parallel-trials", "1",
                   "--pipelines", "transformer_tuning_pipeline")
    params = {"data_uri": str(csv), "model_name": str(tiny), "epochs": "2",
              "max_length": "64", "registration_threshold": "0"}
    summary = rehearse.rehearse(str(out / "transformer_tuning_pipeline.json"),
                                str(tmp_path / "r"), params)
    tasks = {t["display_name"]: t for t in summary["rehearsal"]["tasks"]}
    assert (tasks["tune-transformer"]["state"], tasks["tune-transformer"]["replicas"]) == (
        "succeeded", 2)
    (trials_json,) = (tmp_path / "r" / "gcs").rglob(selection.TRIALS_FILE)
    table = json.loads(trials_json.read_text())
    assert table["metric"] == "micro_f1" and table["goal"] == "maximize"
    assert [t["state"] for t in table["trials"]] == ["SUCCEEDED", "SUCCEEDED"]
    space = DEFAULT_SPACES["transformer"]["parameters"]
    for row in table["trials"]:
        folder = tmp_path / "r" / "gcs" / row["folder"][len("gs://"):]
        reports = [json.loads(r) for r in (folder / "hypertune.metrics").read_text()
                   .splitlines()]
        trained = json.loads((folder / "model" / "metrics.json").read_text())
        assert len(reports) == len(trained["history"])  # one value per epoch
        assert row["metric"] == max(float(r["micro_f1"]) for r in reports)
        assert row["parameters"]["batch_size"] in (16.0, 32.0)
        rate = row["parameters"]["learning_rate"]
        assert space["learning_rate"]["min"] <= rate <= space["learning_rate"]["max"]
    config = json.loads(open(os.path.join(summary["artifacts"]["model"],
                                          "metrics.json")).read())["config"]
    assert {k: config[k] for k in TUNABLE["transformer"]} == pytest.approx(
        table["best"]["values"])
    assert tasks["train-transformer"]["state"] == "succeeded"
