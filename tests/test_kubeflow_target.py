"""The Kubeflow target (`compile.py --target kubeflow`): the compiled IR YAML, read with
KFP's own loaders, and what a cluster's scheduler would be asked for per step.

No Kubernetes or KFP backend can run here: these tests check the compiled files (the
pipeline spec and the `kfp-kubernetes` platform spec beside it), the options refused, and
the trials' own code run through KFP's executor.
"""

import itertools
import json
import math

import pytest
import yaml
from kfp import components
from kfp.dsl import Model
from kfp.dsl.executor import Executor

import compile as compile_cli
from components.register import mlflow_registry as registry
from components.tune import selection
from components.tune.contract import TUNABLE, draw_points, read_space
from components.tune.task_trial import run_trial
from pipelines.definitions import kubeflow
from pipelines.definitions.machine import Machine
from tests.kfp_api import KfpApiStub

REGISTRY = "registry.example.com/ml"
PIPELINES = ("image_pipeline", "text_pipeline", "lm_pipeline", "transformer_pipeline",
             "image_tuning_pipeline", "text_tuning_pipeline", "transformer_tuning_pipeline")
# Each pipeline's GPU tasks' executors, and the GPU they ask for by default.
GPU_EXECUTORS = {
    "image_pipeline": {"exec-train-image-classifier": ("Tesla-V100-SXM2-16GB", 2)},
    "text_pipeline": {"exec-train-text-classifier": ("Tesla-T4", 1)},
    "lm_pipeline": {"exec-train-language-model": ("Tesla-T4", 1)},
    "transformer_pipeline": {"exec-train-transformer-classifier": ("Tesla-T4", 1)},
    "image_tuning_pipeline": {"exec-train-image-classifier": ("Tesla-V100-SXM2-16GB", 2),
                              "exec-trial-train-image-classifier": ("Tesla-V100-SXM2-16GB", 2)},
}


def _compile(tmp_path, *extra):
    out = tmp_path / "kubeflow"
    assert compile_cli.main(["--target", "kubeflow", "--output-dir", str(out), "--registry",
                             REGISTRY, "--tag", "0a1b2c3", *extra]) == 0
    return out


def _documents(path):
    """(pipeline spec, platform spec's executors) of one compiled file."""
    spec, platform = yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader)  # libyaml's
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _compile(tmp_path_factory.mktemp("kf"))


def test_every_pipeline_compiles_to_yaml_kfp_loads_and_what_create_run_shows_is_kubeflows(
        compiled):
    """Each file KFP loads holds nothing of Vertex's (no GCPC launcher, job specs or
    Vertex-only placeholders), and the pipeline's description and its parameters' (what
    KFP's Create run shows) say nothing of Vertex: no job_service_account, registration in
    MLflow's Model Registry, the tuning variants' trials in a ParallelFor."""
    assert sorted(p.name for p in compiled.iterdir()) == sorted(f"{n}.yaml" for n in PIPELINES)
    for name in PIPELINES:
        text = (compiled / f"{name}.yaml").read_text()
        component = components.load_component_from_file(str(compiled / f"{name}.yaml"))
        assert component.pipeline_spec.root.dag.tasks, name
        for vertex_only in ("gcp_resources", "worker_pool_specs", "pipeline_google_cloud",
                            "google_cloud_pipeline_components", "CustomJob"):
            assert vertex_only not in text, (name, vertex_only)
        spec, _ = yaml.load_all(text, Loader=yaml.CSafeLoader)
        images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
        assert images <= {f"{REGISTRY}/tensorflow:0a1b2c3", f"{REGISTRY}/fastai:0a1b2c3"}
        description = spec["pipelineInfo"]["description"]
        params = spec["root"]["inputDefinitions"]["parameters"]
        shown = [description, *(p["description"] for p in params.values())]
        assert not [said for said in shown if "vertex" in said.lower()], name
        assert "job_service_account" not in params
        header = list(itertools.takewhile(lambda line: line.startswith("#"),
                                          text.splitlines()))
        assert header and not [line for line in header if "job_service_account" in line
                               or "vertex" in line.lower()]  # KFP's comment of the inputs
        if "register_model" in params:
            assert "MLflow Model Registry" in params["register_model"]["description"]
            assert "KServe" in params["register_model"]["description"]
            assert "MLflow" in params["model_display_name"]["description"]
        assert ("random search" in description and "ParallelFor" in description) == (
            "tuning" in name), name


