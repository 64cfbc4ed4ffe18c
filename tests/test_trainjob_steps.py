"""The transformer step past one pod on Kubeflow, wired (issue 57): the node entry point,
the launcher step against the Kubernetes API stub, and the compiled launcher (no training:
`launch.train` is replaced by one that writes a model folder as rank 0 does)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os

import pytest
import yaml

import compile as compile_cli
from components.train_transformer import component, launch, multinode, node
from components.train_transformer.contract import TransformerConfig, TransformerTrainingError
from components.trainjob import launcher, spec
from components.trainjob.contract import NodeEnvironmentError
from tests.kube_stub import Plan, condition
from tests.test_trainjob import NS, PET, _pod_patch

FAST = launcher.Timing(poll_seconds=0.05, clear_seconds=5, log_grace_seconds=5)
CONFIG = {"model_name": "./tiny", "epochs": 2, "batch_size": 4}


def _argv(**changes) -> list[str]:
    values = {"--dataset-uri": "s3://data/run/prepare/dataset",
              "--model-uri": "s3://ckpt/models/run-7/train-transformer/model",
              "--config": json.dumps(CONFIG), "--checkpoint-root": "s3://ckpt", **changes}
    return [item for key, value in values.items() if value is not None
            for item in (key, value)]


def test_trainjob_node_plan_reads_its_arguments_and_maps_trainers_environment():
    plan = node.plan(_argv(), PET)
    assert plan.config == TransformerConfig(**CONFIG)
    assert plan.dataset_uri == "s3://data/run/prepare/dataset"
    assert plan.environment == {
        "MASTER_ADDR": "tj-x-node-0-0.tj-x", "MASTER_PORT": "29500", "WORLD_SIZE": "2",
        "RANK": "1", "AIP_CHECKPOINT_DIR": "s3://ckpt/checkpoints",
        "AIP_TENSORBOARD_LOG_DIR": "s3://ckpt/tensorboard", "OBJECT_STORE_MOUNTED": "0"}
    assert node.local_model_dir(plan.model_uri, "/scratch") == \
        "/scratch/run-7/train-transformer/model"  # the task's checkpoint folder, every node
    alone = node.plan(_argv(**{"--checkpoint-root": None, "--model-uri": "/out/r/t/model"}),
                      {})
    assert alone.environment == {}  # not a Trainer node, nothing remote: nothing to set


@pytest.mark.parametrize("config, words", [
    ("[1]", "a JSON object"), ("{", "not JSON"), ('{"epoch": 2}', "'epoch'"),
    ('{"epochs": 0}', "epochs must be >= 1")])
def test_trainjob_node_refuses_a_config_naming_what_is_wrong(config, words):
    with pytest.raises(TransformerTrainingError, match=words):
        node.plan(_argv(**{"--config": config}), PET)


def test_trainjob_node_refuses_an_incomplete_trainer_environment_and_missing_arguments():
    with pytest.raises(NodeEnvironmentError, match="PET_NODE_RANK"):
        node.plan(_argv(), {k: v for k, v in PET.items() if k != "PET_NODE_RANK"})
    with pytest.raises(SystemExit):
        node.plan(_argv(**{"--model-uri": None}), PET)


def _fake_train(calls: list, rank: int):
    def train(dataset_dir, model_dir, config, environ=None, gpus=None, **kwargs):
        calls.append({"dataset": sorted(os.listdir(dataset_dir)), "model_dir": model_dir,
                      "gpus": gpus, "rank": environ["RANK"], "config": config, **kwargs})
        if rank:
            return None
        with open(os.path.join(model_dir, "metrics.json"), "w") as f:
            json.dump({"ok": 1}, f)
        return {"ok": 1}
    return train


@pytest.mark.parametrize("rank", [0, 1])
def test_trainjob_node_runs_the_trainer_and_node0_uploads_the_model(tmp_path, monkeypatch,
                                                                    rank):
    dataset = tmp_path / "data"
    dataset.mkdir()
    (dataset / "train.csv").write_text("text,label\n")
    calls: list = []
    monkeypatch.setattr(launch, "train", _fake_train(calls, rank))
    monkeypatch.setattr(node, "_visible_gpus", lambda: 0)
    model_uri = str(tmp_path / "store" / "run-7" / "train" / "model")
    (tmp_path / "store" / "run-7" / "train" / "model").mkdir(parents=True)
    (tmp_path / "store" / "run-7" / "train" / "model" / "stale.bin").write_text("old")
    plan = node.plan(_argv(**{"--dataset-uri": str(dataset), "--model-uri": model_uri,
                              "--checkpoint-root": None}), {**PET, "PET_NODE_RANK": str(rank)})
    environ: dict[str, str] = dict(PET)
    result = node.run(plan, environ, str(tmp_path / "scratch"), model_root=str(tmp_path / "nodes"))
    [call] = calls
    assert call["gpus"] == 2 and call["rank"] == str(rank)  # PET_NPROC_PER_NODE on CPU
    assert call["dataset"] == ["train.csv"] and call["tensorboard_folder"] is None
    assert call["model_dir"].endswith("/run-7/train/model")
    assert environ["WORLD_SIZE"] == "2"  # set for the processes torch's launcher starts
    uploaded = sorted(os.listdir(model_uri))
    assert (result, uploaded) == (({"ok": 1}, ["metrics.json"]) if rank == 0
                                  else (None, ["stale.bin"]))


SETTINGS = multinode.NodeSettings(
    num_nodes=2, procs_per_node=2, gpus=1, cpu="6.9", memory="24Gi", shm="6Gi",
    node_selector={"nvidia.com/gpu.product": "Tesla-T4"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    image_pull_secrets=["regcred"], storage_secret="s3-keys", image="registry/fastai:1",
    s3_endpoint="http://minio:9000", deadline_seconds=3600)


def _launcher_files(tmp_path, **changes):
    """(dataset, model path, node 0's upload, SETTINGS with `changes`) under tmp_path."""
    settings = dataclasses.replace(SETTINGS, checkpoint_root=str(tmp_path / "ckpt"), **changes)
    dataset = tmp_path / "minio" / "run-7" / "prepare-text" / "dataset"
    dataset.mkdir(parents=True)
    (dataset / "manifest.json").write_text("{}")
    model_path = str(tmp_path / "minio" / "run-7" / "train-transformer" / "model")
    uploaded = os.path.join(settings.checkpoint_root, "models/run-7/train-transformer/model")
    return dataset, model_path, uploaded, settings


def test_trainjob_launcher_step_runs_the_job_and_copies_node0s_model(tmp_path, kube):
    stub, api = kube
    dataset, model_path, uploaded, settings = _launcher_files(tmp_path)
    root = settings.checkpoint_root
    os.makedirs(uploaded)  # as node 0 would have uploaded it
    with open(os.path.join(uploaded, "metrics.json"), "w") as f:
        json.dump({"task": "multi_label"}, f)
    environ = {"KFP_POD_NAME": "run-7-train-transformer-launcher", "KFP_POD_UID": "uid-1"}
    manifest, _ = multinode.trainjob(settings, dataset_uri="d", model_uri=uploaded, config={},
                                     tensorboard_dir="", namespace=NS, environ=environ)
    stub.plans[manifest["metadata"]["name"]] = Plan(
        conditions=[[], [condition("Complete", "JobsCompleted", "done")]], log=["epoch 1"])
    lines: list[str] = []
    result = multinode.train_on_nodes(
        settings, dataset_uri="minio://mlpipeline/v2/run-7/prepare-text/dataset",
        dataset_path=str(dataset), model_path=model_path, config=CONFIG, api=api,
        namespace=NS, environ=environ, write=lines.append, timing=FAST)
    assert result == {"task": "multi_label"}
    assert os.listdir(model_path) == ["metrics.json"]
    [create] = stub.calls("POST")
    job = create[3]
    spec.validate_manifest(job)
    assert job["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod",
                                                   "name": environ["KFP_POD_NAME"],
                                                   "uid": "uid-1"}]
    trainer = job["spec"]["trainer"]
    assert trainer["command"] == list(node.COMMAND) and trainer["numNodes"] == 2
    staged = os.path.join(root, "datasets", "run-7", "train-transformer", "dataset")
    assert os.listdir(staged) == ["manifest.json"]  # minio:// is no store a node reads
    args = dict(zip(trainer["args"][::2], trainer["args"][1::2]))
    assert args["--dataset-uri"] == staged and args["--model-uri"] == uploaded
    assert json.loads(args["--config"]) == CONFIG and args["--checkpoint-root"] == root
    env = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"]["key"]
           for e in trainer["env"]}
    assert env == {"OBJECT_STORE_MOUNTED": "0", "AWS_ENDPOINT_URL_S3": "http://minio:9000",
                   "EXPECTED_GPU_COUNT": "1", "AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
                   "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
                   **dict(zip(launcher.OWNER_VARIABLES, (job["metadata"]["name"], NS,
                                                         environ["KFP_POD_NAME"], "uid-1")))}
    [listing] = [r for r in stub.calls("GET", "/trainjobs") if "labelSelector" in r[2]]
    assert listing[2]["labelSelector"].startswith(multinode.TASK_LABEL + "=")
    assert "epoch 1" in lines and len(stub.calls("DELETE")) == 1


