"""The compiled Vertex JSON, executed here by `rehearsal` as Vertex would run it.

Only the Vertex service is stood in for: the DAG, conditions, placeholders, CustomJob
payloads (parsed into Vertex's own message), replicas, restarts and the /gcs/ mount are
the rehearsal's; the steps are the real ones.
"""

import glob
import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import pytest

import compile as compile_cli
import tools.rehearsal as rehearse
from tests.conftest import (
    free_port,
    http_json,
    served_as_on_vertex,
    write_class_images,
    write_densenet_weights,
)
from tools.datamakers.demo_text import write_reviews_csv

SERVING = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15@sha256:" + "c" * 64


def _compile(tmp_path, pipeline: str, *extra) -> str:
    """The folder holding `pipeline`.json, compiled alone."""
    out = tmp_path / "build"
    assert compile_cli.main(["--output-dir", str(out), "--registry",
                             "europe-west4-docker.pkg.dev/acme/pipes", "--tag", "abc123",
                             "--pipelines", pipeline, *extra]) == 0
    return str(out)


def _spec(tmp_path, pipeline: str) -> dict:
    """`pipeline`'s compiled JSON, read."""
    with open(os.path.join(_compile(tmp_path, pipeline), f"{pipeline}.json")) as f:
        return json.load(f)


GATE = "inputs.parameter_values['pipelinechannel--gate-Output'] == true"


@pytest.mark.parametrize("condition, values, expected", [
    (GATE, {"pipelinechannel--gate-Output": True}, True),
    (GATE, {"pipelinechannel--gate-Output": False}, False),
    ("int(inputs.parameter_values['n']) > 5 && !(inputs.parameter_values['s'] == 'x')",
     {"n": 7.0, "s": "y"}, True),
    ("inputs.parameter_values['s'] != 'x' || inputs.parameter_values['n'] <= 1",
     {"n": 3, "s": "x"}, False),
])
def test_conditions_evaluate_like_kfp(condition, values, expected):
    assert rehearse.evaluate_condition(condition, values) is expected


def test_conditions_refuse_anything_else():
    with pytest.raises(rehearse.RehearsalError, match="cannot evaluate"):
        rehearse.evaluate_condition("__import__('os').getcwd() == 'x'", {})
    with pytest.raises(rehearse.RehearsalError, match="unknown input"):
        rehearse.evaluate_condition("inputs.parameter_values['missing'] == true", {})


def test_values_render_as_the_backend_writes_them():
    # Protobuf numbers are doubles: whole ones are written without a fraction, which is
    # what lets `boot_disk_size_gb: 100.0` in the spec parse as Vertex's int64.
    assert rehearse.render([{"disk": 100.0, "rate": 0.5, "name": "n1"}]) == \
        '[{"disk": 100, "rate": 0.5, "name": "n1"}]'
    assert rehearse.render("text {x}") == "text {x}"
    assert rehearse.render(True) == "true"


def test_cluster_environment_of_each_replica():
    job = {"display_name": "train"}
    ports = [[2001], [2002, 2003]]
    env = rehearse.cluster_env([1, 2], 1, 1, job, ports)
    cluster_spec, tf_config = json.loads(env["CLUSTER_SPEC"]), json.loads(env["TF_CONFIG"])
    assert cluster_spec["cluster"] == {"workerpool0": ["127.0.0.1:2001"],
                                       "workerpool1": ["127.0.0.1:2002", "127.0.0.1:2003"]}
    assert cluster_spec["task"] == {"type": "workerpool1", "index": 1}
    assert tf_config["cluster"] == {"chief": ["127.0.0.1:2001"],
                                    "worker": ["127.0.0.1:2002", "127.0.0.1:2003"]}
    assert tf_config["task"] == {"type": "worker", "index": 1}
    assert rehearse.cluster_env([1], 0, 0, job, [[2001]]) == {}
    assert rehearse.aip_env("gs://b/out/") == {
        "AIP_MODEL_DIR": "gs://b/out/model/", "AIP_CHECKPOINT_DIR": "gs://b/out/checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": "gs://b/out/logs/"}
    assert rehearse.aip_env("") == {}