@pytest.mark.parametrize("name", list(GPU_EXECUTORS))
def test_gpu_steps_get_their_gpus_node_toleration_shm_and_guaranteed_resources(compiled, name):
    spec, platform = _documents(compiled / f"{name}.yaml")
    for executor, (product, count) in GPU_EXECUTORS[name].items():
        resources = spec["deploymentSpec"]["executors"][executor]["container"]["resources"]
        assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert resources["accelerator"]["resourceCount"] == str(count)
        # requests = limits (Guaranteed QoS), below an n1-standard-8 node's 8 cores / 30 GiB
        assert resources["resourceCpuRequest"] == resources["resourceCpuLimit"] == "6.9"
        assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"] == "24Gi"
        pod = platform[executor]
        assert pod["nodeSelector"]["labels"] == {"nvidia.com/gpu.product": product}
        assert {"key": "nvidia.com/gpu", "operator": "Exists",
                "effect": "NoSchedule"} in pod["tolerations"]
        (shm,) = pod["emptyDirMounts"]
        assert shm["mountPath"] == "/dev/shm" and shm["medium"] == "Memory"
        assert shm["sizeLimit"] == "6Gi"  # inside the 24Gi the pod's limit counts
        assert pod["activeDeadlineSeconds"] == "604800"


def test_cpu_steps_get_no_gpu_and_light_steps_no_sizing(compiled):
    spec, platform = _documents(compiled / "image_pipeline.yaml")
    executors = spec["deploymentSpec"]["executors"]
    shard = executors["exec-shard-images"]["container"]["resources"]
    assert "accelerator" not in shard
    assert shard["resourceCpuRequest"] == "14.1"  # n1-highcpu-16 less the node's share
    assert "nodeSelector" not in platform["exec-shard-images"]
    assert "resources" not in executors["exec-preflight-image"]["container"]
    assert platform["exec-preflight-image"] == {"activeDeadlineSeconds": "604800"}


def test_options_reach_the_pods(tmp_path):
    out = _compile(tmp_path, "--pipelines", "image_pipeline,text_pipeline", "--spot",
                   "--gpu-node-label", "gke", "--image-pull-secret",
                   "regcred", "--step-timeout", "7200", "--train-image-machine-type",
                   "a2-highgpu-1g", "--train-image-accelerator-type", "NVIDIA_TESLA_A100",
                   "--train-image-accelerator-count", "1", "--train-text-cpu", "3",
                   "--train-text-memory", "12Gi", "--train-text-shm-size", "2Gi")
    spec, platform = _documents(out / "image_pipeline.yaml")
    pod = platform["exec-train-image-classifier"]
    assert pod["nodeSelector"]["labels"] == {"cloud.google.com/gke-accelerator":
                                             "nvidia-tesla-a100",
                                             "cloud.google.com/gke-spot": "true"}
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in pod["tolerations"]
    assert [secret["secretName"] for secret in pod["imagePullSecret"]] == ["regcred"]
    assert pod["activeDeadlineSeconds"] == "7200"
    resources = spec["deploymentSpec"]["executors"]["exec-train-image-classifier"][
        "container"]["resources"]
    assert resources["resourceCpuRequest"] == "10.5"  # 12 vCPUs of a2-highgpu-1g
    assert [secret["secretName"] for secret in
            platform["exec-preflight-image"]["imagePullSecret"]] == ["regcred"]
    spec, platform = _documents(out / "text_pipeline.yaml")
    text = spec["deploymentSpec"]["executors"]["exec-train-text-classifier"]["container"]
    assert text["resources"]["resourceCpuLimit"] == "3"
    assert text["resources"]["resourceMemoryLimit"] == "12Gi"
    assert platform["exec-train-text-classifier"]["emptyDirMounts"][0]["sizeLimit"] == "2Gi"


