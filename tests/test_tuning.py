"""Hyperparameter tuning: search spaces, the compiled Vertex tuning jobs, trials, the best trial.

No Vertex here: the compiled tuning step's launcher builds Vertex's real
`aiplatform_v1.HyperparameterTuningJob` and sends it to a stand-in for Vertex's
JobServiceClient (the service alone is faked); the selection reads `aiplatform_v1` messages
built here; whole pipelines run rehearsed.
"""

import json
import math
import os
import re
import signal

import pytest
from google.cloud import aiplatform_v1
from google.protobuf import json_format

import compile as compile_cli
import tools.rehearsal as rehearse
from components.tune import component as tune_component
from components.tune import launch, selection, trial
from components.tune.contract import (
    DEFAULT_SPACES,
    TUNABLE,
    SearchSpaceError,
    parse_space,
    read_space,
)
from pipelines.definitions import tuning
from pipelines.definitions.machine import DEFAULT_MACHINES
from pipelines.definitions.steps import component as step_component
from tests.conftest import write_class_images, write_densenet_weights
from tests.test_compile import REGISTRY, _compile, _compile_here
from tools.datamakers.demo_text import write_reviews_csv


@pytest.mark.parametrize("kind", ["image", "text", "transformer"])
def test_default_spaces_search_only_tunable_parameters_and_reach_vertex_as_numbers(kind, tmp_path):
    space = read_space(kind)
    assert set(space.names()) <= set(TUNABLE[kind])
    assert space.to_json() == json.loads(json.dumps(DEFAULT_SPACES[kind]))
    assert parse_space(kind, space.to_json()) == space
    # The default image space has 1e-05 (fine_tune_learning_rate), a spelling YAML 1.1
    # reads as a string (which Vertex refused once): it reaches the job as a number.
    study = _tuning_request(_compile(tmp_path), kind).study_spec
    assert [(m.metric_id, m.goal.name) for m in study.metrics] == [
        (space.metric, space.goal.upper())]
    sent = {p.parameter_id: p for p in study.parameters}
    assert set(sent) == set(DEFAULT_SPACES[kind]["parameters"])
    for name, wanted in DEFAULT_SPACES[kind]["parameters"].items():
        if wanted["type"] == "double":
            spec = sent[name].double_value_spec
            assert (spec.min_value, spec.max_value) == (wanted["min"], wanted["max"]), name


@pytest.mark.parametrize("kind, data, message", [
    ("image", {"parameters": {"epochs": {"type": "integer", "min": 1, "max": 3}}},
     r"parameters.epochs: the image trainer cannot search 'epochs'"),
    ("image", {"metric": "f1_score", "parameters": {"dropout": {
        "type": "double", "min": 0, "max": 0.5}}}, "metric 'f1_score' is not reported"),
    ("image", {"goal": "up", "parameters": {"dropout": {"type": "double", "min": 0, "max": 1}}},
     "goal 'up'"),
    ("image", {"parameters": {"dropout": {"type": "double", "min": 0.5, "max": 0.1}}},
     "parameters.dropout: needs numbers min < max"),
    ("image", {"parameters": {"learning_rate": {"type": "double", "min": 0, "max": 0.1,
                                                "scale": "log"}}},
     "learning_rate: a log scale needs min > 0"),
    ("image", {"parameters": {"batch_size": {"type": "discrete", "values": [16, 24.5]}}},
     "batch_size is an integer"),
    ("image", {"parameters": {"dropout": {"type": "integer", "min": 0, "max": 1}}},
     "dropout is a float; use type double"),
    ("text", {"parameters": {"drop_mult": {"type": "double", "min": 0.1, "max": 0.5,
                                           "step": 0.1}}}, r"unknown key\(s\) \['step'\]"),
    ("text", {"parameters": {}}, "parameters must be a non-empty object"),
    ("text", {"metrics": "f1_score", "parameters": {}}, r"unknown key\(s\) \['metrics'\]"),
    ("text", {"parameters": {"batch_size": {"type": "categorical", "values": ["a"]}}},
     "use discrete values"),
    # values the trainers' own settings refuse
    ("image", {"parameters": {"batch_size": {"type": "discrete", "values": [0, -4]}}},
     r"parameters.batch_size: the image trainer refuses batch_size=-4: batch_size must be >= 1"),
    ("image", {"parameters": {"dropout": {"type": "double", "min": 0.5, "max": 1.5}}},
     r"parameters.dropout: the image trainer refuses dropout=1.5: dropout must be >= 0 and < 1"),
    ("image", {"parameters": {"unfreeze_blocks": {"type": "integer", "min": 1, "max": 6}}},
     "refuses unfreeze_blocks=6"),
    ("text", {"parameters": {"drop_mult": {"type": "double", "min": -0.5, "max": 0.5}}},
     "the text trainer refuses drop_mult=-0.5"),
    ("transformer", {"parameters": {"warmup_ratio": {"type": "double", "min": 0.0,
                                                     "max": 1.0}}},
     r"the transformer trainer refuses warmup_ratio=1.0: warmup_ratio must be >= 0 and < 1"),
    ("transformer", {"parameters": {"drop_mult": {"type": "double", "min": 0.1, "max": 0.5}}},
     "the transformer trainer cannot search 'drop_mult'"),
    ("transformer", {"metric": "val_accuracy", "parameters": {"batch_size": {
        "type": "discrete", "values": [16]}}}, "metric 'val_accuracy' is not reported"),
])
def test_bad_spaces_are_refused_naming_the_entry(kind, data, message):
    with pytest.raises(SearchSpaceError, match=message):
        parse_space(kind, data, "space.json")


