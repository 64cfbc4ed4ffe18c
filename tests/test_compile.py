"""The compiled pipeline JSON, checked with the real Vertex SDK classes (offline).

The Vertex service itself cannot run here: these tests stop at what the SDK builds
from our JSON, with anonymous credentials and no network.
"""

import inspect
import json
import os
import re
import subprocess
import sys
import threading

import pytest
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform, aiplatform_v1
from kfp import dsl

import compile as compile_cli
from pipelines.definitions.help_text import Words
from pipelines.definitions.machine import DEFAULT_MACHINES, GPU_MACHINES, Machine, boot_disk_type
from pipelines.definitions.steps import Steps, parameter, spoken
from pipelines.definitions.vertex import CPU_MACHINE_TYPES, N1_GPU_VCPUS, machine_problems
from pipelines.quota import gpus_at_once
from tests.conftest import compile_once

REGISTRY = "europe-west4-docker.pkg.dev/acme-ml/pipelines"


def _compile(tmp_path, *extra):
    """The compiled folder, shared by the tests that pass the same flags (read only)."""
    return compile_once(tmp_path, "--registry", REGISTRY, "--tag", "0a1b2c3", *extra)


def _compile_here(tmp_path, *extra):
    """A compile of this test's own: what it prints, or in its own environment."""
    out = tmp_path / "build"
    assert compile_cli.main(["--output-dir", str(out), "--registry", REGISTRY,
                             "--tag", "0a1b2c3", *extra]) == 0
    return out


def _spec(tmp_path, pipeline: str, *extra) -> dict:
    """The compiled JSON of `pipeline`, from the shared compile with these flags."""
    return json.loads((_compile(tmp_path, *extra) / f"{pipeline}.json").read_text())


def _pools(spec: dict, component: str) -> list[dict]:
    params = spec["components"][f"comp-{component}"]["inputDefinitions"]["parameters"]
    return params["worker_pool_specs"]["defaultValue"]


def test_shard_step_runs_on_a_cpu_machine_with_the_pinned_image(tmp_path):
    pools = _pools(_spec(tmp_path, "image_pipeline"), "shard-images")
    assert len(pools) == 1
    pool = aiplatform_v1.WorkerPoolSpec.from_json(json.dumps(pools[0]))
    assert pool.machine_spec.machine_type == "n1-highcpu-16"
    assert not pool.machine_spec.accelerator_type
    assert pool.replica_count == 1
    assert pool.container_spec.image_uri == f"{REGISTRY}/tensorflow:0a1b2c3"
    # the step runs our installed code, nothing pip-installed at run time
    assert "pip install" not in " ".join(pool.container_spec.command)


def test_machine_options_and_a_full_image_uri_reach_the_job(tmp_path):
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"shard_machine_type": "n2-highcpu-32",
                                  "service_account": "runner@acme-ml.iam.gserviceaccount.com"}))
    uri = "europe-west4-docker.pkg.dev/acme-ml/pipelines/tf@sha256:" + "a" * 64
    spec = _spec(tmp_path, "image_pipeline", "--pipelines", "image_pipeline", "--config",
                 str(config), "--spot", "--network", "projects/123/global/networks/ml",
                 "--encryption-key",
                 "projects/acme-ml/locations/europe-west4/keyRings/r/cryptoKeys/k",
                 "--image", f"tensorflow={uri}")
    params = spec["components"]["comp-shard-images"]["inputDefinitions"]["parameters"]
    (pool,) = _pools(spec, "shard-images")
    assert (pool["machine_spec"]["machine_type"], pool["container_spec"]["image_uri"]) == (
        "n2-highcpu-32", uri)
    assert params["strategy"]["defaultValue"] == "SPOT"
    assert params["service_account"]["defaultValue"] == "runner@acme-ml.iam.gserviceaccount.com"
    assert params["network"]["defaultValue"] == "projects/123/global/networks/ml"
    assert params["encryption_spec_key_name"]["defaultValue"].endswith("cryptoKeys/k")


def test_yaml_on_request_and_no_latest_tags(tmp_path):
    names = ("image_pipeline", "text_tuning_pipeline")  # one plain, one tuning variant
    out = _compile(tmp_path, "--yaml", "--pipelines", ",".join(names))
    assert sorted(os.listdir(out)) == sorted(f"{n}.{e}" for n in names for e in ("json", "yaml"))
    for name in names:
        as_yaml = yaml.safe_load((out / f"{name}.yaml").read_text())
        assert as_yaml == json.loads((out / f"{name}.json").read_text())
    with pytest.raises(SystemExit, match="latest"):
        compile_cli.main(["--output-dir", str(tmp_path), "--tag", "latest"])
    with pytest.raises(SystemExit, match="latest"):
        compile_cli.main(["--output-dir", str(tmp_path), "--image", "tensorflow=x/tf:latest"])