@pytest.mark.parametrize("flags, message", [
    (["--train-image-replica-count", "2"], "one pod"),
    (["--train-transformer-replica-count", "3"], "Kubeflow Trainer"),
    (["--tensorboard", "projects/p/locations/us-central1/tensorboards/1"], "Vertex option"),
    (["--encryption-key", "projects/p/locations/l/keyRings/r/cryptoKeys/k"], "--encryption-key"),
    (["--serving-image", "img:1"], "--serving-image is a Vertex option"),
    (["--train-text-reservation", "any"], "--train-text-reservation is a Vertex option"),
    (["--service-account", "a@p.iam.gserviceaccount.com"], "--service-account"),
    (["--tune-algorithm", "GRID_SEARCH"], "random search"),
    (["--train-text-machine-type", "my-node"], "--train-text-cpu"),
    (["--train-text-memory", "lots"], "not a memory quantity KFP takes"),
    (["--train-text-memory", "1.5Gi"], "not a memory quantity KFP takes"),
    (["--train-text-cpu", "2Gi"], "not a CPU quantity KFP takes"),
    (["--train-text-accelerator-count", "2", "--train-text-accelerator-type", ""],
     "go together"),
    (["--spot-node-selector", "pool=spot"], "add --spot"),
    (["--training-retries", "-1"], "--training-retries must be >= 0"),
    (["--train-text-shm-size", "64Gi"], "less than the pod's memory"),
    (["--train-text-accelerator-type", "NVIDIA_RTX_9000"], "--gpu-product"),
    (["--spot", "--spot-toleration", "pool=spot"], "KEY=VALUE:EFFECT"),
    (["--storage-secret", "s", "--storage-secret-keys", "accesskey"], "--storage-secret-keys"),
    (["--storage-secret", "s", "--storage-secret-keys", "key,key"], "two different keys"),
    (["--storage-secret", "s", "--storage-secret-keys", "access key,s"], "not a secret key name"),
    (["--storage-secret", "s", "--storage-secret-keys", ",secretkey"], "not a secret key name"),
    (["--storage-secret-keys", "accesskey,secretkey"], "give it"),
    (["--kueue-queue", "GPU queue"], "--kueue-queue 'GPU queue' is not a name"),
    (["--trainjob-service-account", "Nodes"], "--trainjob-service-account 'Nodes' is not"),
    (["--trainjob-pending-minutes", "0"], "--trainjob-pending-minutes must be > 0"),
])
def test_what_a_cluster_cannot_do_is_refused_naming_the_option(tmp_path, capsys, flags,
                                                               message):
    with pytest.raises(SystemExit) as exit_:
        _compile(tmp_path, *flags)
    assert message in str(exit_.value)
    assert not (tmp_path / "kubeflow").exists()


@pytest.mark.parametrize("flags", [["--image-pull-secret", "regcred"], ["--tune-seed", "3"],
                                   ["--training-retries", "2"], ["--kueue-queue", "q"],
                                   ["--storage-secret-keys", "a,b"], ["--trainjob-runtime", "x"]])
def test_kubeflow_options_are_refused_for_vertex(tmp_path, flags):
    with pytest.raises(SystemExit, match=f"{flags[0]} is a Kubeflow option"):
        compile_cli.main(["--output-dir", str(tmp_path), *flags])