def test_trainjob_launcher_step_fails_with_the_jobs_reason_and_copies_nothing(tmp_path,
                                                                              kube):
    stub, api = kube
    dataset, model_path, uploaded, settings = _launcher_files(tmp_path)
    manifest, _ = multinode.trainjob(settings, dataset_uri="d", model_uri=uploaded, config={},
                                     tensorboard_dir="", namespace=NS, environ={})
    stub.plans[manifest["metadata"]["name"]] = Plan(
        conditions=[[condition("Failed", "FailedJobs", "node-1 OOMKilled")]])
    with pytest.raises(launcher.TrainJobFailed, match="node-1 OOMKilled"):
        multinode.train_on_nodes(settings, dataset_uri="s3://data/d", dataset_path=str(dataset),
                                 model_path=model_path, config=CONFIG, api=api, namespace=NS,
                                 environ={}, write=lambda line: None, timing=FAST)
    root = settings.checkpoint_root
    assert not os.path.exists(model_path) and not os.path.exists(os.path.join(root, "datasets"))
    assert len(stub.calls("DELETE")) == 1


def test_trainjob_nodes_leave_the_mesh_run_as_the_launcher_and_join_its_queue():
    """Istio (item 1), the launcher's service account (8), the secret's own key names (3)
    and Kueue's queue on the TrainJob (9)."""
    settings = dataclasses.replace(SETTINGS, secret_keys=("accesskey", "secretkey"),
                                   queue="gpu-queue", checkpoint_root="s3://ckpt")
    environ = {"KFP_POD_NAME": "p", "KFP_POD_UID": "u", "KFP_SERVICE_ACCOUNT": "default-editor"}

    def made(settings_):
        manifest, _ = multinode.trainjob(settings_, dataset_uri="s3://d", model_uri="s3://m/r/t/m",
                                         config={}, tensorboard_dir="", namespace=NS,
                                         environ=environ)
        return manifest, _pod_patch(manifest)

    manifest, pod = made(settings)
    assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert pod["spec"]["serviceAccountName"] == "default-editor"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]  # the job's, admitted whole
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in manifest["spec"]["trainer"]["env"]
               if "valueFrom" in e}
    assert secrets == {"AWS_ACCESS_KEY_ID": {"name": "s3-keys", "key": "accesskey"},
                       "AWS_SECRET_ACCESS_KEY": {"name": "s3-keys", "key": "secretkey"}}
    named = made(dataclasses.replace(settings, service_account="trainer-nodes"))[1]
    assert named["spec"]["serviceAccountName"] == "trainer-nodes"
    with pytest.raises(spec.ManifestError, match="not a secret key name"):
        made(dataclasses.replace(settings, secret_keys=("access key", "secretkey")))