def test_space_files_are_read_and_missing_entries_take_the_defaults(tmp_path):
    path = tmp_path / "space.json"
    path.write_text(json.dumps({"parameters": {"drop_mult": {"type": "double", "min": 0.2,
                                                              "max": 0.6}}}))
    space = read_space("text", str(path))
    assert (space.metric, space.goal, space.names()) == ("f1_score", "maximize", ["drop_mult"])
    path.write_text("{not json")
    with pytest.raises(SearchSpaceError, match="space.json: not JSON"):
        read_space("text", str(path))


def test_best_trial_steps_return_exactly_the_tunable_parameters():
    """The retraining step takes what the best-trial step returns, by name and type."""
    for kind, function in tune_component.BEST_TRIAL.items():
        component = step_component(function, "img:1")
        outputs = component.component_spec.outputs
        assert {k: v.type for k, v in outputs.items() if k != "trials"} == {
            name: {int: "Integer", float: "Float"}[t] for name, t in TUNABLE[kind].items()}
        inputs = component.component_spec.inputs
        assert set(inputs) == {"gcp_resources", *TUNABLE[kind]}
        assert function.__name__ in rehearse.BEST_TRIAL_STEPS


def _job(goal: str, trials: list[tuple[str, str, dict, float | None]]):
    return aiplatform_v1.HyperparameterTuningJob(
        name="projects/1/locations/europe-west4/hyperparameterTuningJobs/77",
        study_spec=aiplatform_v1.StudySpec(metrics=[aiplatform_v1.StudySpec.MetricSpec(
            metric_id="val_accuracy", goal=goal)]),
        trials=[aiplatform_v1.Trial(
            id=trial_id, state=state,
            parameters=[aiplatform_v1.Trial.Parameter(parameter_id=k, value=v)
                        for k, v in values.items()],
            final_measurement=aiplatform_v1.Measurement(metrics=[] if value is None else [
                aiplatform_v1.Measurement.Metric(metric_id="val_accuracy", value=value)]))
            for trial_id, state, values, value in trials])


def _best(job) -> dict:
    """The trial `choose` takes: the first for the study's goal."""
    maximize = job.study_spec.metrics[0].goal.name == "MAXIMIZE"
    return selection.best_row(selection.trial_table(job), maximize)


def test_the_best_trial_ranks_by_the_study_goal_among_succeeded_trials():
    trials = [("1", "SUCCEEDED", {"learning_rate": 0.01, "batch_size": 32.0}, 0.7),
              ("2", "INFEASIBLE", {"learning_rate": 0.1}, 0.99),  # failed: never chosen
              ("3", "SUCCEEDED", {"learning_rate": 0.001, "batch_size": 16.0}, 0.9),
              ("4", "SUCCEEDED", {"learning_rate": 0.002}, math.nan),
              ("5", "SUCCEEDED", {"learning_rate": 0.003}, 0.9)]  # a tie goes to the earlier
    best = _best(_job("MAXIMIZE", trials))
    assert best["id"] == "3" and _best(_job("MINIMIZE", trials))["id"] == "1"
    defaults = {"learning_rate": 1e-3, "fine_tune_learning_rate": 1e-4, "dropout": 0.2,
                "batch_size": 32, "unfreeze_blocks": 1}
    assert selection.best_values("image", best, defaults) == {
        **defaults, "learning_rate": 0.001, "batch_size": 16}