def test_machine_types_map_to_pods_below_the_node():
    pod = kubeflow.pod_resources("train_image", Machine("a3-highgpu-8g"))
    assert (pod.gpu_type, pod.gpu_count) == ("NVIDIA_H100_80GB", 8)  # the machine's own GPUs
    assert float(pod.cpu) < 208 and pod.memory == f"{math.floor(1872 * 0.85 - 1)}Gi"
    assert pod.shm == "16Gi"  # capped
    small = kubeflow.pod_resources("evaluate_text", Machine("n1-standard-4"))
    assert (small.cpu, small.memory, small.gpu_count) == ("3.3", "11Gi", 0)
    assert small.shm == "2816Mi"  # a quarter of 11Gi
    tiny = kubeflow.pod_resources("evaluate_text", Machine("my-node"), cpu="500m",
                                  memory="768Mi")
    assert (tiny.cpu, tiny.memory, tiny.shm) == ("500m", "768Mi", "192Mi")


# --------------------------------------------------------------------------- trials


def test_trial_points_are_drawn_inside_the_space_the_same_way_each_compile():
    space = read_space("image")
    points = draw_points(space, 40, seed=3)
    assert points == draw_points(space, 40, seed=3) != draw_points(space, 40, seed=4)
    for point in points:
        assert set(point) == set(space.names())
        assert 1e-4 <= point["learning_rate"] <= 1e-2
        assert point["batch_size"] in (16, 32, 64)
        assert isinstance(point["unfreeze_blocks"], int) and 1 <= point["unfreeze_blocks"] <= 3
    rates = sorted(p["learning_rate"] for p in points)
    assert rates[len(rates) // 2] < 3e-3  # log scale: the median near the geometric middle


def test_tuning_variant_loops_over_the_drawn_points_and_collects_every_trial(compiled):
    spec, _ = _documents(compiled / "text_tuning_pipeline.yaml")
    tasks = spec["root"]["dag"]["tasks"]
    ((loop_key, loop),) = [(k, t) for k, t in tasks.items() if "parameterIterator" in t]
    # named by its task key: the 2.14/2.15 driver finds a loop by its name (KubeflowSettings.search)
    assert loop["taskInfo"]["name"] == loop_key
    items = json.loads(loop["parameterIterator"]["items"]["raw"])
    assert [item.pop("trial") for item in items] == list(range(1, 13))  # each names its trial
    assert items == draw_points(read_space("text"), 12, seed=0)
    assert loop["iteratorPolicy"]["parallelismLimit"] == 3
    select = tasks["select-text-trial"]
    assert select["taskInfo"]["name"] == "tune-text"
    results = select["inputs"]["parameters"]["results"]["taskOutputParameter"]
    assert results["producerTask"] == loop_key
    training = tasks["train-text-classifier"]["inputs"]["parameters"]
    for name in TUNABLE["text"]:
        assert training[name]["taskOutputParameter"]["producerTask"] == "select-text-trial"


def test_a_failed_trial_is_a_result_and_too_many_failures_fail_the_search(tmp_path):
    runs = []

    def trainer(model, learning_rate: float, batch_size: int):
        runs.append((learning_rate, batch_size))
        if learning_rate > 0.01:
            raise RuntimeError("loss is NaN")

    model = Model(uri=str(tmp_path / "m"))
    failed = run_trial(trainer, "text", "f1_score", "maximize",
                       {"learning_rate": 0.05, "batch_size": 32.0}, {"model": model,
                                                                    "learning_rate": 1e-3,
                                                                    "batch_size": 16})
    assert runs == [(0.05, 32)]  # the trial's values, typed, over the run's
    assert failed["state"] == "FAILED" and "loss is NaN" in failed["error"]
    unknown = run_trial(trainer, "text", "f1_score", "maximize", {"momentum": 0.9},
                        {"model": model})
    assert unknown["state"] == "FAILED" and "momentum" in unknown["error"]

    ok = {"state": "SUCCEEDED", "parameters": {"learning_rate": 0.002, "batch_size": 64},
          "metric": 0.7, "error": None}
    better = {**ok, "parameters": {"learning_rate": 0.004}, "metric": 0.8}
    trials = Model(uri=str(tmp_path / "trials"))
    defaults = {"learning_rate": 1e-3, "lm_learning_rate": 2e-3, "drop_mult": 0.3,
                "batch_size": 16}
    best = selection.choose_from_results("text", [ok, failed, better], "maximize", 0,
                                         defaults, trials)
    assert best == {**defaults, "learning_rate": 0.004}  # unsearched values stay the run's
    table = json.loads((tmp_path / "trials" / "trials.json").read_text())
    assert [t["state"] for t in table["trials"]] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    assert table["best"]["id"] == "3"
    with pytest.raises(selection.TuningError, match="2 of 3 trials failed"):
        selection.choose_from_results("text", [ok, failed, unknown], "maximize", 2, defaults,
                                      trials)
    with pytest.raises(selection.TuningError, match="no trial of 2 succeeded"):
        selection.choose_from_results("text", [failed, unknown], "maximize", 0, defaults,
                                      trials)
    assert json.loads((tmp_path / "trials" / "trials.json").read_text())["best"] is None


def test_kfp_runs_a_trial_with_the_trainers_signature(tmp_path, monkeypatch):
    """KFP's executor reads the trial step's signature (the trainer's and the point's),
    passes the task's inputs and output artifact, and stores the result as the `Output`
    struct."""
    from components.train_text import component as train_text
    from components.tune.component import TRIAL

    trial = TRIAL["text"]

    seen = {}

    def train(model, learning_rate: float, batch_size: int, **rest):
        seen.update(learning_rate=learning_rate, batch_size=batch_size, path=model.path)
        raise ValueError("out of memory")

    monkeypatch.setattr(train_text, "train_text_classifier", train)
    output_file = tmp_path / "executor_output.json"
    executor_input = {
        "inputs": {"parameterValues": {"learning_rate": 0.001, "batch_size": 16,
                                       "trial_point": {"batch_size": 32.0},
                                       "study_metric": "f1_score", "study_goal": "maximize"}},
        "outputs": {"artifacts": {name: {"artifacts": [{
            "name": name, "type": {"schemaTitle": "system.Model"},
            "uri": str(tmp_path / name), "metadata": {}}]} for name in ("model", "metrics")},
            "parameters": {"Output": {"outputFile": str(tmp_path / "Output")}},
            "outputFile": str(output_file)},
    }
    Executor(executor_input=executor_input, function_to_execute=trial).execute()
    assert seen["learning_rate"] == 0.001 and seen["batch_size"] == 32
    result = json.loads(output_file.read_text())["parameterValues"]["Output"]
    assert result["state"] == "FAILED" and "out of memory" in result["error"]
    assert result["parameters"] == {"batch_size": 32}


@pytest.mark.slow
def test_kubeflow_tuning_variant_runs_its_trials_in_a_loop_and_retrains_with_the_best(
        tmp_path):
    """The Kubeflow text tuning pipeline run whole through `kfp.local` (which ignores the
    pod settings): two trials in the ParallelFor, each the trainer with its point, their
    results collected, the selection step's trials.json, then training with the best
    values."""
    from kfp import local

    from components.tune.contract import parse_space
    from pipelines.definitions import text, tuning
    from pipelines.local_run import LOCAL_IMAGE
    from tools.datamakers.demo_text import write_reviews_csv

    csv = tmp_path / "reviews.csv"
    write_reviews_csv(str(csv), rows=80, seed=3)
    space = parse_space("text", {"metric": "valid_loss", "goal": "minimize", "parameters": {
        "drop_mult": {"type": "double", "min": 0.1, "max": 0.6},
        "batch_size": {"type": "discrete", "values": [8, 16]}}})
    tune = tuning.TuningSettings(spaces={"text": space}, max_trials=2, parallel_trials=2,
                                 seed=5)
    # kfp.local runs every pod here, with its environment: the training pod on a CPU node
    # (a GPU pod would stop at its GPU check, tests/test_gpus.py)
    settings = compile_cli.target_settings(compile_cli.parse_args(
        ["--target", "kubeflow", "--train-text-accelerator-type", "",
         "--train-text-accelerator-count", "0"]))
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "kfp"))
    pipeline = text.build(LOCAL_IMAGE, settings, tune)
    run = pipeline(data_uri=str(csv), epochs=2, lm_epochs=0, min_freq=1, pretrained=False,
                   model_config='{"emb_sz": 16, "n_hid": 24, "n_layers": 1}')
    points = draw_points(space, 2, seed=5)
    (trials_json,) = (tmp_path / "kfp").rglob("trials.json")
    table = json.loads(trials_json.read_text())
    assert [t["state"] for t in table["trials"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert [t["parameters"] for t in table["trials"]] == points
    best = min(table["trials"], key=lambda t: t["metric"])
    assert table["best"]["id"] == best["id"]
    with open(f"{run.outputs['model'].path}/metrics.json") as f:
        config = json.load(f)["config"]
    assert config["batch_size"] == best["parameters"]["batch_size"]
    assert config["drop_mult"] == pytest.approx(best["parameters"]["drop_mult"])


# --------------------------------------------------------------------------- submit


def test_submit_starts_a_run_with_the_pod_settings_checked_parameters_and_the_token(
        compiled, tmp_path, capsys, monkeypatch):
    from pipelines import submit

    monkeypatch.setenv("HOME", str(tmp_path))  # kfp.Client's context file
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    stub = KfpApiStub()
    try:
        assert submit.main(["--target", "kubeflow", str(compiled / "image_pipeline.yaml"),
                            "--host", stub.url, "--namespace", "team-a", "--experiment",
                            "pets", "--service-account", "pipeline-runner", "--token-file",
                            str(token), "--param", "data_uri=gs://b/pets",
                            "--param", "image_size=160", "--no-cache"]) == 0
    finally:
        stub.close()
    assert "started run run-1 in experiment 'pets'" in capsys.readouterr().out
    (create_experiment,) = [r for r in stub.requests if r["method"] == "POST"
                            and r["path"].startswith("/apis/v2beta1/experiments")]
    assert create_experiment["body"]["display_name"] == "pets"
    assert create_experiment["body"]["namespace"] == "team-a"
    (run,) = [r for r in stub.requests if r["path"] == "/apis/v2beta1/runs"]
    assert all(r["auth"] == "Bearer secret-token" for r in stub.requests)
    body = run["body"]
    assert body["experiment_id"] == "exp-1" and body["service_account"] == "pipeline-runner"
    assert body["runtime_config"]["parameters"] == {"data_uri": "gs://b/pets", "image_size": 160}
    spec = body["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "image-classifier"
    executors = spec["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-train-image-classifier"]["nodeSelector"]["labels"] == {
        "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}
    # --no-cache reaches every task, in conditions too (kfp.Client's own reaches the top)
    pipeline = spec["pipeline_spec"]
    tasks = [t for dag in [pipeline["root"]["dag"], *(c["dag"] for c in pipeline[
        "components"].values() if "dag" in c)] for t in dag["tasks"].values()]
    assert "predict" in {t["taskInfo"]["name"] for t in tasks}  # inside prediction-requested
    # (compiled, each says enableCache: true; proto3 drops a false)
    assert not any(t.get("cachingOptions", {}).get("enableCache") for t in tasks)


# (--param values: pipelines.compiled, tests/test_submit.py's refusals)
@pytest.mark.parametrize("flags, message", [
    (["--host", "kfp.example.com"], "--host"),
    (["--service-account", "sa@p.iam.gserviceaccount.com"], "not an email"),
    (["--namespace", "Team_A"], "--namespace"),
])
def test_submit_refuses_bad_input_before_sending(compiled, capsys, flags, message):
    from pipelines import submit

    argv = ["--target", "kubeflow", str(compiled / "image_pipeline.yaml"), "--host",
            "http://127.0.0.1:9", "--param", "data_uri=gs://b/pets", *flags]
    assert submit.main(argv) == 2
    assert message in capsys.readouterr().err


def test_training_steps_keep_checkpoints_in_the_object_store_and_pods_get_storage(tmp_path):
    out = _compile(tmp_path, "--checkpoint-root", "s3://ckpt/runs/", "--storage-secret",
                   "mlpipeline-minio-artifact", "--storage-secret-keys", "accesskey,secretkey",
                   "--s3-endpoint", "http://minio.kubeflow:9000", "--kueue-queue", "gpu-queue",
                   "--training-retries", "2", "--pipelines", "image_tuning_pipeline")
    spec, platform = _documents(out / "image_tuning_pipeline.yaml")
    executors = spec["deploymentSpec"]["executors"]

    def env(executor):
        return {e["name"]: e["value"] for e in executors[executor]["container"].get("env", [])}

    assert env("exec-train-image-classifier") == {
        "AWS_ENDPOINT_URL_S3": "http://minio.kubeflow:9000",
        "AIP_CHECKPOINT_DIR": "s3://ckpt/runs/checkpoints",
        "AIP_TENSORBOARD_LOG_DIR": "s3://ckpt/runs/tensorboard", "OBJECT_STORE_MOUNTED": "0",
        "EXPECTED_GPU_COUNT": "2"}  # its GPUs, checked before it trains
    # a failed trial is a result: no checkpoints to resume from, no retries
    assert "AIP_CHECKPOINT_DIR" not in env("exec-trial-train-image-classifier")
    tasks = {t["taskInfo"]["name"]: t for c in [spec["root"], *spec["components"].values()]
             if "dag" in c for t in c["dag"]["tasks"].values()}
    assert tasks["train-densenet121"]["retryPolicy"]["maxRetryCount"] == 2
    assert "retryPolicy" not in tasks["trial"] and "retryPolicy" not in tasks["shard-images"]
    # every pod: /gcs is KFP's scratch folder, not a bucket mount
    assert env("exec-shard-images") == {"AWS_ENDPOINT_URL_S3": "http://minio.kubeflow:9000",
                                        "OBJECT_STORE_MOUNTED": "0"}
    assert set(platform) == set(executors)  # every pod, the trials' too
    for pod in platform.values():  # KFP's own MinIO secret as it is
        (secret,) = pod["secretAsEnv"]
        assert secret["secretName"] == "mlpipeline-minio-artifact"
        assert {k["secretKey"]: k["envVar"] for k in secret["keyToEnv"]} == {
            "accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}
        assert pod["podMetadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "gpu-queue"}
    text = (out / "image_tuning_pipeline.yaml").read_text()
    assert "AWS_SECRET_ACCESS_KEY:" not in text.replace("envVar: AWS_SECRET_ACCESS_KEY", "")
    with pytest.raises(SystemExit, match="--checkpoint-root '/mnt/ckpt' must be a gs://"):
        _compile(tmp_path, "--checkpoint-root", "/mnt/ckpt")


# --------------------------------------------------------------------------- registration


@pytest.mark.parametrize("name", ["image_pipeline", "text_pipeline", "transformer_pipeline"])
def test_a_model_that_clears_the_gate_is_registered_in_mlflow_when_tracking_is_set(compiled,
                                                                                   name):
    spec, _ = _documents(compiled / f"{name}.yaml")
    gate = [t for t in spec["root"]["dag"]["tasks"].values()
            if "registration-gate-Output" in t.get("triggerPolicy", {}).get("condition", "")]
    (outer,) = gate
    ((_, branches),) = spec["components"][outer["componentRef"]["name"]]["dag"]["tasks"].items()
    inner_dag = spec["components"][branches["componentRef"]["name"]]["dag"]["tasks"]
    untracked, tracked = sorted(inner_dag.values(), key=lambda t: t["taskInfo"]["name"])
    assert tracked["triggerPolicy"]["condition"].endswith("['pipelinechannel--tracking_uri'] != ''")
    # without a registry the run says so, in a step of its own
    assert untracked["taskInfo"]["name"] == "no-registry"
    ((_, note),) = spec["components"][untracked["componentRef"]["name"]]["dag"]["tasks"].items()
    assert note["taskInfo"]["name"] == "nothing-registered"
    assert "nothing was registered" in note["inputs"]["parameters"]["reason"][
        "runtimeValue"]["constant"]
    ((key, register),) = spec["components"][tracked["componentRef"]["name"]]["dag"][
        "tasks"].items()
    assert key == "register-in-mlflow" and register["taskInfo"]["name"] == "register-model"
    assert register["cachingOptions"] == {}  # never cached: the registry changes
    kind = name.split("_")[0]
    assert register["inputs"]["parameters"]["kind"]["runtimeValue"]["constant"] == kind
    assert "ModelUploadOp" not in json.dumps(spec) and "model-upload" not in json.dumps(spec)


def test_registration_adds_an_mlflow_version_with_the_challenger_alias(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = registry.register_version(uri, "pets", "s3://models/run-1/served",
                                      {"pipeline_run": "run-1"})
    second = registry.register_version(uri, "pets", "s3://models/run-2/served",
                                       {"pipeline_run": "run-2"})
    assert (first, second) == ("1", "2")
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = client.get_model_version_by_alias("pets", "challenger")
    assert str(version.version) == "2" and version.source == "s3://models/run-2/served"
    assert version.tags == {"pipeline_run": "run-2"}


def test_inference_services_serve_image_models_on_tf_serving_and_text_on_our_server():
    image = registry.inference_service("pets", "image", "s3://m/served", "", {"v": "1"})
    assert image["apiVersion"] == "serving.kserve.io/v1beta1"
    assert image["spec"]["predictor"]["model"] == {
        "modelFormat": {"name": "tensorflow"}, "runtimeVersion": "2.21.0",
        "storageUri": "s3://m/served"}
    text = registry.inference_service("reviews", "text", "s3://m/model", "reg/fastai:abc", {})
    (container,) = text["spec"]["predictor"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["image"] == "reg/fastai:abc"
    # KServe's storage initializer copies STORAGE_URI to /mnt/models; the server reads AIP_*
    assert env["STORAGE_URI"] == "s3://m/model" and env["AIP_STORAGE_URI"] == "/mnt/models"
    assert container["ports"] == [{"containerPort": int(env["AIP_HTTP_PORT"]),
                                   "protocol": "TCP"}]
    probe = container["startupProbe"]
    assert probe["timeoutSeconds"] < probe["periodSeconds"]
    # Knative fails a revision not ready by its progress deadline (600 s by default)
    deadline = text["metadata"]["annotations"]["serving.knative.dev/progress-deadline"]
    assert int(deadline.rstrip("s")) > probe["periodSeconds"] * probe["failureThreshold"] > 600
    assert "annotations" not in image["metadata"]
    assert registry.service_name("DenseNet121 Image_Classifier!") == \
        "densenet121-image-classifier"
    assert registry.service_name("2024 model") == "m-2024-model"
    assert len(registry.service_name("x" * 80)) == 45
    with pytest.raises(ValueError, match="no letter or digit"):
        registry.service_name("---")


def test_an_image_model_is_staged_in_tf_servings_numbered_layout(tmp_path):
    saved = tmp_path / "model" / "saved_model"
    (saved / "variables").mkdir(parents=True)
    (saved / "saved_model.pb").write_bytes(b"pb")
    (saved / "variables" / "variables.index").write_bytes(b"ix")
    out = registry.stage_tf_serving(str(tmp_path / "model"), str(tmp_path / "served"))
    assert (tmp_path / "served" / "1" / "saved_model.pb").read_bytes() == b"pb"
    assert (tmp_path / "served" / "1" / "variables" / "variables.index").exists()
    assert out == str(tmp_path / "served")
    with pytest.raises(FileNotFoundError, match="no saved_model.pb"):
        registry.stage_tf_serving(str(tmp_path / "served"), str(tmp_path / "again"))