def test_parameters_are_typed_and_checked(tmp_path):
    spec = _spec(tmp_path, "image_pipeline")
    runner = rehearse.Rehearsal(spec, str(tmp_path / "r"), {"data_uri": "/d", "epochs": "3",
                                                            "flip": "false"})
    assert runner.inputs["epochs"] == 3 and runner.inputs["flip"] is False
    assert runner.inputs["image_size"] == 224  # the JSON default, an int again
    with pytest.raises(rehearse.RehearsalError, match="missing required.*--param data_uri"):
        rehearse.Rehearsal(spec, str(tmp_path / "r"), {})
    with pytest.raises(rehearse.RehearsalError, match="unknown parameter 'epoch'"):
        rehearse.Rehearsal(spec, str(tmp_path / "r"), {"data_uri": "/d", "epoch": "3"})


def test_in_an_image_steps_see_gcs_uris_under_the_mount_and_no_local_paths(tmp_path):
    spec = _spec(tmp_path, "image_pipeline")
    runner = rehearse.Rehearsal(spec, str(tmp_path / "r"), {"data_uri": "gs://b/data"},
                                runtime="image")
    image = runner.runtime
    assert image.step_path("gs://b/root/x/metrics") == "/gcs/b/root/x/metrics"
    assert image.host_path("/gcs/b/root/x/metrics") == str(tmp_path / "r" / "gcs" / "b" /
                                                           "root" / "x" / "metrics")
    assert image.host_path("/home/runner/x") == "/home/runner/x"
    local = rehearse.Rehearsal(spec, str(tmp_path / "l"), {"data_uri": "gs://b/data"}).runtime
    assert local.step_path("gs://b/x") == local.host_path(local.step_path("gs://b/x")) == \
        str(tmp_path / "l" / "gcs" / "b" / "x")
    (tmp_path / "photos").mkdir()
    with pytest.raises(rehearse.RehearsalError, match="local path, which a step inside the "
                                                      "image cannot see"):
        rehearse.Rehearsal(spec, str(tmp_path / "r"), {"data_uri": str(tmp_path / "photos")},
                           runtime="image")
    with pytest.raises(rehearse.RehearsalError, match="--runtime must be one of"):
        rehearse.Rehearsal(spec, str(tmp_path / "r"), {"data_uri": "gs://b/d"}, runtime="vm")


def test_step_commands_run_in_the_image_with_the_mount_and_the_job_environment():
    containers = rehearse.ImageContainers()
    containers.names["reg/tensorflow:1"] = "rehearse-abc"  # as `container()` records it
    containers.env = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}
    command = containers.run_command("reg/tensorflow:1", ["python3", "-m", "x"], {"/r/gcs": "/gcs"},
                                     {"TF_CONFIG": '{"task": {"type": "chief"}}'})
    assert command[:3] == ["buildah", "--storage-driver", "vfs"]
    assert command[3:6] == ["run", "--isolation", "chroot"]
    assert "--user" not in command  # the image's USER, as on Vertex
    assert "--volume=/r/gcs:/gcs" in command
    assert '--env=TF_CONFIG={"task": {"type": "chief"}}' in command
    assert "--env=STORAGE_EMULATOR_HOST=http://127.0.0.1:9" in command
    assert command[-5:] == ["rehearse-abc", "--", "python3", "-m", "x"]


def test_a_missing_buildah_or_image_is_a_clear_error(monkeypatch):
    containers = rehearse.ImageContainers()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(rehearse.RehearsalError, match="buildah, which is not installed"):
        containers.container("reg/tensorflow:1")
    monkeypatch.undo()
    if shutil.which("buildah"):
        with pytest.raises(rehearse.RehearsalError, match="build it with `make images-local`"):
            containers.container("localhost/never-built-image:0")
    assert containers.names == {}