def test_no_succeeded_trial_is_an_error_and_the_trial_table_is_kept(tmp_path):
    job = _job("MAXIMIZE", [("1", "INFEASIBLE", {}, None), ("2", "SUCCEEDED", {}, None)])
    resources = selection.job_resources(job.name)

    class Trials:
        path, metadata = str(tmp_path / "trials"), {}

    with pytest.raises(selection.TuningError, match="no trial succeeded with a final "
                                                     "val_accuracy"):
        selection.choose("image", resources, {}, Trials, fetch={job.name: job}.__getitem__)
    written = json.loads((tmp_path / "trials" / selection.TRIALS_FILE).read_text())
    assert written["best"] is None and [t["state"] for t in written["trials"]] == [
        "INFEASIBLE", "SUCCEEDED"]
    with pytest.raises(selection.TuningError, match="names no HyperparameterTuningJob"):
        selection.tuning_job_name(json.dumps({"resources": [{"resourceType": "CustomJob",
                                                             "resourceUri": "x"}]}))


def test_trial_arguments_are_the_tunable_parameters_typed_as_the_trainer_takes_them():
    # Vertex passes every value as text, discrete ones as floats
    assert trial.parse_hyperparameters("image", ["--dropout=0.25", "--batch_size", "64.0"]) == {
        "dropout": 0.25, "batch_size": 64}
    with pytest.raises(trial.TrialError, match="unfreeze_blocks.*whole number"):
        trial.parse_hyperparameters("image", ["--unfreeze_blocks=1.5"])
    with pytest.raises(trial.TrialError, match="--epochs: the image trainer cannot tune it"):
        trial.parse_hyperparameters("image", ["--epochs=3"])
    with pytest.raises(trial.TrialError, match="unexpected trial argument 'x'"):
        trial.parse_hyperparameters("text", ["x"])
    with pytest.raises(trial.TrialError, match="AIP_MODEL_DIR is not set"):
        trial.trial_folder({})
    assert trial.trial_folder({"AIP_MODEL_DIR": "gs://b/t/4/model/"}) == "gs://b/t/4"


def test_a_trial_runs_the_training_step_with_its_values_in_its_own_folder():
    step = {"inputs": {"parameterValues": {"learning_rate": 0.001, "epochs": 3},
                       "artifacts": {"dataset": {"artifacts": [{"uri": "gs://b/d"}]}}},
            "outputs": {"parameters": {"gcp_resources": {"outputFile": "/gcs/x"}},
                        "artifacts": {"trials": {}}, "outputFile": "/gcs/y"}}
    result = trial.trial_executor_input(step, {"model": "system.Model"},
                                        {"learning_rate": 0.01}, "val_accuracy", "gs://b/t/2")
    assert result["inputs"]["parameterValues"] == {"learning_rate": 0.01, "epochs": 3,
                                                   "hypertune_metric": "val_accuracy"}
    assert result["inputs"]["artifacts"] == step["inputs"]["artifacts"]
    assert result["outputs"]["artifacts"]["model"]["artifacts"][0]["uri"] == "gs://b/t/2/model"
    assert result["outputs"]["outputFile"].endswith("/b/t/2/executor_output.json")
    assert step["inputs"]["parameterValues"]["learning_rate"] == 0.001  # not changed


def _launcher_args(out, kind: str) -> list[str]:
    """The compiled `kind` tuning step's command line, its inputs at their defaults (the
    outputs and the trials' executor input left as the placeholders the backend fills)."""
    spec = json.loads((out / f"{kind}_tuning_pipeline.json").read_text())
    component = spec["components"][f"comp-tune-train-{kind}-classifier"]
    params = component["inputDefinitions"]["parameters"]
    container = spec["deploymentSpec"]["executors"][component["executorLabel"]]["container"]
    assert container["command"] == ["python3", "-m", rehearse.TUNING_JOB_LAUNCHER]

    def value(arg: str) -> str:
        match = re.fullmatch(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}", arg)
        if not match:
            return arg
        default = params[match.group(1)]["defaultValue"]
        return default if isinstance(default, str) else json.dumps(default)

    return [value(arg) for arg in container["args"]]