def test_no_credentials_in_compiled_json(tmp_path, monkeypatch):
    # Credentials the compiling machine has must not travel into the uploaded JSON.
    key = tmp_path / "key-7f3a9c.json"
    key.write_text(json.dumps({"type": "service_account", "private_key": "MARKER-5e1d",
                               "client_email": "ci@acme.iam.gserviceaccount.com"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    out = _compile_here(tmp_path)
    for name in ("image_pipeline.json", "text_pipeline.json", "transformer_pipeline.json"):
        text = (out / name).read_text()
        for marker in ("MARKER-5e1d", "key-7f3a9c", "ci@acme", "private_key"):
            assert marker not in text, (name, marker)


def test_trainer_runs_on_gpus_with_replicas_and_restart_settings(tmp_path):
    spec = _spec(tmp_path, "image_pipeline")
    (chief,) = _pools(spec, "train-image-classifier")
    pool = aiplatform_v1.WorkerPoolSpec.from_json(json.dumps(chief))
    assert pool.machine_spec.machine_type == "n1-standard-8"
    assert pool.machine_spec.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_TESLA_V100
    assert pool.machine_spec.accelerator_count == 2
    assert pool.container_spec.image_uri == f"{REGISTRY}/tensorflow:0a1b2c3"
    evaluate = _pools(spec, "evaluate-image-classifier")[0]
    assert evaluate["machine_spec"] == {"machine_type": "n1-standard-4"}
    params = spec["components"]["comp-train-image-classifier"]["inputDefinitions"]["parameters"]
    assert params["restart_job_on_worker_restart"]["defaultValue"] is False

    spec = _spec(tmp_path, "image_pipeline", "--pipelines", "image_pipeline",
                 "--train-image-accelerator-type", "NVIDIA_L4",
                 "--train-image-accelerator-count", "4", "--train-image-machine-type",
                 "g2-standard-48", "--train-image-replica-count", "3", "--spot",
                 "--restart-job-on-worker-restart")
    pools = [aiplatform_v1.WorkerPoolSpec.from_json(json.dumps(p))
             for p in _pools(spec, "train-image-classifier")]
    # Vertex: pool 0 is the chief, pool 1 the other replicas, same machines
    assert [p.replica_count for p in pools] == [1, 2]
    for p in pools:
        assert p.machine_spec.machine_type == "g2-standard-48"
        assert p.machine_spec.accelerator_type == aiplatform_v1.AcceleratorType.NVIDIA_L4
        assert p.machine_spec.accelerator_count == 4
    params = spec["components"]["comp-train-image-classifier"]["inputDefinitions"]["parameters"]
    assert params["strategy"]["defaultValue"] == "SPOT"
    assert params["restart_job_on_worker_restart"]["defaultValue"] is True


SERVING = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15@sha256:" + "b" * 64
# A text model's whole folder in our fastai image, whose default command is the prediction
# server (pipelines.serve, reading a fastai or a transformer folder) on Vertex's port
OUR_SERVER = {"serving_image": f"{REGISTRY}/fastai:0a1b2c3", "subdir": ".", "port": 8080,
              "health_route": "/health", "predict_route": "/predict"}


@pytest.mark.parametrize("pipeline, served", [
    # the image model: its SavedModel in the prebuilt TensorFlow image given
    ("image_pipeline.json", {"serving_image": SERVING}),
    ("text_pipeline.json", OUR_SERVER), ("transformer_pipeline.json", OUR_SERVER),
])
def test_model_upload_only_when_the_gate_says_so(tmp_path, pipeline, served):
    spec = json.loads((_compile(tmp_path, "--serving-image", SERVING, "--encryption-key",
                                "projects/p/locations/l/keyRings/r/cryptoKeys/k")
                       / pipeline).read_text())
    tasks = spec["root"]["dag"]["tasks"]
    condition = next(t for t in tasks.values()
                     if "registration-gate" in t.get("triggerPolicy", {}).get("condition", ""))
    inner = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    assert inner["find-registered-model"]["inputs"]["parameters"]["project"][
        "runtimeValue"]["constant"] == "{{$.pipeline_google_cloud_project_id}}"
    assert inner["find-registered-model"]["cachingOptions"].get("enableCache") is not True
    # If the display name exists: a new version (parent_model); Else: a new model
    branches = spec["components"][inner["condition-branches-2"]["componentRef"]["name"]][
        "dag"]["tasks"]
    uploads = {}
    for branch in branches.values():
        (task,) = spec["components"][branch["componentRef"]["name"]]["dag"]["tasks"].values()
        uploads[branch["triggerPolicy"]["condition"]] = task
    exists = "inputs.parameter_values['pipelinechannel--find-registered-model-exists'] == true"
    version, new = uploads[exists], uploads[f"!({exists})"]
    assert version["inputs"]["artifacts"]["parent_model"]["componentInputArtifact"] == \
        "pipelinechannel--find-registered-model-parent"
    assert "parent_model" not in new["inputs"]["artifacts"]
    for upload in (version, new):
        assert upload["inputs"]["artifacts"]["unmanaged_container_model"][
            "componentInputArtifact"] == "pipelinechannel--serving-model-unmanaged_model"
        params = upload["inputs"]["parameters"]
        assert params["labels"]["componentInputParameter"] == \
            "pipelinechannel--serving-model-labels"
        assert params["location"]["runtimeValue"]["constant"] == \
            "{{$.pipeline_google_cloud_location}}"
        assert params["encryption_spec_key_name"]["runtimeValue"]["constant"].endswith(
            "cryptoKeys/k")
    serving = inner["serving-model"]["inputs"]["parameters"]
    assert serving["run_name"]["runtimeValue"]["constant"] == "{{$.pipeline_job_name}}"
    assert {name: serving[name]["runtimeValue"]["constant"] for name in served} == served
    # the gate and the serving-model copy are light steps, not GPU custom jobs
    assert "worker_pool_specs" not in spec["components"]["comp-registration-gate"][
        "inputDefinitions"]["parameters"]
    assert "decision" in spec["components"]["comp-registration-gate"]["outputDefinitions"][
        "artifacts"]


@pytest.mark.parametrize("pipeline, machine", [
    ("image_pipeline.json", "n1-standard-8"),
    ("text_pipeline.json", "n1-standard-4"),
    ("transformer_pipeline.json", "n1-standard-4"),
])
def test_prediction_is_a_cpu_job_run_only_when_predict_uri_is_set(tmp_path, pipeline, machine):
    spec = json.loads((_compile(tmp_path) / pipeline).read_text())
    tasks = spec["root"]["dag"]["tasks"]
    condition = next(t for t in tasks.values()
                     if "predict_uri" in t.get("triggerPolicy", {}).get("condition", ""))
    assert condition["triggerPolicy"]["condition"] == \
        "inputs.parameter_values['pipelinechannel--predict_uri'] != ''"
    inner = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    (predict,) = inner.values()
    assert predict["taskInfo"]["name"] == "predict"
    assert predict["inputs"]["artifacts"]["model"]["componentInputArtifact"].endswith("-model")
    assert predict["inputs"]["parameters"]["data_uri"] == {
        "componentInputParameter": "pipelinechannel--predict_uri"}
    (pool,) = _pools(spec, "predict")
    assert pool["machine_spec"] == {"machine_type": machine}
    assert spec["root"]["inputDefinitions"]["parameters"]["predict_uri"]["defaultValue"] == ""


def test_language_model_trains_on_a_gpu_after_a_light_preflight(tmp_path):
    spec = _spec(tmp_path, "lm_pipeline", "--pipelines", "lm_pipeline",
                 "--train-lm-accelerator-type", "NVIDIA_L4", "--train-lm-machine-type",
                 "g2-standard-8")
    (pool,) = _pools(spec, "train-language-model")
    assert pool["container_spec"]["image_uri"] == f"{REGISTRY}/fastai:0a1b2c3"
    assert pool["machine_spec"] == {"machine_type": "g2-standard-8",
                                    "accelerator_type": "NVIDIA_L4", "accelerator_count": 1}
    tasks = spec["root"]["dag"]["tasks"]
    # condition-1 holds the light MLflow step, run when tracking_uri is set
    assert set(tasks) == {"preflight-lm", "train-language-model", "condition-1"}
    assert "worker_pool_specs" not in spec["components"]["comp-track-language-model"][
        "inputDefinitions"]["parameters"]
    fingerprint = tasks["train-language-model"]["inputs"]["parameters"]["corpus_fingerprint"]
    assert fingerprint["taskOutputParameter"]["producerTask"] == "preflight-lm"
    assert tasks["preflight-lm"]["cachingOptions"] == {}  # never cached
    outputs = spec["root"]["outputDefinitions"]["artifacts"]
    assert set(outputs) == {"metrics", "lm_assets"}


@pytest.mark.parametrize("name, param, data", [
    ("image_pipeline", "data_uri", "gs://acme/pets"), ("text_pipeline", "data_uri", "gs://acme/r.csv"),
    ("lm_pipeline", "corpus_uri", "gs://acme/wiki"),
    ("transformer_pipeline", "data_uri", "gs://acme/r.csv")])
def test_every_pipeline_loads_in_pipeline_job_with_help_and_defaults_but_the_data(
        tmp_path, name, param, data):
    params = _spec(tmp_path, name)["root"]["inputDefinitions"]["parameters"]
    assert params.keys() >= {param, "seed", "epochs", "batch_size"}
    for key, declared in params.items():
        assert declared.get("description"), f"{key} has no help text for the console"
        assert key == param or "defaultValue" in declared, f"{key} has no default"

    def job(**values):
        return aiplatform.PipelineJob(
            display_name=name, template_path=str(_compile(tmp_path) / f"{name}.json"),
            pipeline_root="gs://acme-ml-pipelines/root", parameter_values=values,
            project="acme-ml", location="europe-west4", credentials=AnonymousCredentials())

    values = job(**{param: data})._gca_resource.runtime_config.parameter_values
    # unset parameters are left to the compiled defaults, which Vertex fills in
    assert dict(values) == {param: data}
    with pytest.raises(ValueError, match="epochz"):
        job(**{param: data, "epochz": 3})


def test_no_upload_without_a_pinned_serving_image(tmp_path):
    spec = _spec(tmp_path, "image_pipeline")
    assert "comp-model-upload" not in spec["components"]
    assert "comp-registration-gate" in spec["components"]  # the decision is still reported
    with pytest.raises(SystemExit, match="--serving-image"):
        _compile_here(tmp_path, "--serving-image",
                 "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest")


@pytest.mark.parametrize("flags, message", [
    (["--train-image-accelerator-type", "NVIDIA_FOO"],
     "--train-image-accelerator-type 'NVIDIA_FOO' is not a Vertex GPU type"),
    (["--train-image-accelerator-count", "-2"], "--train-image-accelerator-count must be one of"),
    (["--evaluate-image-accelerator-type", "NVIDIA_TESLA_T4"],
     "--evaluate-image-accelerator-count must be one of .* got 0"),
    (["--evaluate-image-accelerator-count", "1"],
     "--evaluate-image-accelerator-count 1 needs --evaluate-image-accelerator-type"),
    (["--train-image-replica-count", "0"], "--train-image-replica-count must be >= 1, got 0"),
    (["--shard-replica-count", "2"], "--shard-replica-count must be 1"),
    (["--train-text-machine-type", "a2-highgpu-1g"],
     "--train-text-machine-type 'a2-highgpu-1g' cannot carry 1 x NVIDIA_TESLA_T4: it comes "
     "with 1 x NVIDIA_TESLA_A100"),
    (["--shard-machine-type", "N1 standard"], "--shard-machine-type 'N1 standard' is not a"),
    # pairs Vertex's machine table refuses (configure-compute#gpu-compatibility-table)
    (["--train-text-accelerator-count", "8"],
     r"--train-text-accelerator-count must be one of \[1, 2, 4\] with NVIDIA_TESLA_T4, got 8"),
    (["--train-image-accelerator-count", "16"],
     r"must be one of \[1, 2, 4, 8\] with NVIDIA_TESLA_V100, got 16"),
    (["--train-text-machine-type", "g2-standard-8", "--train-text-accelerator-type", "NVIDIA_L4",
      "--train-text-accelerator-count", "2"],
     "'g2-standard-8' cannot carry 2 x NVIDIA_L4: it comes with 1 x NVIDIA_L4"),
    (["--train-text-machine-type", "a2-highgpu-1g", "--train-text-accelerator-type",
      "NVIDIA_TESLA_A100", "--train-text-accelerator-count", "4"],
     "'a2-highgpu-1g' cannot carry 4 x NVIDIA_TESLA_A100: it comes with 1 x"),
    (["--train-text-machine-type", "a2-ultragpu-1g", "--train-text-accelerator-type",
      "NVIDIA_TESLA_A100"], "it comes with 1 x NVIDIA_A100_80GB"),
    (["--train-text-machine-type", "a3-highgpu-8g", "--train-text-accelerator-type",
      "NVIDIA_H100_MEGA_80GB", "--train-text-accelerator-count", "8"],
     "it comes with 8 x NVIDIA_H100_80GB"),
    (["--train-image-machine-type", "n1-standard-32", "--train-image-accelerator-count", "1"],
     "'n1-standard-32' has 32 vCPUs; 1 x NVIDIA_TESLA_V100 allows at most 12 .* or 4 GPUs"),
    (["--shard-machine-type", "n1-standrad-8"],
     r"'n1-standrad-8' is not a machine type Vertex custom training offers; did you mean "
     r"\['n1-standard-8'"),
    (["--train-text-machine-type", "e2-standard-8"], "'e2-standard-8' cannot carry "
     "NVIDIA_TESLA_T4: it needs an n1 machine"),
    (["--train-text-accelerator-type", "NVIDIA_L4"], "'n1-standard-8' cannot carry NVIDIA_L4: "
     "it comes on g2-standard-12"),
])
def test_bad_machine_settings_are_refused_naming_the_option(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        _compile_here(tmp_path, *flags)
    assert exit_info.value.code != 0
    assert re.search(message, str(exit_info.value.code))
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize("text, message", [
    ('{"spot": "false"}', ': spot must be a JSON bool, got "false"'),
    ('{"train_image_replica_count": "2"}', ": train_image_replica_count must be a JSON int"),
    ('{"restart_job_on_worker_restart": 1}', ": restart_job_on_worker_restart must be a JSON bool"),
    ('{"spot": true,}', " is not valid JSON: Expecting property name"),
    ('["spot"]', " must hold a JSON object of option names"),
    ('{"colour": 1, "spot": true}', ": unknown option(s) ['colour']"),
])
def test_a_config_file_of_other_than_typed_options_is_named(tmp_path, capsys, text, message):
    config = tmp_path / "settings.json"
    config.write_text(text)
    with pytest.raises(SystemExit):
        _compile_here(tmp_path, "--config", str(config))
    assert f"{config}{message}" in capsys.readouterr().err


def test_one_tag_rule_for_the_trigger_make_images_and_compile():
    """Cloud Build triggers tag images with SHORT_SHA, the commit's first 7 hex digits;
    `make images` and compile.py's default must name the same tag, or a pipeline compiled
    here looks for an image no trigger pushed (they used `git rev-parse --short=12`)."""
    root = os.path.dirname(compile_cli.__file__)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True, cwd=root).stdout.strip()
    short_sha = sha[:7]  # Cloud Build's SHORT_SHA
    with open(os.path.join(root, "containers", "cloudbuild.yaml")) as f:
        assert yaml.safe_load(f)["substitutions"]["_TAG"] == "${SHORT_SHA}"
    uris = compile_cli.image_uris(compile_cli.parse_args(["--registry", REGISTRY]))
    assert uris == {runtime: f"{REGISTRY}/{runtime}:{short_sha}"
                    for runtime in compile_cli.RUNTIMES}
    make = subprocess.run(["make", "-s", "-n", "--no-print-directory", "images",
                           "PROJECT=acme"], capture_output=True, text=True, check=True,
                          cwd=root).stdout
    assert f"_TAG={short_sha}," in make, make


@pytest.mark.parametrize("pipeline, check, reader, trainer, files", [
    ("image_pipeline", "preflight-image", "shard-images", "train-image-classifier", "weights"),
    ("text_pipeline", "preflight-text", "prepare-text-data", "train-text-classifier",
     "lm_assets"),
    ("transformer_pipeline", "preflight-transformer", "prepare-text-data",
     "train-transformer-classifier", "model"),
])
def test_steps_reading_files_by_uri_are_keyed_on_their_fingerprints(tmp_path, pipeline, check,
                                                                    reader, trainer, files):
    """A step's cache key holds only its inputs: new data or images under the same data_uri
    or predict_uri, or weights / language models rewritten in place, must reach the key as
    a fingerprint of the (never cached) preflight."""
    spec = _spec(tmp_path, pipeline)
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks[check]["cachingOptions"] == {}  # enableCache absent: off
    assert tasks[reader]["dependentTasks"] == [check]
    for task, name in ((reader, "data"), (trainer, files)):
        assert tasks[task]["inputs"]["parameters"][f"{name}_fingerprint"] == {
            "taskOutputParameter": {"outputParameterKey": f"{name}_fingerprint",
                                    "producerTask": check}}
    (condition,) = [c for name, c in spec["components"].items()
                    if name.startswith("comp-condition") and "predict" in c["dag"]["tasks"]]
    channel = condition["dag"]["tasks"]["predict"]["inputs"]["parameters"]["data_fingerprint"]
    assert channel == {"componentInputParameter":
                       f"pipelinechannel--{check}-predict_fingerprint"}


def test_placeholder_images_compile_outside_the_upload_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert compile_cli.main(["--pipelines", "lm_pipeline"]) == 0
    assert sorted(os.listdir(tmp_path / "build")) == ["local"]
    assert "not for upload" in capsys.readouterr().err


TENSORBOARD = "projects/p/locations/us-central1/tensorboards/123"
TENSORBOARD_FLAGS = ("--tensorboard", TENSORBOARD, "--base-output-directory", "gs://b/out",
                     "--service-account", "sa@p.iam.gserviceaccount.com")
# Custom jobs of each pipeline: the training ones upload to the TensorBoard, the rest do not.
TRAINING_JOBS = {"image_pipeline": "train-image-classifier",
                 "text_pipeline": "train-text-classifier",
                 "lm_pipeline": "train-language-model",
                 "transformer_pipeline": "train-transformer-classifier"}
OTHER_JOBS = {"image_pipeline": ("shard-images", "evaluate-image-classifier", "predict"),
              "text_pipeline": ("prepare-text-data", "evaluate-text-classifier", "predict"),
              "lm_pipeline": (),
              "transformer_pipeline": ("prepare-text-data", "evaluate-text-classifier",
                                       "predict")}
ONLY_TRAINING_JOBS = ("--pipelines", ",".join(TRAINING_JOBS))  # the files these tests read


def _tensorboards(spec: dict) -> dict[str, str]:
    """The TensorBoard each custom job of the pipeline carries, by component."""
    return {name[len("comp-"):]: params["tensorboard"]["defaultValue"]
            for name, component in spec["components"].items()
            if {"tensorboard", "worker_pool_specs"} <= set(
                params := component.get("inputDefinitions", {}).get("parameters", {}))}


def _custom_job_request(spec: dict, component: str) -> aiplatform_v1.CreateCustomJobRequest:
    """The request GCPC's launcher sends for `component`, from its compiled defaults."""
    from google_cloud_pipeline_components.container.v1.custom_job import remote_runner
    from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util

    params = spec["components"][f"comp-{component}"]["inputDefinitions"]["parameters"]
    executor = spec["components"][f"comp-{component}"]["executorLabel"]
    args = spec["deploymentSpec"]["executors"][executor]["container"]["args"]
    payload = args[args.index("--payload") + 1]

    def value(match: re.Match) -> str:
        # an optional input without a default (None) goes in as null
        default = params[match.group(1)].get("defaultValue")
        # strings sit between quotes in the payload; lists, dicts and bools do not
        return json.dumps(default)[1:-1] if isinstance(default, str) else json.dumps(default)

    payload = re.sub(r"\{\{\$\.inputs\.parameters\['(\w+)'\]\}\}", value, payload)
    # the backend writes whole numbers of the spec's Struct (100.0) as integers (100)
    job = json_util.recursive_remove_empty(json.loads(
        payload, strict=False, parse_float=lambda s: int(float(s)) if float(s).is_integer()
        else float(s)))
    sent = []

    class Client:  # stands in for Vertex's JobServiceClient
        def create_custom_job(self, parent, custom_job):
            sent.append(aiplatform_v1.CreateCustomJobRequest(parent=parent,
                                                             custom_job=custom_job))
            return sent[-1].custom_job

    remote_runner.create_custom_job_with_client(Client(), "projects/p/locations/us-central1",
                                                job)
    return sent[0]


def test_tensorboard_reaches_only_the_training_jobs(tmp_path):
    out = _compile(tmp_path, *TENSORBOARD_FLAGS, *ONLY_TRAINING_JOBS)
    for pipeline, train in TRAINING_JOBS.items():
        spec = json.loads((out / f"{pipeline}.json").read_text())
        tensorboards = _tensorboards(spec)
        assert tensorboards.pop(train) == TENSORBOARD
        # every other custom job (steps added later included) gets none
        assert set(tensorboards) >= set(OTHER_JOBS[pipeline])
        assert set(tensorboards.values()) <= {""}
        # the CustomJob Vertex gets: a TensorBoard, the account and the output folder
        job = _custom_job_request(spec, train).custom_job
        assert job.job_spec.tensorboard == TENSORBOARD
        assert job.job_spec.service_account == "sa@p.iam.gserviceaccount.com"
        # each job of each run in its own folder: TensorBoard logs of runs never mix
        assert job.job_spec.base_output_directory.output_uri_prefix == (
            "gs://b/out/{{$.pipeline_job_name}}/" + job.display_name)
        assert job.display_name.startswith("train-")
        assert aiplatform_v1.TensorboardServiceClient.parse_tensorboard_path(
            job.job_spec.tensorboard) == {"project": "p", "location": "us-central1",
                                          "tensorboard": "123"}
        for other in OTHER_JOBS[pipeline]:
            assert not _custom_job_request(spec, other).custom_job.job_spec.tensorboard


@pytest.mark.parametrize("drop, name, message", [
    ("--base-output-directory", TENSORBOARD, "--tensorboard needs --base-output-directory gs://"),
    ("--service-account", TENSORBOARD, "--tensorboard needs --service-account EMAIL"),
    (None, "tensorboards/123", "--tensorboard 'tensorboards/123' is not a TensorBoard resource"),
    (None, "projects/p/locations/us-central1/tensorboards/tb-1",
     "give projects/PROJECT/locations/REGION/tensorboards/NUMERIC_ID"),
    (None, "projects/p/locations/us-central1/tensorboards/123/experiments/x",
     "is not a TensorBoard resource"),
])
def test_tensorboard_needs_its_output_folder_account_and_a_resource_name(tmp_path, drop, name,
                                                                        message):
    flags = list(TENSORBOARD_FLAGS)
    flags[1] = name
    if drop:
        del flags[flags.index(drop):flags.index(drop) + 2]
    with pytest.raises(SystemExit, match=re.escape(message)):
        _compile_here(tmp_path, *flags)
    assert not (tmp_path / "build").exists()


NETWORK = "projects/123456/global/networks/ml"
KEY = "projects/p/locations/europe-west4/keyRings/r/cryptoKeys/k"


def _persistent_resource(tmp_path, network=NETWORK, key=KEY, gpus=("NVIDIA_TESLA_V100", 2)):
    """A persistent resource's JSON as gcloud describes it: one pool of warm GPU machines."""
    resource = aiplatform_v1.PersistentResource(
        name="projects/123456/locations/europe-west4/persistentResources/warm-gpus",
        network=network, encryption_spec=aiplatform_v1.EncryptionSpec(kms_key_name=key),
        resource_pools=[aiplatform_v1.ResourcePool(
            id="v100", replica_count=1, disk_spec=aiplatform_v1.DiskSpec(
                boot_disk_type="pd-ssd", boot_disk_size_gb=100),
            machine_spec=aiplatform_v1.MachineSpec(
                machine_type="n1-standard-8", accelerator_type=gpus[0],
                accelerator_count=gpus[1]))])
    path = tmp_path / "resource.json"
    path.write_text(aiplatform_v1.PersistentResource.to_json(resource))
    return str(path)


def test_named_steps_run_on_the_persistent_resource_and_the_rest_on_demand(tmp_path):
    out = _compile_here(tmp_path, "--persistent-resource", _persistent_resource(tmp_path),
                        "--persistent-resource-steps", "train_image", "--network", NETWORK,
                        "--encryption-key", KEY, "--pipelines", "image_pipeline,text_pipeline")
    image, text = (json.loads((out / f"{p}_pipeline.json").read_text()) for p in ("image", "text"))
    job = _custom_job_request(image, "train-image-classifier").custom_job
    assert job.job_spec.persistent_resource_id == "warm-gpus"
    assert job.job_spec.network == NETWORK and job.encryption_spec.kms_key_name == KEY
    # the other jobs keep GCPC's default: the run's own persistent resource, none unless set
    for spec, other in ((image, "shard-images"), (text, "train-text-classifier")):
        assert (_custom_job_request(spec, other).custom_job.job_spec.persistent_resource_id
                == "{{$.pipeline_persistent_resource_id}}")


@pytest.mark.parametrize("resource, flags, message", [
    ({"network": ""}, [], "--network 'projects/123456/global/networks/ml' differs from the "
                          "persistent resource's network '(none)'"),
    ({"key": KEY.replace("/k", "/other")}, [], "--encryption-key 'projects/p/locations/"
                                                "europe-west4/keyRings/r/cryptoKeys/k' differs"),
    # every GPU step by default: the text trainer's T4 fits no pool of V100s
    ({}, [], "--train-text-machine-type n1-standard-8 with 1 x NVIDIA_TESLA_T4 and 1 "
             "replica(s) fits no pool"),
    ({}, ["--persistent-resource-steps", "train_image,train"], "no step 'train'"),
    ({}, ["--persistent-resource-steps", "train_image", "--train-image-replica-count", "2"],
     "and 2 replica(s) fits no pool"),
])
def test_a_job_the_persistent_resource_would_reject_is_refused(tmp_path, resource, flags,
                                                                message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        _compile_here(tmp_path, "--persistent-resource", _persistent_resource(tmp_path, **resource),
                      "--network", NETWORK, "--encryption-key", KEY, *flags)
    assert not (tmp_path / "build").exists()


def test_every_pair_of_vertexs_machine_table_passes():
    pairs = [Machine(name, gpu, count) for name, (gpu, count) in GPU_MACHINES.items()]
    pairs += [Machine(f"n1-standard-{max(n for n in (4, 8, 16, 32, 64, 96) if n <= most)}",
                      gpu, count) for gpu, limits in N1_GPU_VCPUS.items()
              for count, most in limits.items()]
    pairs += list(DEFAULT_MACHINES.values()) + [Machine("n1-highmem-16", "NVIDIA_TESLA_V100", 2)]
    assert {m: machine_problems("train_image", m) for m in pairs} == {m: [] for m in pairs}


# A3 Ultra and A4 machines (their fixed GPUs) for the image and text trainers.
HYPERDISK_FLAGS = ("--train-image-machine-type", "a3-ultragpu-8g",
                   "--train-image-accelerator-type", "NVIDIA_H200_141GB",
                   "--train-image-accelerator-count", "8",
                   "--train-text-machine-type", "a4-highgpu-8g",
                   "--train-text-accelerator-type", "NVIDIA_B200",
                   "--train-text-accelerator-count", "8")


def test_every_machine_gets_a_boot_disk_type_vertex_takes():
    # DiskSpec.boot_disk_type's documented values (google.cloud.aiplatform_v1.DiskSpec)
    valid = {"pd-ssd", "pd-standard", "hyperdisk-balanced"}
    assert {boot_disk_type(m) for m in CPU_MACHINE_TYPES | set(GPU_MACHINES)} <= valid
    assert boot_disk_type("a3-ultragpu-8g") == boot_disk_type("a4-highgpu-8g") == (
        "hyperdisk-balanced")
    assert boot_disk_type("a3-highgpu-8g") == boot_disk_type("n1-standard-8") == "pd-ssd"


@pytest.mark.parametrize("pipeline, component, disk", [
    ("image_pipeline", "train-image-classifier", "hyperdisk-balanced"),
    ("image_pipeline", "shard-images", "pd-ssd"),
    ("image_tuning_pipeline", "tune-train-image-classifier", "hyperdisk-balanced"),
    ("image_tuning_pipeline", "train-image-classifier", "hyperdisk-balanced"),
    ("text_pipeline", "train-text-classifier", "hyperdisk-balanced"),
    ("text_pipeline", "evaluate-text-classifier", "pd-ssd"),
    ("text_tuning_pipeline", "tune-train-text-classifier", "hyperdisk-balanced"),
])
def test_boot_disk_type_follows_the_machine_family(tmp_path, pipeline, component, disk):
    """A3 Ultra and A4 boot from Hyperdisk only: their jobs and tuning trials ask for it."""
    spec = _spec(tmp_path, pipeline, *HYPERDISK_FLAGS)
    for pool in _pools(spec, component):
        parsed = aiplatform_v1.WorkerPoolSpec.from_json(json.dumps(pool))
        assert parsed.disk_spec.boot_disk_type == disk
    if not component.startswith("tune-"):
        # the CustomJob GCPC's launcher sends carries it too
        job = _custom_job_request(spec, component).custom_job
        assert {p.disk_spec.boot_disk_type for p in job.job_spec.worker_pool_specs} == {disk}


def _gpus(out, pipeline: str) -> dict[str, int]:
    return gpus_at_once(json.loads((out / f"{pipeline}.json").read_text()))


def test_compile_prints_the_gpus_each_pipeline_holds_at_once(tmp_path, capsys):
    out = _compile_here(tmp_path)
    # trials at once x GPUs of a trial: 3 x 2; training after the tuning job adds none
    assert _gpus(out, "image_tuning_pipeline") == {"NVIDIA_TESLA_V100": 6}
    assert _gpus(out, "image_pipeline") == {"NVIDIA_TESLA_V100": 2}
    assert _gpus(out, "text_tuning_pipeline") == {"NVIDIA_TESLA_T4": 3}
    assert _gpus(out, "lm_pipeline") == {"NVIDIA_TESLA_T4": 1}
    err = capsys.readouterr().err
    assert "quota: image_tuning_pipeline holds 6 x NVIDIA_TESLA_V100 at once" in err
    assert "quota: text_pipeline holds 1 x NVIDIA_TESLA_T4 at once" in err


def test_only_the_pipelines_asked_for_are_written(tmp_path, capsys):
    out = _compile_here(tmp_path, "--pipelines", "text_tuning_pipeline, lm_pipeline")
    assert sorted(os.listdir(out)) == ["lm_pipeline.json", "text_tuning_pipeline.json"]
    err = capsys.readouterr().err
    # the cost of the tuning variants written, and only theirs
    assert "the text tuning pipeline runs up to" in err and "image tuning" not in err
    with pytest.raises(SystemExit, match=r"\['text'\] is not among image_pipeline, "):
        _compile_here(tmp_path, "--pipelines", "text")


def test_gpus_of_steps_that_run_side_by_side_add_up(tmp_path):
    flags = ["--tune-parallel-trials", "4"]
    for step in ("train-image", "evaluate-image", "predict-image"):
        flags += [f"--{step}-accelerator-type", "NVIDIA_TESLA_T4",
                  f"--{step}-accelerator-count", "1"]
    out = _compile(tmp_path, *flags, "--pipelines", "image_pipeline,image_tuning_pipeline")
    # evaluation and prediction both follow training, not each other: 1 + 1 at once
    assert _gpus(out, "image_pipeline") == {"NVIDIA_TESLA_T4": 2}
    # four trials of one replica each, then training, evaluation and prediction
    assert _gpus(out, "image_tuning_pipeline") == {"NVIDIA_TESLA_T4": 4}


def test_the_preflight_and_the_jobs_get_a_tensorboard_only_when_asked(tmp_path):
    for flags, expected in (((*TENSORBOARD_FLAGS, *ONLY_TRAINING_JOBS), TENSORBOARD),
                            ((), None)):
        out = _compile(tmp_path, *flags)
        for pipeline in TRAINING_JOBS:
            spec = json.loads((out / f"{pipeline}.json").read_text())
            (preflight,) = [t for name, t in spec["root"]["dag"]["tasks"].items()
                            if name.startswith("preflight")]
            value = preflight["inputs"]["parameters"].get("tensorboard")
            assert (value and value["runtimeValue"]["constant"]) == expected, pipeline
            if expected is None:  # no custom job uploads unless asked
                tensorboards = _tensorboards(spec)
                assert tensorboards and set(tensorboards.values()) == {""}


def test_a_definition_runs_on_a_thread_of_its_own_and_its_errors_reach_the_caller():
    """`Steps.pipeline` runs the body on a fresh thread (kfp's task settings then read a short
    stack): the pipeline is the same, and a mistake in the body is raised to the caller as
    it is, kfp's message still naming the setting misused."""
    steps = Steps("lm", "r/fastai:1")
    threads = []

    @steps.pipeline("fine", "", "", "", first=[parameter("corpus_uri", str, "gs://b/c")])
    def fine(params):
        threads.append(threading.current_thread())
        steps.run("train", params)

    assert threads and threads[0] is not threading.main_thread()
    assert "train-language-model" in fine.pipeline_spec.root.dag.tasks
    with pytest.raises(ValueError, match="^set_env_variable can only be used on single-step"):
        @steps.pipeline("misused", "", "", "")
        def misused(params):
            dsl.importer(artifact_uri="gs://b/x", artifact_class=dsl.Artifact,
                         reimport=False).set_env_variable("A", "1")


def test_a_targets_words_drop_its_parameters():
    """`steps.spoken`: a parameter the target drops is none of the pipeline's (the body
    takes its default); without words it keeps every parameter. (Their help is
    `Steps._describe`'s: the Kubeflow files' descriptions are checked below.)"""
    @dsl.component
    def step(text: str) -> str:
        return text

    seen = {}

    def body(data_uri: str, account: str = "sa@p.iam.gserviceaccount.com",
             register: bool = True):
        seen.update(locals())
        step(text=data_uri)

    signature = inspect.signature(body)
    words = Words("", help={"register": "Register the model in MLflow."}, dropped=("account",))
    said = spoken(lambda params: body(**params), signature, words)
    inputs = dsl.pipeline(name="p")(said).pipeline_spec.root.input_definitions
    assert set(inputs.parameters) == {"data_uri", "register"}
    assert seen["account"] == "sa@p.iam.gserviceaccount.com"
    said = spoken(lambda params: body(**params), signature, None)
    assert set(inspect.signature(said).parameters) == {"data_uri", "account", "register"}


# A fresh interpreter that refuses GCPC and the Vertex SDK at import, then runs compile.py's
# main with its arguments; it fails if anything of theirs was imported all the same.
WITHOUT_VERTEX = """
import sys

VERTEX = ("google_cloud_pipeline_components", "google.cloud.aiplatform")


class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.startswith(VERTEX):
            raise ImportError(f"{name} refused: the Kubeflow target needs nothing of Vertex")


sys.meta_path.insert(0, Refuse())
import compile

code = compile.main(sys.argv[1:])
assert not [name for name in sys.modules if name.startswith(VERTEX)]
sys.exit(code)
"""


def test_a_kubeflow_compile_needs_neither_gcpc_nor_the_vertex_sdk(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def compile_without_vertex(out, *flags):
        return subprocess.run([sys.executable, "-c", WITHOUT_VERTEX, "--output-dir", str(out),
                               "--registry", REGISTRY, "--tag", "0a1b2c3", *flags], cwd=root,
                              capture_output=True, text=True, timeout=300)

    done = compile_without_vertex(tmp_path / "kubeflow", "--target", "kubeflow")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "kubeflow")) == sorted(
        f"{name}.yaml" for name in compile_cli.PIPELINES)
    # the refusal bites: a Vertex compile cannot go without them
    vertex = compile_without_vertex(tmp_path / "vertex", "--pipelines", "lm_pipeline")
    assert vertex.returncode != 0 and "refused: the Kubeflow target" in vertex.stderr


def test_each_target_offers_the_parameters_that_mean_something_there(tmp_path):
    """The same parameters and defaults on both targets but `job_service_account` (Vertex's
    custom jobs' account; a Kubeflow run's Kubernetes account is chosen when it is
    created), the registration's own words (Vertex's Model Registry or MLflow's), the
    stores the steps read (s3:// too on Kubeflow) and tracking to a server there."""
    vertex, kubeflow = _compile(tmp_path), _compile(tmp_path, "--target", "kubeflow")
    for name in compile_cli.PIPELINES:
        spec = json.loads((vertex / f"{name}.json").read_text())
        ours = spec["root"]["inputDefinitions"]["parameters"]
        kf_spec, _ = yaml.safe_load_all((kubeflow / f"{name}.yaml").read_text())
        theirs = kf_spec["root"]["inputDefinitions"]["parameters"]
        assert set(ours) - set(theirs) == {"job_service_account"} and set(theirs) <= set(ours)
        assert {n: p.get("defaultValue") for n, p in theirs.items()} == {
            n: ours[n].get("defaultValue") for n in theirs}
        reworded = {n for n, p in theirs.items() if p["description"] != ours[n]["description"]}
        stores = {n for n, p in ours.items() if "gs://" in p["description"]} - {"tracking_uri"}
        assert reworded == ({"register_model", "model_display_name", "tracking_uri"}
                            & set(ours)) | stores, name
        for n in stores:  # the steps read s3:// as they read gs://
            assert theirs[n]["description"] == ours[n]["description"].replace(
                "gs://", "s3:// or gs://")
        assert "gs://" not in theirs["tracking_uri"]["description"]  # /gcs is scratch there
        if "register_model" in ours:
            assert "Vertex Model Registry" in ours["register_model"]["description"]
            assert "MLflow Model Registry" in theirs["register_model"]["description"]
        tuned = compile_cli.PIPELINES[name][2]
        assert ("Vertex tuning job" in spec["pipelineInfo"]["description"]) == tuned, name