def test_trainjob_launcher_step_waits_for_pending_nodes_as_long_as_compiled(tmp_path,
                                                                          monkeypatch):
    timings = []

    def launch(api, manifest, task_selector, write, timing):
        timings.append(timing)
        raise launcher.TrainJobFailed("stop here")

    monkeypatch.setattr(launcher, "launch", launch)
    dataset, model_path, _, settings = _launcher_files(tmp_path, pending_seconds=300)
    with pytest.raises(launcher.TrainJobFailed):
        multinode.train_on_nodes(settings, dataset_uri="s3://d", dataset_path=str(dataset),
                                 model_path=model_path, config=CONFIG, api=object(),
                                 namespace=NS, environ={})
    assert [t.pending_seconds for t in timings] == [300]


TRAINJOB_FLAGS = ("--target", "kubeflow", "--pipelines", "transformer_pipeline",
                  "--registry", "registry.example.com/ml", "--tag", "0a1b2c3",
                  "--train-transformer-replica-count", "2", "--checkpoint-root",
                  "s3://ckpt/runs", "--storage-secret", "s3-keys", "--s3-endpoint",
                  "http://minio-service.kubeflow:9000", "--spot", "--image-pull-secret",
                  "regcred", "--training-retries", "2")


def _compiled(tmp_path, *flags):
    assert compile_cli.main([*flags, "--output-dir", str(tmp_path)]) == 0
    return list(yaml.safe_load_all((tmp_path / "transformer_pipeline.yaml").read_text()))


def _constants(task: dict) -> dict:
    """A compiled task's inputs given as constants, by name."""
    return {name: value["runtimeValue"]["constant"]
            for name, value in task["inputs"]["parameters"].items() if "runtimeValue" in value}