def _tuning_request(out, kind: str) -> aiplatform_v1.HyperparameterTuningJob:
    """The job the compiled `kind` tuning step creates, from its defaults."""
    return launch.tuning_job(launch.parse_args(_launcher_args(out, kind)))


def test_compiled_tuning_jobs_have_the_study_trial_counts_and_gpu_pools(tmp_path, capsys):
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"metric": "val_loss", "goal": "minimize", "parameters": {
        "learning_rate": {"type": "double", "min": 1e-4, "max": 1e-2, "scale": "log"},
        "unfreeze_blocks": {"type": "integer", "min": 1, "max": 4}}}))
    out = _compile_here(tmp_path, "--tune-trials", "8", "--tune-parallel-trials", "2",
                        "--image-search-space", str(space), "--train-text-accelerator-type",
                        "NVIDIA_L4", "--train-text-machine-type", "g2-standard-8",
                        "--pipelines", "image_tuning_pipeline,text_tuning_pipeline")
    image = _tuning_request(out, "image")
    assert (image.max_trial_count, image.parallel_trial_count) == (8, 2)
    assert [(m.metric_id, m.goal.name) for m in image.study_spec.metrics] == [
        ("val_loss", "MINIMIZE")]
    params = {p.parameter_id: p for p in image.study_spec.parameters}
    assert params["learning_rate"].scale_type.name == "UNIT_LOG_SCALE"
    assert (params["learning_rate"].double_value_spec.min_value,
            params["learning_rate"].double_value_spec.max_value) == (1e-4, 1e-2)
    assert (params["unfreeze_blocks"].integer_value_spec.min_value,
            params["unfreeze_blocks"].integer_value_spec.max_value) == (1, 4)
    (pool,) = image.trial_job_spec.worker_pool_specs
    machine = DEFAULT_MACHINES["train_image"]
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_type.name,
            pool.machine_spec.accelerator_count, pool.replica_count) == (
        machine.machine_type, machine.accelerator_type, machine.accelerator_count, 1)
    assert pool.container_spec.image_uri == f"{REGISTRY}/tensorflow:0a1b2c3"
    assert list(pool.container_spec.command) == ["python3", "-m", "components.tune.trial"]
    assert list(pool.container_spec.args)[:4] == ["--kind", "image", "--metric", "val_loss"]

    (pool,) = _tuning_request(out, "text").trial_job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.machine_spec.accelerator_type.name) == (
        "g2-standard-8", "NVIDIA_L4")
    assert pool.container_spec.image_uri == f"{REGISTRY}/fastai:0a1b2c3"
    # the cost of a run is printed at compile time: known V100 prices, unknown L4
    err = capsys.readouterr().err
    price = tuning.machine_price(machine)
    assert "image tuning pipeline runs up to 8 trials, 2 at a time" in err
    assert f"${price:.2f}/h" in err and f"${price * 8:.2f} for every hour" in err
    assert "text tuning pipeline" in err and "no list price known" in err


class FakeJobService:
    """Stands in for Vertex's JobServiceClient (the only fake: jobs are Vertex's messages);
    `states`: the job's state at each read, the last one kept."""

    def __init__(self, *states: str, error: str = "") -> None:
        self.states, self.error = list(states), error
        self.created, self.reads, self.cancelled = [], [], []

    def create_hyperparameter_tuning_job(self, parent, hyperparameter_tuning_job):
        self.created.append((parent, hyperparameter_tuning_job))
        return aiplatform_v1.HyperparameterTuningJob(
            hyperparameter_tuning_job, name="projects/p/locations/europe-west4/"
                                            "hyperparameterTuningJobs/5")

    def get_hyperparameter_tuning_job(self, name, retry=None):
        assert retry is not None  # transient errors are retried
        self.reads.append(name)
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return aiplatform_v1.HyperparameterTuningJob(name=name, state=state,
                                                     error={"code": 9, "message": self.error})

    def cancel_hyperparameter_tuning_job(self, name):
        self.cancelled.append(name)


