"""The Kubeflow rehearsal (`tools.rehearsal.kubeflow`): compiled YAML run as the project models
open-source KFP's driver and launcher, with the pipeline root on a real S3 API on loopback
(moto's server). This tests that model of KFP, not Argo, Kubernetes or its scheduler.
"""

import os
from typing import NamedTuple

import pytest
import yaml
from kfp import compiler, dsl, kubernetes

from pipelines.local_run import LOCAL_IMAGE
from tools.rehearsal import kubeflow_demo
from tools.rehearsal.kubeflow import KubeflowJob, rehearse_kubeflow, retry_policy, scheduling_note
from tools.rehearsal.launcher import mount_path
from tools.rehearsal.records import RehearsalError
from tools.rehearsal.spec import select


@pytest.fixture(scope="module")
def s3_endpoint():
    with kubeflow_demo.s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def store(s3_endpoint, monkeypatch):
    """This process pointed at the S3 server (the launcher's side), its root bucket made;
    the variables are undone after the test (other tests' servers have other ports)."""
    kubeflow_demo.use_store(s3_endpoint, monkeypatch.setenv)
    kubeflow_demo.make_bucket(kubeflow_demo.ROOT)
    return s3_endpoint


# ------------------------------------------------------------------ pure parts


def test_kubeflow_launcher_paths_are_kfps_local_path_for_uri():
    assert mount_path("s3://b/k/x") == "/s3/b/k/x"
    assert mount_path("minio://mlpipeline/v2/a") == "/minio/mlpipeline/v2/a"
    assert mount_path("gs://b/k") == "/gcs/b/k"
    with pytest.raises(RehearsalError, match="no local path"):
        mount_path("/data/local")


def test_kubeflow_driver_resolves_only_whole_runtime_constants():
    job = KubeflowJob(name="image-classifier-20261127", uuid="run-1", root="s3://b/r")
    assert job.resolve_system("{{$.pipeline_job_name}}") == "image-classifier-20261127"
    assert job.resolve_system("x-{{$.pipeline_job_name}}") == "x-{{$.pipeline_job_name}}"
    assert job.resolve_system("{{$.pipeline_google_cloud_project_id}}") == \
        "{{$.pipeline_google_cloud_project_id}}"  # Vertex's own: nothing fills it


def test_kubeflow_retry_policy_and_scheduling_are_read_from_the_yaml():
    assert retry_policy({}) == (1, 0.0, 2.0)
    assert retry_policy({"retryPolicy": {"maxRetryCount": 2, "backoffDuration": "60s",
                                         "backoffFactor": 2.0}}) == (3, 60.0, 2.0)
    note = scheduling_note(
        {"resources": {"resourceCpuLimit": "6.9", "resourceMemoryLimit": "24Gi",
                       "accelerator": {"resourceCount": "2", "resourceType": "nvidia.com/gpu"}}},
        {"nodeSelector": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
         "tolerations": [{"key": "nvidia.com/gpu"}],
         "emptyDirMounts": [{"mountPath": "/dev/shm", "sizeLimit": "6Gi"}]})
    assert note == ("cpu 6.9; memory 24Gi; 2 x nvidia.com/gpu; node nvidia.com/gpu.product="
                    "NVIDIA-H100-80GB-HBM3; tolerates nvidia.com/gpu; /dev/shm 6Gi")


def test_a_loop_items_field_is_selected_as_the_compiled_selector_says():
    assert select({"lr": 0.1, "bs": 8}, 'parseJson(string_value)["lr"]', "x") == 0.1
    assert select('{"lr": 0.1}', 'parseJson(string_value)["lr"]', "x") == 0.1
    assert select([1, 2], "", "x") == [1, 2]
    with pytest.raises(RehearsalError, match="not one this rehearsal evaluates"):
        select({"a": 1}, "string_value.size()", "x")


# ------------------------------------------------------------------ a tiny compiled pipeline


@dsl.component(base_image=LOCAL_IMAGE, install_kfp_package=False)
def double(x: int) -> int:
    return 2 * x