def test_the_api_stand_in_serves_what_the_gcs_folder_holds(tmp_path, gcs_emulator, monkeypatch):
    from components.common.storage import filesystem
    from tools.rehearsal import gcs_api

    (tmp_path / "b" / "data" / "cat").mkdir(parents=True)
    (tmp_path / "b" / "data" / "cat" / "1.jpg").write_bytes(b"jpeg")
    (tmp_path / "b" / "top.csv").write_text("text\n")
    (tmp_path / "stray-file").write_text("not in a bucket")
    assert gcs_api.seed(gcs_emulator, tmp_path) == 2
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    fs, path = filesystem("gs://b/data")
    assert fs.find(path) == ["b/data/cat/1.jpg"]
    assert fs.cat_file("b/data/cat/1.jpg") == b"jpeg"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_the_gcs_stand_in_is_writable_by_the_images_user_whoever_wrote_it():
    """Files root staged (the data, earlier outputs) must not lock out uid 1000, as a FUSE
    mount's one mode for every object would not."""
    with tempfile.TemporaryDirectory() as folder:  # pytest's own tmp is root-only (0700)
        gcs = pathlib.Path(folder) / "gcs"
        (gcs / "b" / "data").mkdir(parents=True)
        (gcs / "b" / "data" / "x.txt").write_text("root's")
        os.chmod(gcs / "b" / "data", 0o755)
        os.chmod(gcs / "b" / "data" / "x.txt", 0o644)
        os.chmod(folder, 0o755)
        write_as_1000 = ["sh", "-c", f"mkdir -p {gcs}/b/data/out && echo y > {gcs}/b/data/out/y"
                         f" && echo z >> {gcs}/b/data/x.txt"]
        assert subprocess.run(write_as_1000, user=1000, group=1000).returncode != 0
        rehearse.open_mount(str(gcs))
        assert subprocess.run(write_as_1000, user=1000, group=1000).returncode == 0
        assert (gcs / "b" / "data" / "out" / "y").stat().st_uid == 1000


def _two_replica_job(chief: str, worker: str, restart_all: bool) -> str:
    """A CustomJob payload of a chief and one worker, each a Python one-liner."""
    import sys

    def pool(code: str) -> dict:
        return {"replica_count": 1, "machine_spec": {"machine_type": "n1-standard-4"},
                "container_spec": {"image_uri": "europe-docker.pkg.dev/acme/x:1",
                                   "command": [sys.executable, "-c", code]}}

    return json.dumps({"display_name": "two", "job_spec": {
        "worker_pool_specs": [pool(chief), pool(worker)],
        "scheduling": {"restart_job_on_worker_restart": restart_all}}})


def test_a_step_process_gets_its_jobs_variables_not_the_rehearsals(tmp_path, monkeypatch):
    """One environment for every step's process (Vertex replica, pod, TrainJob node): the
    rehearsal's credentials, cluster variables and PYTHONPATH stay here; the job's
    variables go, under what stands in for the image (PATH, PYTHONPATH, mounts, TMPDIR)."""
    import sys

    from tools.rehearsal.runtimes import MOUNTS_ENV, ROOT, SITE_DIR, step_env

    for name, value in (("AWS_SECRET_ACCESS_KEY", "the-rehearsals"), ("CLUSTER_SPEC", "{}"),
                        ("RANK", "3"), ("PYTHONPATH", "/elsewhere")):
        monkeypatch.setenv(name, value)
    gcs, tmp = str(tmp_path / "gcs"), str(tmp_path / "tmp")
    env = step_env({"AWS_SECRET_ACCESS_KEY": "the-jobs", "TF_CONFIG": "{}", "PATH": "/x"},
                   {gcs: "/gcs", tmp: "/tmp"}, python_path=["/hooks"])
    assert env["AWS_SECRET_ACCESS_KEY"] == "the-jobs" and env["TF_CONFIG"] == "{}"
    assert "CLUSTER_SPEC" not in env and "RANK" not in env
    assert env["PYTHONPATH"] == os.pathsep.join(["/hooks", SITE_DIR, ROOT])
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env["TMPDIR"] == tmp and json.loads(env[MOUNTS_ENV]) == {"/gcs": gcs}