def _launched(tmp_path, service):
    args = launch.parse_args(_launcher_args(_compile(tmp_path), "image")[:-1] + [
        str(tmp_path / "gcp_resources")])
    return args, launch.launch(args, service, sleep=lambda _: None)


def test_the_launcher_creates_the_job_names_it_and_waits_for_its_end(tmp_path, monkeypatch):
    monkeypatch.setenv(launch.SYSTEM_LABELS, '{"vertex-ai-pipelines-run-billing-id": "42"}')
    service = FakeJobService("JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED")
    args, job = _launched(tmp_path, service)
    ((parent, sent),) = service.created
    assert parent == f"projects/{args.project}/locations/{args.location}"
    assert sent.labels == {"vertex-ai-pipelines-run-billing-id": "42"}
    assert sent.study_spec.metrics[0].metric_id == "val_accuracy"
    assert "encryption_spec" not in sent  # unset, not an empty message
    assert job.state.name == "JOB_STATE_SUCCEEDED" and service.reads == [job.name] * 3
    # gcp_resources, as GCPC writes it: what the console links and the best-trial step reads
    resources = (tmp_path / "gcp_resources").read_text()
    assert json.loads(resources)["resources"][0]["resourceUri"] == (
        f"https://europe-west4-aiplatform.googleapis.com/v1/{job.name}")
    assert selection.tuning_job_name(resources) == job.name
    # restarted, the step waits for the job it created instead of creating another
    again = FakeJobService("JOB_STATE_SUCCEEDED")
    launch.launch(args, again, sleep=lambda _: None)
    assert again.created == [] and again.reads == [job.name]


def test_a_failed_job_fails_the_step_with_its_error(tmp_path, capsys):
    service = FakeJobService("JOB_STATE_RUNNING", "JOB_STATE_FAILED", error="quota exceeded")
    with pytest.raises(launch.TuningJobError, match=r"hyperparameterTuningJobs/5 ended "
                                                    r"JOB_STATE_FAILED: quota exceeded \(code 9\)"):
        _launched(tmp_path, service)
    args = _launcher_args(_compile(tmp_path), "image")[:-1] + [str(tmp_path / "again")]
    assert launch.main(args, FakeJobService("JOB_STATE_CANCELLED")) == 2
    assert "ended JOB_STATE_CANCELLED: no error given" in capsys.readouterr().err