@dsl.component(base_image=LOCAL_IMAGE, install_kfp_package=False)
def total(xs: list[int]) -> int:
    return sum(xs)


@dsl.component(base_image=LOCAL_IMAGE, install_kfp_package=False)
def flaky_writer(data: dsl.Output[dsl.Dataset]) -> str:
    """Fails its first attempt after writing part of its output; the retry writes it whole."""
    import os

    os.makedirs(data.path, exist_ok=True)
    attempt = os.environ["KFP_RETRY_INDEX"]
    with open(os.path.join(data.path, f"attempt-{attempt}.txt"), "w") as f:
        f.write(attempt)
    if attempt == "0":
        raise SystemExit("the first attempt dies half-way")
    return os.environ.get("API_TOKEN", "no token")


@dsl.component(base_image=LOCAL_IMAGE, install_kfp_package=False)
def reader(data: dsl.Input[dsl.Dataset]) -> str:
    import os

    return ",".join(sorted(os.listdir(data.path)))


class Outputs(NamedTuple):
    listing: str
    token: str
    total: int


@dsl.pipeline(name="kubeflow-rehearsal-probe")
def probe(xs: list[int] = [1, 2, 3]) -> Outputs:  # noqa: B006 (the compiled default)
    with dsl.ParallelFor(xs, parallelism=2) as x:
        doubled = double(x=x)
    summed = total(xs=dsl.Collected(doubled.output))
    written = flaky_writer().set_retry(num_retries=1, backoff_duration="30s")
    kubernetes.use_secret_as_env(written, secret_name="api", secret_key_to_env={"token":
                                                                                "API_TOKEN"})
    listing = reader(data=written.outputs["data"])
    return Outputs(listing=listing.output, token=written.outputs["Output"],
                   total=summed.output)


@pytest.fixture(scope="module")
def probe_yaml(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("probe") / "probe.yaml")
    compiler.Compiler().compile(probe, path)
    return path


def test_kubeflow_rehearsal_collects_a_loop_retries_in_a_new_pod_and_uploads_on_success(
        store, probe_yaml, tmp_path):
    summary = rehearse_kubeflow(probe_yaml, str(tmp_path / "r"), {"xs": "[1, 2, 5]"},
                                pipeline_root=kubeflow_demo.ROOT,
                                secrets={"api": {"token": "s3cret"}})
    tasks = {t["display_name"]: t for t in summary["rehearsal"]["tasks"]}
    assert tasks["for-loop-1"]["replicas"] == 3
    assert "parallelism 2 on a cluster" in tasks["for-loop-1"]["note"]
    assert summary["outputs"]["total"] == 16  # dsl.Collected: each iteration's 2x, summed
    # the reader saw what the launcher copied into its pod: the successful attempt only,
    # though the failed one wrote into the same output folder (of its own pod)
    assert summary["outputs"]["listing"] == "attempt-1.txt"
    assert summary["outputs"]["token"] == "s3cret"  # the secret's key, as API_TOKEN
    writer = tasks["flaky-writer"]
    assert writer["attempts"] == 2
    assert "back-off of 30s" in writer["note"] and "the first attempt dies" in writer["note"]
    pods = tmp_path / "r" / "pods" / "flaky-writer"
    assert sorted(p.name for p in pods.iterdir()) == ["attempt1", "attempt2"]
    assert (pods / "attempt1" / "s3").is_dir()  # the failed pod's files stayed there


def test_kubeflow_rehearsal_gives_the_pod_its_secret_and_not_the_launchers_credentials(
        store, probe_yaml, tmp_path):
    with pytest.raises(RehearsalError, match="secret 'api'.*--secret api=token=VALUE"):
        rehearse_kubeflow(probe_yaml, str(tmp_path / "r"), {}, pipeline_root=kubeflow_demo.ROOT)
    with pytest.raises(RehearsalError, match="bucket 'nowhere' does not exist"):
        rehearse_kubeflow(probe_yaml, str(tmp_path / "r"), {},
                          pipeline_root="s3://nowhere/root", secrets={"api": {"token": "t"}})