@pytest.mark.parametrize("preempted", [False, True])
def test_a_failed_replica_fails_the_job_and_stops_the_others(tmp_path, preempted):
    """As on Vertex: one replica's error ends the job; a peer left waiting on it (here for
    ever, as a worker waits on a lost chief's all-reduce) is stopped, not waited on. The
    error quotes the failed replica's own log, also when only the chief was restarted."""
    import time

    from tools.rehearsal.jobs import Preemption, VertexService
    from tools.rehearsal.records import TaskRecord
    from tools.rehearsal.runtimes import Runtime

    output = str(tmp_path / "r")
    mark = os.path.join(output, "gcs", "mark")
    os.makedirs(os.path.dirname(mark))  # the rehearsal's session makes it
    chief = f"import time; open({mark!r}, 'w').close(); time.sleep(600)"
    # the worker fails once the chief has been preempted (or at once)
    worker = (f"import os, sys, time\nwhile {preempted} and not os.path.exists({mark!r}): "
              "time.sleep(0.1)\ntime.sleep(2 if {preempted} else 0); print('bad data'); "
              "sys.exit(3)").replace("{preempted}", str(preempted))
    preempt = [Preemption("train", "mark")] if preempted else []
    jobs = VertexService(Runtime("local", output), output, "job-1", preempt)
    record = TaskRecord(name="train", display_name="train")
    started = time.monotonic()
    with pytest.raises(rehearse.RehearsalError, match=r"(?s)train: workerpool1 replica 0 "
                       r"exited with 3; log .*workerpool1-0\.attempt1\.log:.*bad data"):
        jobs.custom_job(record, ["--payload", _two_replica_job(chief, worker, False)])
    assert time.monotonic() - started < 60 and record.state == "failed"
    assert record.attempts == (2 if preempted else 1)


@pytest.mark.slow  # a kfp.local or rehearsal run: steps as processes
def test_jobs_run_as_the_account_chosen_at_run_time_and_a_payload_vertex_rejects_fails(
        tmp_path, monkeypatch):
    """GCPC takes the jobs' service account as a job parameter: the pipeline exposes it. Each
    CustomJob payload is parsed into Vertex's own message, as the launcher sends it: the
    training job's, with a GPU Vertex does not know, fails the rehearsal before it starts."""
    build = _compile(tmp_path, "text_pipeline", "--service-account",
                     "compiled@acme.iam.gserviceaccount.com")
    path = os.path.join(build, "text_pipeline.json")
    spec = json.loads(open(path).read())
    defaults = spec["root"]["inputDefinitions"]["parameters"]["job_service_account"]
    assert defaults["defaultValue"] == "compiled@acme.iam.gserviceaccount.com"
    params = spec["components"]["comp-train-text-classifier"]["inputDefinitions"]["parameters"]
    params["worker_pool_specs"]["defaultValue"][0]["machine_spec"]["accelerator_type"] = \
        "NVIDIA_FOO"
    with open(path, "w") as f:
        json.dump(spec, f)
    write_reviews_csv(str(tmp_path / "reviews.csv"), rows=40, seed=3)
    monkeypatch.chdir(tmp_path)  # a relative data path means the caller's folder, as locally
    account = "trainer@acme.iam.gserviceaccount.com"
    with pytest.raises(rehearse.RehearsalError, match="train-text-classifier: Vertex would "
                                                      "reject the CustomJob.*NVIDIA_FOO"):
        rehearse.rehearse(path, str(tmp_path / "r"),
                          {"data_uri": "reviews.csv", "job_service_account": account})
    report = json.loads((tmp_path / "r" / "rehearsal.json").read_text())
    assert [(t["name"], t["state"]) for t in report][-2:] == [
        ("prepare-text-data", "succeeded"), ("train-text-classifier", "pending")]
    sent = json.loads((tmp_path / "r" / "vertex-requests" / "prepare-text-data.json").read_text())
    assert sent["type"] == "CustomJob"
    assert sent["request"]["job_spec"]["service_account"] == account
    with pytest.raises(rehearse.RehearsalError, match="not a service account e-mail"):
        rehearse.rehearse(path, str(tmp_path / "r2"),
                          {"data_uri": "reviews.csv", "job_service_account": "trainer"})