def test_trainjob_compiled_launcher_holds_no_gpu_and_its_inputs_make_a_two_node_job(tmp_path):
    spec_, platform = _compiled(tmp_path, *TRAINJOB_FLAGS)
    executors = spec_["deploymentSpec"]["executors"]
    assert "exec-train-transformer-classifier" not in executors
    container = executors["exec-train-transformer-trainjob"]["container"]
    assert "resources" not in container  # no GPU, CPU or memory of its own: a light pod
    assert container["image"] == "registry.example.com/ml/fastai:0a1b2c3"
    pod = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
        "exec-train-transformer-trainjob"]
    assert not {"nodeSelector", "tolerations", "emptyDirMounts"} & set(pod)
    assert [s["secretName"] for s in pod["secretAsEnv"]] == ["s3-keys"]
    task = spec_["root"]["dag"]["tasks"]["train-transformer-trainjob"]
    assert task["taskInfo"]["name"] == "train-transformer"
    assert task["retryPolicy"]["maxRetryCount"] == 2  # a retry starts a new TrainJob
    inputs = _constants(task)
    settings = component.node_settings({name: int(value) if isinstance(value, float) else value
                                        for name, value in inputs.items()})  # JSON's numbers
    assert (settings.num_nodes, settings.gpus, settings.procs_per_node) == (2, 1, 1)
    assert settings.node_selector == {"nvidia.com/gpu.product": "Tesla-T4",
                                      "cloud.google.com/gke-spot": "true"}
    assert settings.runtime == "torch-distributed" and settings.image == container["image"]
    manifest, _ = multinode.trainjob(
        settings, dataset_uri="s3://ckpt/runs/datasets/r/t/dataset",
        model_uri="s3://ckpt/runs/models/r/t/model", config=CONFIG, tensorboard_dir="",
        namespace=NS, environ={"KFP_POD_NAME": "p", "KFP_POD_UID": "u"})
    spec.validate_manifest(manifest)  # through kubeflow-trainer-api 2.3's models
    trainer = manifest["spec"]["trainer"]
    assert trainer["resourcesPerNode"]["limits"] == {"cpu": "6.9", "memory": "24Gi",
                                                      "nvidia.com/gpu": "1"}
    assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert manifest["spec"]["activeDeadlineSeconds"] == 604800


def test_trainjob_compiled_launcher_learns_its_account_and_gets_the_nodes_options(tmp_path):
    """(--trainjob-runtime refused for Vertex: test_kubeflow_target's
    test_kubeflow_options_are_refused_for_vertex.)"""
    spec_, platform = _compiled(tmp_path, *TRAINJOB_FLAGS, "--storage-secret-keys",
                                "accesskey,secretkey", "--kueue-queue", "gpu-queue",
                                "--trainjob-pending-minutes", "5", "--trainjob-runtime",
                                "torch-gpu")
    task = spec_["root"]["dag"]["tasks"]["train-transformer-trainjob"]
    inputs = _constants(task)
    assert (inputs["storage_secret_keys"], inputs["queue_name"], inputs["pending_seconds"],
            inputs["service_account"], inputs["runtime"]) == (
        ["accesskey", "secretkey"], "gpu-queue", 300, "", "torch-gpu")
    pod = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
        "exec-train-transformer-trainjob"]
    assert pod["fieldPathAsEnv"] == [{"name": multinode.SERVICE_ACCOUNT,
                                      "fieldPath": "spec.serviceAccountName"}]
    assert pod["podMetadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "gpu-queue"}
    spec_, _ = _compiled(tmp_path, *TRAINJOB_FLAGS, "--trainjob-service-account", "nodes")
    inputs = _constants(spec_["root"]["dag"]["tasks"]["train-transformer-trainjob"])
    assert (inputs["service_account"], inputs["pending_seconds"]) == ("nodes", 900)  # 15 min


@pytest.mark.parametrize("flags, words", [
    (["--train-image-replica-count", "2"], "no TensorFlow runtime"),
    (["--train-text-replica-count", "2"], "fastai text trainer"),
    (["--train-lm-replica-count", "2"], "fastai language model"),
    (["--shard-replica-count", "2"], "race on its outputs"),
    (["--pipelines", "transformer_tuning_pipeline", "--checkpoint-root", "s3://c",
      "--train-transformer-replica-count", "2"], "trials stay one pod"),
    (["--pipelines", "transformer_pipeline", "--train-transformer-replica-count", "2"],
     "--checkpoint-root"),
    (["--pipelines", "transformer_pipeline", "--checkpoint-root", "s3://c",
      "--train-transformer-replica-count", "2", "--trainjob-runtime", "Torch!"],
     "--trainjob-runtime .Torch!. is not a name"),
])
def test_trainjob_replicas_refused_where_no_trainjob_runs_them_naming_why(tmp_path, flags,
                                                                          words):
    with pytest.raises(SystemExit, match=words):
        compile_cli.main(["--target", "kubeflow", "--output-dir", str(tmp_path), *flags])


def test_trainjob_launcher_takes_every_input_of_the_one_pod_trainer_alike():
    one = inspect.signature(component.train_transformer_classifier).parameters
    launcher_ = inspect.signature(component.train_transformer_trainjob).parameters
    assert {name: (p.default, p.annotation) for name, p in one.items()} == {
        name: (launcher_[name].default, launcher_[name].annotation) for name in one}
