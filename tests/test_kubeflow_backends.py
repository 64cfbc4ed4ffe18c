"""The compiled Kubeflow files held against the real backends' own definitions.

KFP's API server refuses a pipeline whose spec or executor settings hold a field its
version does not know. Each supported backend's protos come from PyPI
(`kfp-pipeline-spec`, `kfp-kubernetes` of that release), each in an environment of its own
(`tools.kfp_backends`, cached under .cache/kfp-backends; `make backends` makes them), and
every file is parsed strictly with each. A real API server, Argo and the driver are not
here: what they do with a file that parses is in docs/kubeflow.md. The TrainJob the
transformer's launcher creates is held alike against each Kubeflow Trainer release's own
API models (`tools.trainer_releases`).
"""

import copy
import os

import pytest
import yaml

import compile as compile_cli
from components.train_transformer import multinode
from pipelines.definitions import kubeflow
from tools import kfp_backends, trainer_releases

# Every option that changes the platform settings, in one compile; and none.
ALL_PLATFORM_OPTIONS = (
    "--storage-secret", "s3-keys", "--s3-endpoint", "http://minio-service.kubeflow:9000",
    "--checkpoint-root", "s3://ckpt/runs", "--training-retries", "2", "--spot",
    "--image-pull-secret", "regcred", "--image-pull-secret", "regcred-2",
    "--tune-trials", "3", "--tune-parallel-trials", "2", "--step-timeout", "86400",
    "--storage-secret-keys", "accesskey,secretkey", "--kueue-queue", "gpu-queue")
VARIANTS = {
    "plain": (),
    "every-option": ALL_PLATFORM_OPTIONS,
    "gke-labels-no-gpu-type": ("--gpu-node-label", "gke", "--spot-node-selector",
                               "eks.amazonaws.com/capacityType=SPOT", "--spot",
                               "--spot-toleration", "spot=true:NoSchedule"),
    # the transformer step past one pod: a TrainJob's launcher (its tuning variant refuses)
    "trainjob": (*ALL_PLATFORM_OPTIONS, "--pipelines", "transformer_pipeline",
                 "--train-transformer-replica-count", "2"),
}


@pytest.fixture(scope="module")
def compiled_variants(tmp_path_factory):
    """Every pipeline compiled with each variant's options: {variant: {path: documents}}."""
    variants = {}
    for name, flags in VARIANTS.items():
        out = tmp_path_factory.mktemp(name)
        assert compile_cli.main(["--target", "kubeflow", "--output-dir", str(out),
                                 "--registry", "registry.example.com/ml", "--tag", "0a1b2c3",
                                 *flags]) == 0
        variants[name] = kfp_backends.read_documents(sorted(map(str, out.glob("*.yaml"))))
        assert len(variants[name]) == (1 if "--pipelines" in flags else 7)
    return variants


@pytest.mark.parametrize("backend", list(kfp_backends.BACKENDS))
def test_every_compiled_file_parses_strictly_on_every_supported_backend(compiled_variants,
                                                                        backend):
    for variant, documents in compiled_variants.items():
        assert kfp_backends.refusals(documents, backend) == [], variant


def test_the_check_refuses_what_the_oldest_backend_does_not_know(compiled_variants):
    """The strict parse can fail: kfp-kubernetes 2.17's own `optional` in secretAsEnv (what
    `kubeflow.without_default_optional` drops) is refused by 2.14 and read by 2.17."""
    documents = compiled_variants["every-option"]
    path = next(p for p in documents if p.endswith("/image_pipeline.yaml"))
    spec, platform = copy.deepcopy(documents[path])
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    executors["exec-train-image-classifier"]["secretAsEnv"][0]["optional"] = False
    changed = {path: [spec, platform]}
    (refusal,) = kfp_backends.refusals(changed, "2.14")
    assert "exec-train-image-classifier" in refusal and '"optional"' in refusal
    assert kfp_backends.refusals(changed, "2.17") == []
    spec["root"]["dag"]["tasks"]["train-image-classifier"]["unknownSetting"] = 1
    assert any("unknownSetting" in line for line in kfp_backends.refusals(changed, "2.17"))


def test_only_the_default_optional_is_dropped():
    class Task:
        platform_config = {"kubernetes": {"secretAsEnv": [
            {"secretName": "a", "optional": False}, {"secretName": "b", "optional": True}]}}

    kubeflow.without_default_optional(Task)
    assert Task.platform_config["kubernetes"]["secretAsEnv"] == [
        {"secretName": "a"}, {"secretName": "b", "optional": True}]