@pytest.mark.slow  # a kfp.local or rehearsal run: steps as processes
def test_bad_settings_stop_the_run_before_the_first_job(tmp_path):
    path = os.path.join(_compile(tmp_path, "text_pipeline"), "text_pipeline.json")
    csv = tmp_path / "reviews.csv"
    write_reviews_csv(str(csv), rows=40, seed=3)
    with pytest.raises(rehearse.RehearsalError, match="threshold must be > 0 and < 1, got 1.5"):
        rehearse.rehearse(path, str(tmp_path / "r"), {"data_uri": str(csv), "threshold": "1.5"})
    report = json.loads((tmp_path / "r" / "rehearsal.json").read_text())
    assert [t["name"] for t in report] == ["preflight-text"]  # no custom job started


REGISTERED = "projects/123456789012/locations/us-central1/models/8541"


@pytest.mark.slow
def test_image_pipeline_rehearsed_with_two_replicas_and_a_preempted_job(tmp_path):
    """Two replicas train (MultiWorkerMirroredStrategy over CLUSTER_SPEC/TF_CONFIG); once
    the first epoch is checkpointed the job is preempted (SIGTERM, then the kill after the
    grace period) and restarted, as Vertex restarts a preempted multi-worker job: both
    replicas stop at the same step early in epoch 1, and the restart resumes there. The base
    is a one-block-per-stage DenseNet from a weights file (conftest): the head phase trains."""
    build = _compile(tmp_path, "image_pipeline", "--train-image-replica-count", "2",
                     "--base-output-directory", "gs://acme-jobs/out", "--serving-image", SERVING)
    data = tmp_path / "images"
    write_class_images(str(data), per_class=8, size=(24, 24))
    out = tmp_path / "rehearsal"
    summary = rehearse.rehearse(
        os.path.join(build, "image_pipeline.json"), str(out),
        {"data_uri": str(data), "image_size": "32", "min_shards_per_split": "2",
         "shard_workers": "1", "weights": write_densenet_weights(tmp_path / "notop.h5", 32),
         "epochs": "2", "fine_tune_epochs": "0", "batch_size": "4", "steps_per_epoch": "30",
         "registration_threshold": "0", "eval_batch_size": "8"},
        preempt=[rehearse.Preemption("train-densenet121", "**/backup-head/chief/checkpoint")],
        registry={"densenet121-image-classifier": REGISTERED})

    tasks = {t["name"]: t for t in summary["rehearsal"]["tasks"]}
    assert tasks["preflight-image"]["cache"] == "disabled"
    train = tasks["train-image-classifier"]
    assert (train["state"], train["replicas"], train["attempts"]) == ("succeeded", 2, 2)
    # Both replicas sealed the same step of epoch 1 and exited 143; the restart ran the rest.
    logs = out / "logs" / "train-image-classifier"
    first, second = ((logs / f"workerpool0-0.attempt{n}.log").read_text() for n in (1, 2))
    sealed = re.search(r"sealed in \S+ at epoch 1 step (\d+)", first)
    assert "head epoch 0:" in first and sealed and "head epoch 1:" not in first, first[-2000:]
    assert sealed.group(0) in (logs / "workerpool1-0.attempt1.log").read_text()
    assert f"resumed mid-epoch: epoch 1 from step {int(sealed.group(1)) + 1}" in second
    assert "head epoch 0:" not in second and "head epoch 1:" in second
    history = json.loads(open(os.path.join(summary["artifacts"]["model"], "history.json")).read())
    assert [r["epoch"] for r in history["head"]] == [0, 1]
    # The checkpoint folder was this task's own under AIP_CHECKPOINT_DIR (in the job's own
    # folder of the base output directory, <base>/<run>/<job>), removed when done.
    (checkpoints,) = (out / "gcs" / "acme-jobs" / "out").glob("*/train-densenet121/checkpoints")
    assert checkpoints.is_dir() and not glob.glob(str(checkpoints / "**" / "run.json"),
                                                  recursive=True)
    # Gate passed (threshold 0): the registry holds the display name, so the upload is a
    # new version of that model; the request was built from the artifact, not sent.
    by_display = {t["display_name"]: t for t in summary["rehearsal"]["tasks"]}
    assert by_display["find-registered-model"]["state"] == "not-executed"
    assert by_display["register-model-version"]["state"] == "not-executed"
    assert by_display["new-model"]["state"] == "skipped"  # the Else branch: no new model
    requests = {json.loads(p.read_text())["type"]: json.loads(p.read_text())["request"]
                for p in (out / "vertex-requests").glob("condition-1-*.json")}
    assert requests["ListModels"] == {
        "parent": f"projects/{rehearse.PROJECT}/locations/{rehearse.LOCATION}",
        "filter": 'display_name="densenet121-image-classifier"'}
    upload = requests["UploadModel"]
    assert upload["parent_model"] == REGISTERED
    assert upload["container_spec"]["image_uri"] == SERVING
    assert upload["artifact_uri"].startswith("gs://rehearsal-bucket/pipeline-root/")
    assert upload["labels"]["pipeline_run"] == summary["rehearsal"]["job_name"]
    assert len(upload["labels"]["data_sha256"]) == 16
    assert summary["registration"]["would_register"] is True
    assert summary["sharding"]["examples_in"] == 24
    # The summary reports what the evaluation step wrote, over the whole test split.
    evaluation = json.loads(open(os.path.join(summary["artifacts"]["evaluation"],
                                              "metrics.json")).read())
    assert summary["metrics"]["accuracy"] == evaluation["accuracy"]
    assert sum(v["support"] for v in summary["metrics"]["per_label"].values()) == \
        summary["sharding"]["written"]["test"]