def test_a_sigterm_cancels_the_job(tmp_path):
    class Terminated(FakeJobService):
        def get_hyperparameter_tuning_job(self, name, retry=None):
            os.kill(os.getpid(), signal.SIGTERM)  # the run cancelled while the job runs
            return super().get_hyperparameter_tuning_job(name, retry)

    service = Terminated("JOB_STATE_RUNNING")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        _launched(tmp_path, service)
    assert exited.value.code == 128 + signal.SIGTERM
    assert service.cancelled == ["projects/p/locations/europe-west4/hyperparameterTuningJobs/5"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_vertex_s_message_refuses_a_field_it_does_not_have(tmp_path):
    args = launch.parse_args(_launcher_args(_compile(tmp_path), "image"))
    args.worker_pool_specs[0]["machine_spec"]["gpu_type"] = "NVIDIA_L4"
    with pytest.raises(json_format.ParseError, match="gpu_type"):
        launch.tuning_job(args)


@pytest.mark.parametrize("rule, field", [("", None), ("median", "median_automated_stopping_spec"),
                                         ("decay-curve", "decay_curve_stopping_spec")])
def test_the_study_stops_trials_early_by_the_rule_asked_for_and_only_then(tmp_path, rule, field):
    flags = ["--tune-early-stopping", rule, "--pipelines", "image_tuning_pipeline"] if rule else []
    job = _tuning_request(_compile(tmp_path, *flags), "image")
    study = aiplatform_v1.StudySpec.pb(job.study_spec)
    assert study.WhichOneof("automated_stopping_spec") == field
    assert field is None or getattr(study, field).use_elapsed_duration  # trials share machines
    assert job.study_spec.measurement_selection_type.name == "BEST_MEASUREMENT"


def test_a_trial_stopped_early_is_ranked_by_its_last_reported_value():
    job = _job("MAXIMIZE", [("1", "SUCCEEDED", {"learning_rate": 0.01}, 0.7),
                            ("2", "STOPPING", {"learning_rate": 0.1}, None),
                            ("3", "STOPPING", {"learning_rate": 0.2}, None)])
    job.trials[1].measurements = [aiplatform_v1.Measurement(step_count=s, metrics=[
        aiplatform_v1.Measurement.Metric(metric_id="val_accuracy", value=v)])
        for s, v in ((1, 0.9), (2, 0.8))]  # its last epoch, not its best, is ranked
    table = selection.trial_table(job)
    assert [(r["state"], r["metric"]) for r in table] == [
        ("SUCCEEDED", 0.7), ("STOPPING", 0.8), ("STOPPING", None)]
    assert _best(job)["id"] == "2"  # stopped, not failed
    assert _best(_job("MINIMIZE", [("1", "SUCCEEDED", {}, 0.7)] + [
        ("2", "STOPPING", {}, 0.6)]))["id"] == "2"


@pytest.mark.parametrize("flags, spot, tensorboard", [
    ([], False, ""),
    (["--spot", "--tensorboard", "projects/p/locations/us-central1/tensorboards/123",
      "--base-output-directory", "gs://b/o", "--service-account", "sa@p.iam.gserviceaccount.com"],
     True, "projects/p/locations/us-central1/tensorboards/123"),
])
def test_trials_run_on_spot_vms_and_report_to_tensorboard_as_training_does(tmp_path, flags, spot,
                                                                          tensorboard):
    out = _compile(tmp_path, *flags)
    for kind in ("image", "text", "transformer"):
        job = _tuning_request(out, kind)
        assert (job.trial_job_spec.scheduling.strategy.name == "SPOT") is spot
        assert job.trial_job_spec.tensorboard == tensorboard
        # the trials' folder, the launcher's argument as GCPC's launchers get output URIs,
        # never a parameter default (which has no precedent)
        assert job.trial_job_spec.base_output_directory.output_uri_prefix == \
            "{{$.outputs.artifacts['trials'].uri}}"
        spec = json.loads((out / f"{kind}_tuning_pipeline.json").read_text())
        defaults = spec["components"][f"comp-tune-train-{kind}-classifier"]["inputDefinitions"]
        assert "{{$.outputs" not in json.dumps(defaults)


def test_the_best_values_feed_the_training_step_and_tuning_runs_after_the_data(tmp_path):
    spec = json.loads((_compile(tmp_path) / "image_tuning_pipeline.json").read_text())
    tasks = spec["root"]["dag"]["tasks"]
    # after the data (and the weights' fingerprint from preflight)
    assert tasks["tune-train-image-classifier"]["dependentTasks"] == ["preflight-image",
                                                                      "shard-images"]
    train = tasks["train-image-classifier"]["inputs"]["parameters"]
    for name in TUNABLE["image"]:
        assert train[name] == {"taskOutputParameter": {"outputParameterKey": name,
                                                       "producerTask": "best-image-trial"}}
    assert train["epochs"] == {"componentInputParameter": "epochs"}
    assert spec["pipelineInfo"]["name"] == "image-classifier-tuning"


@pytest.mark.parametrize("flags, message", [
    (["--tune-parallel-trials", "5", "--tune-trials", "4"], "--tune-parallel-trials must be in"),
    (["--tune-trials", "0"], "--tune-trials must be >= 1"),
    (["--tune-algorithm", "GRID_SEARCH"], "GRID_SEARCH cannot search the double range"),
    (["--text-search-space", "/nonexistent/space.json"], "No such file"),
    (["--target", "kubeflow", "--tune-early-stopping", "median"],
     "--tune-early-stopping is a Vertex option; --target kubeflow cannot honour it"),
])
def test_bad_tuning_options_are_refused(tmp_path, flags, message):
    with pytest.raises(SystemExit, match=message):
        compile_cli.main(["--output-dir", str(tmp_path), *flags])


def _rehearsed(tmp_path, kind: str, trainer: str, data, small: dict) -> tuple[dict, dict]:
    """(summary, trial table) of the rehearsed `kind` tuning pipeline: two trials, one at a
    time; the tuning step (`tune-<trainer>`), both trials and the retraining succeeded."""
    out = _compile(tmp_path, "--tune-trials", "2", "--tune-parallel-trials", "1",
                   "--pipelines", "image_tuning_pipeline,text_tuning_pipeline")
    summary = rehearse.rehearse(str(out / f"{kind}_tuning_pipeline.json"), str(tmp_path / "r"),
                                {"data_uri": str(data), **small})
    (trials_json,) = (tmp_path / "r" / "gcs").rglob(selection.TRIALS_FILE)
    table = json.loads(trials_json.read_text())
    assert [t["state"] for t in table["trials"]] == ["SUCCEEDED", "SUCCEEDED"]
    tasks = {t["display_name"]: t for t in summary["rehearsal"]["tasks"]}
    assert (tasks[f"tune-{trainer}"]["state"], tasks[f"tune-{trainer}"]["replicas"]) == (
        "succeeded", 2)
    assert tasks[f"train-{trainer}"]["state"] == "succeeded"
    return summary, table


@pytest.mark.slow
def test_image_tuning_pipeline_rehearsed_with_the_default_space(tmp_path):
    """The default image space (1e-05 among its bounds, which once reached GCPC's launcher
    as a string) creates its job, and two trials report val_accuracy. The base is a
    one-block-per-stage DenseNet from a weights file (conftest)."""
    data = tmp_path / "images"
    write_class_images(str(data), per_class=16)
    _, table = _rehearsed(tmp_path, "image", "densenet121", data, {
        "image_size": "32", "min_shards_per_split": "1",
        "weights": write_densenet_weights(tmp_path / "notop.h5", 32),
        "epochs": "1", "fine_tune_epochs": "0", "registration_threshold": "0.0"})
    space = DEFAULT_SPACES["image"]["parameters"]
    for row in table["trials"]:
        folder = tmp_path / "r" / "gcs" / row["folder"][len("gs://"):]
        (report,) = [json.loads(r) for r in (folder / "hypertune.metrics").read_text()
                     .splitlines()]  # one epoch: one val_accuracy, through hypertune
        assert row["metric"] == float(report["val_accuracy"])
        rate = row["parameters"]["fine_tune_learning_rate"]
        assert space["fine_tune_learning_rate"]["min"] <= rate <= space[
            "fine_tune_learning_rate"]["max"]


@pytest.mark.slow
def test_text_tuning_pipeline_rehearsed_trials_report_and_the_best_values_retrain(tmp_path):
    """Two trials run as Vertex runs them (the trial container with `--name=value`
    arguments and AIP_* folders per trial), report the study metric through hypertune,
    and the training step gets the best trial's values."""
    csv = tmp_path / "reviews.csv"
    write_reviews_csv(str(csv), rows=80, seed=3)
    summary, table = _rehearsed(tmp_path, "text", "text", csv, {
        "epochs": "2", "lm_epochs": "0", "min_freq": "1", "pretrained": "false",
        "model_config": '{"emb_sz": 16, "n_hid": 24, "n_layers": 1}'})
    request = json.loads((tmp_path / "r" / "vertex-requests" /
                          "tune-train-text-classifier.json").read_text())
    assert request["type"] == "HyperparameterTuningJob"
    for row in table["trials"]:
        # each trial trained in its own folder and reported one value per classifier epoch
        assert row["folder"].endswith(f"/trials/{row['id']}")
        folder = tmp_path / "r" / "gcs" / row["folder"][len("gs://"):]
        reports = (folder / "hypertune.metrics").read_text().splitlines()
        # 2 epochs per attempt: a classifier that learnt nothing trains again (restarts)
        trained = json.loads((folder / "model" / "metrics.json").read_text())
        attempts = 1 + len(trained["run"]["restarts"])
        assert len(reports) == 2 * attempts and all("f1_score" in json.loads(r)
                                                    for r in reports)
        assert row["metric"] == max(float(json.loads(r)["f1_score"]) for r in reports)
        assert (folder / "model" / "export.pkl").exists()
        assert row["parameters"]["batch_size"] in (16.0, 32.0, 64.0)
    # the retrained model was trained with the best trial's values
    config = json.loads(open(os.path.join(summary["artifacts"]["model"],
                                          "metrics.json")).read())["config"]
    assert {k: config[k] for k in TUNABLE["text"]} == pytest.approx(table["best"]["values"])