def test_no_loop_carries_a_name_other_than_its_task_key(compiled_variants):
    """The 2.14/2.15 driver records a loop under its display name, and `Collected` looks
    its producer up by task key (kubeflow/pipelines#13239): the two must agree."""
    loops = 0
    for documents in compiled_variants.values():
        for spec, _ in documents.values():
            for component in [spec["root"], *spec["components"].values()]:
                for key, task in component.get("dag", {}).get("tasks", {}).items():
                    if "parameterIterator" in task or "artifactIterator" in task:
                        loops += 1
                        assert task["taskInfo"]["name"] == key
    # the trials of each tuning variant (the trainjob variant compiles none)
    assert loops == 3 * sum("--pipelines" not in flags for flags in VARIANTS.values())


def test_training_retries_outlast_every_attempt_at_its_timeout(compiled_variants):
    documents = compiled_variants["every-option"]
    retried = 0
    for spec, _ in documents.values():
        for component in [spec["root"], *spec["components"].values()]:
            for task in component.get("dag", {}).get("tasks", {}).values():
                policy = task.get("retryPolicy")
                if policy:
                    retried += 1
                    assert policy["maxRetryCount"] == 2
                    # 3 attempts of a day each, an hour each to be scheduled, and the
                    # back-offs of 60 s and 120 s
                    assert policy["backoffMaxDuration"] == f"{3 * (86400 + 3600) + 180}s"
    assert retried == 7  # one training step per pipeline
    assert kubeflow.retry_window(0, 3600) == 7200
    assert kubeflow.retry_window(3, 604800) == 4 * (604800 + 3600) + 60 + 120 + 240


def test_an_environment_holds_its_backends_pins_and_is_made_once():
    folder = kfp_backends.environment("2.14")  # the suite's cache
    with open(f"{folder}/.installed") as stamp:
        assert stamp.read().split() == ["kfp-pipeline-spec==2.14.0", "kfp-kubernetes==2.14.0",
                                        "protobuf==6.31.1", kfp_backends.COMMON_PROTOS]
    made = os.stat(f"{folder}/.installed").st_mtime_ns
    assert kfp_backends.environment("2.14") == folder
    assert os.stat(f"{folder}/.installed").st_mtime_ns == made  # not installed again


def test_the_command_reports_each_backend_and_fails_on_a_refusal(compiled_variants, capsys,
                                                                 tmp_path):
    documents = compiled_variants["plain"]
    path = next(p for p in documents if p.endswith("/lm_pipeline.yaml"))
    assert kfp_backends.main([path, "--backend", "2.14", "--backend", "2.17"]) == 0
    out = capsys.readouterr().out  # other tests' threads may write here too: lines, not all
    assert "KFP 2.14: 1 files, all parse" in out and "KFP 2.17: 1 files, all parse" in out
    spec, platform = copy.deepcopy(documents[path])
    spec["pipelineInfo"]["owner"] = "someone"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec) + "---\n" + yaml.safe_dump(platform))
    assert kfp_backends.main([str(bad), "--backend", "2.16"]) == 1
    out = capsys.readouterr().out
    assert "KFP 2.16: 1 files, refused: 1" in out and '"owner"' in out


def test_documents_are_read_as_kfp_writes_them(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"a": 1}) + "---\n" + yaml.safe_dump({"b": 2}))
    assert kfp_backends.read_documents([str(path)]) == {str(path): [{"a": 1}, {"b": 2}]}


@pytest.mark.parametrize("release", list(trainer_releases.RELEASES))
def test_a_two_node_trainjob_is_taken_whole_by_the_trainer_releases_the_docs_support(release):
    settings = multinode.NodeSettings(
        num_nodes=2, procs_per_node=4, gpus=4, cpu="14.1", memory="48Gi", shm="12Gi",
        node_selector={"nvidia.com/gpu.product": "Tesla-T4"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        image_pull_secrets=["regcred"], storage_secret="mlpipeline-minio-artifact",
        secret_keys=("accesskey", "secretkey"), service_account="nodes", queue="gpu-queue",
        image="registry/fastai:1", checkpoint_root="s3://ckpt", s3_endpoint="http://minio:9000",
        deadline_seconds=3600)
    manifest, _ = multinode.trainjob(settings, dataset_uri="s3://d", model_uri="s3://m/r/t/m",
                                     config={"epochs": 2}, tensorboard_dir="", namespace="ns",
                                     environ={"KFP_POD_NAME": "p", "KFP_POD_UID": "u"})
    refusal = trainer_releases.refusal(manifest, release)
    if release not in trainer_releases.SUPPORTED:  # 2.1: podTemplateOverrides, neither
        assert ".spec.runtimePatches: not a field" in refusal
        assert ".spec.activeDeadlineSeconds: not a field" in refusal
        return
    assert refusal == ""
    # the check can fail on a release it takes: a pod field 2.3 added
    broken = copy.deepcopy(manifest)
    broken["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"] = 5
    assert ("terminationGracePeriodSeconds: not a field" in trainer_releases.refusal(
        broken, release)) == (release == "2.2")