@pytest.mark.slow
def test_text_pipeline_rehearsed_with_only_the_data_and_cached_until_the_data_changes(tmp_path):
    """docs/operators.md step 4 sets only data_uri; a re-run reuses cached steps while the
    CSV is the same, and re-reads it once it changed (the preflight fingerprint is in the
    cache key). The model clears the gate (threshold 0), no model has the display name yet, so the
    upload creates one; the uploaded folder serves with the upload's own container spec."""
    path = os.path.join(_compile(tmp_path, "text_pipeline"), "text_pipeline.json")
    csv = tmp_path / "reviews.csv"
    write_reviews_csv(str(csv), rows=80, seed=3)
    small = {"epochs": "1", "lm_epochs": "0", "min_freq": "1", "registration_threshold": "0",
             "pretrained": "false", "model_config": '{"emb_sz": 16, "n_hid": 24, "n_layers": 1}'}
    index = str(tmp_path / "cache.json")

    # With only data_uri set, the defaults must at least be valid and run through.
    defaults_only = rehearse.Rehearsal(json.loads(open(path).read()), str(tmp_path / "d"),
                                       {"data_uri": str(csv)})
    # English, from fastai's WikiText-103 model (test_wt103 runs that start offline)
    assert (defaults_only.inputs["lang"], defaults_only.inputs["pretrained"]) == ("en", True)

    first = rehearse.rehearse(path, str(tmp_path / "r1"), {"data_uri": str(csv), **small},
                              cache_index=index)
    states = {t["display_name"]: (t["state"], t["cache"]) for t in first["rehearsal"]["tasks"]}
    assert states == {
        "preflight": ("succeeded", "disabled"),
        "prepare-text": ("succeeded", "miss"),
        "train-text": ("succeeded", "miss"),
        "evaluate-text": ("succeeded", "miss"),
        "registration-gate": ("succeeded", "miss"),
        "model-clears-threshold": ("succeeded", "disabled"),
        "serving-model": ("succeeded", "miss"),
        "find-registered-model": ("not-executed", "disabled"),  # a Vertex call: stood in for
        "condition-branches-2": ("succeeded", "disabled"),
        "model-exists": ("skipped", "disabled"),
        "new-model": ("succeeded", "disabled"),
        "register-model": ("not-executed", "miss"),
        "prediction-requested": ("skipped", "disabled"),  # no predict_uri: no predict step
        "tracking-requested": ("skipped", "disabled")}  # no tracking_uri: nothing logged
    evaluation = json.loads(open(os.path.join(first["artifacts"]["evaluation"],
                                              "metrics.json")).read())
    assert first["metrics"]["micro_f1"] == evaluation["micro_f1"]
    assert first["registration"]["would_register"] is True

    (request,) = [json.loads(p.read_text())["request"]
                  for p in (tmp_path / "r1" / "vertex-requests").glob("*.json")
                  if json.loads(p.read_text())["type"] == "UploadModel"]
    assert "parent_model" not in request and request["display_name"] == "ulmfit-text-classifier"
    container = request["container_spec"]
    assert container["image_uri"] == "europe-west4-docker.pkg.dev/acme/pipes/fastai:abc123"
    assert "command" not in container  # the image's default command serves
    # What Vertex would do with that request: copy artifact_uri, start the image's server
    # with AIP_* set from the container spec; a prediction follows the route it was given.
    uploaded = request["artifact_uri"].replace("gs://", str(tmp_path / "r1" / "gcs") + "/")
    aip = {"AIP_HTTP_PORT": str(free_port()), "AIP_STORAGE_URI": uploaded,
           "AIP_HEALTH_ROUTE": container["health_route"],
           "AIP_PREDICT_ROUTE": container["predict_route"]}
    assert container["ports"] == [{"container_port": 8080}]  # Vertex's port, set as the port
    # the server answers 503 while the model loads: Vertex is told to wait for it
    startup = container["startup_probe"]
    assert startup["http_get"] == {"path": container["health_route"], "port": 8080}
    assert startup["period_seconds"] * startup["failure_threshold"] >= 600
    with served_as_on_vertex(aip, str(tmp_path / "serve.log")) as address:
        status, answer = http_json(address, "POST", container["predict_route"],
                                   json.dumps({"instances": ["livraison rapide"]}).encode())
    assert status == 200 and set(answer["predictions"][0]) == {"labels", "scores"}
    assert set(answer["predictions"][0]["scores"]) == set(evaluation["per_label"])

    again = rehearse.rehearse(path, str(tmp_path / "r2"), {"data_uri": str(csv), **small},
                              cache_index=index)
    cached = {t["display_name"]: t["state"] for t in again["rehearsal"]["tasks"]}
    assert {name: cached[name] for name in ("preflight", "prepare-text", "train-text",
                                            "evaluate-text", "registration-gate")} == {
        "preflight": "succeeded", "prepare-text": "cached", "train-text": "cached",
        "evaluate-text": "cached", "registration-gate": "cached"}
    # serving-model runs again (its run name changed) and reads the cached model, which
    # on Vertex lies in the one bucket every run shares
    assert cached["serving-model"] == "succeeded"
    assert again["metrics"] == first["metrics"]

    write_reviews_csv(str(csv), rows=90, seed=4)  # the bucket changed
    changed = rehearse.rehearse(path, str(tmp_path / "r3"), {"data_uri": str(csv), **small},
                                cache_index=index)
    assert {t["display_name"]: (t["state"], t["cache"])
            for t in changed["rehearsal"]["tasks"]} == states
    assert changed["preparation"]["rows_in"] == 90