def test_kubeflow_rehearsal_reads_the_compiled_platform_settings(probe_yaml):
    from tools.rehearsal.kubeflow import load

    spec, executors = load(probe_yaml)
    assert spec["pipelineInfo"]["name"] == "kubeflow-rehearsal-probe"
    (mount,) = executors["exec-flaky-writer"]["secretAsEnv"]
    assert mount["secretName"] == "api"


# ------------------------------------------------------------------ the real pipelines


@pytest.mark.slow
def test_kubeflow_image_and_transformer_pipelines_rehearsed_on_s3_end_registered(
        store, tmp_path):
    """Both pipelines compiled for Kubeflow against the S3 server and rehearsed, every step
    in its own pod: the image training pod is lost after its first checkpoint and its retry
    resumes from S3; each run ends with an MLflow version (alias challenger) whose source
    is the model in S3, and a KServe manifest beside it."""
    from mlflow import MlflowClient

    from components.common.storage import filesystem
    from tests.conftest import write_densenet_weights
    from tools.datamakers.kubeflow_demo_data import write_demo_data

    write_demo_data(str(tmp_path / "data"))
    kubeflow_demo.stage(str(tmp_path / "data"))
    # The image training starts from a one-block-per-stage DenseNet (conftest) in S3:
    # its head phase is killed and resumed.
    weights = "s3://datasets/weights/notop.h5"
    kubeflow_demo.upload(write_densenet_weights(tmp_path / "notop.h5", 32), weights)
    build = kubeflow_demo.compile_for(store, str(tmp_path / "build"))
    with kubeflow_demo.mlflow_server(str(tmp_path / "mlflow")) as tracking:
        summaries = kubeflow_demo.rehearse_both(build, str(tmp_path), tracking,
                                                image_params={"weights": weights})
        client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
        image = client.get_model_version_by_alias("pets", "challenger")
        text = client.get_model_version_by_alias("Docstring Packages", "challenger")

    tasks = {t["display_name"]: t for t in summaries["image"]["rehearsal"]["tasks"]}
    train = tasks["train-densenet121"]
    assert train["attempts"] == 2 and "pod lost" in train["note"]
    logs = tmp_path / "image" / "logs" / "train-image-classifier"
    first, second = (logs / "attempt1.log").read_text(), (logs / "attempt2.log").read_text()
    assert "head epoch 0:" in first and "head epoch 3:" not in first
    assert "belongs to this run: finished work is reused" in second
    assert "head epoch 0:" not in second and "head epoch 3:" in second
    fs, _ = filesystem(image.source)
    assert image.source.startswith("s3://pipelines/root/image-classifier/")
    fs.get(image.source + "/", str(tmp_path / "served") + "/", recursive=True)
    import tensorflow as tf

    loaded = tf.saved_model.load(str(tmp_path / "served" / "1"))  # TF Serving's layout
    assert "serving_default" in loaded.signatures
    assert text.source.startswith("s3://pipelines/root/text-transformer/")
    for kind, version in (("image", image), ("transformer", text)):
        summary = summaries[kind]
        assert summary["registration"]["registered_in_mlflow"] is True
        pipeline = "image-classifier" if kind == "image" else "text-transformer"
        (manifest,) = fs.glob(f"pipelines/root/{pipeline}/*/register-in-mlflow/*/registered/"
                              "inferenceservice.yaml")  # uploaded by the launcher
        service = yaml.safe_load(fs.cat(manifest))
        assert service["kind"] == "InferenceService"
        assert service["metadata"]["labels"]["mlflow-version"] == str(version.version)
        assert all(t["state"] in ("succeeded", "skipped") for t in
                   summary["rehearsal"]["tasks"])
    assert summaries["transformer"]["metrics"]["micro_f1"] > 0.5
    assert os.path.isdir(tmp_path / "transformer" / "pods" / "train-transformer-classifier")
