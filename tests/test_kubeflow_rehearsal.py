"""The Kubeflow rehearsal (`tools.rehearsal.kubeflow`): compiled YAML run as the project models
open-source KFP's driver and launcher, with the pipeline root on a real S3 API on loopback
(moto's server). This tests that model of KFP, not Argo, Kubernetes or its scheduler.
"""

import json
import os
from typing import NamedTuple

import pytest
import yaml
from kfp import compiler, dsl, kubernetes

from pipelines.local_run import LOCAL_IMAGE
from tools.rehearsal import kubeflow_demo
from tools.rehearsal.kubeflow import (
    KubeflowJob,
    load,
    main,
    rehearse_kubeflow,
    renamed_loops,
    retry_kubeflow,
)
from tools.rehearsal.launcher import (
    Kill,
    ObjectStore,
    mount_path,
    retry_policy,
    scheduling_note,
)
from tools.rehearsal.records import RehearsalError
from tools.rehearsal.spec import select


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


def test_a_kill_ends_an_attempt_failed_and_a_pod_deletion_as_error():
    assert Kill("train", "b/**/checkpoint").ended()[0] == "Failed"  # retried (OnFailure)
    assert Kill("train", "b/**/checkpoint", deleted=True).ended()[0] == "Error"  # not


def test_a_loop_items_field_is_selected_as_the_compiled_selector_says():
    assert select({"lr": 0.1, "bs": 8}, 'parseJson(string_value)["lr"]', "x") == 0.1
    assert select('{"lr": 0.1}', 'parseJson(string_value)["lr"]', "x") == 0.1
    assert select([1, 2], "", "x") == [1, 2]
    with pytest.raises(RehearsalError, match="not one this rehearsal evaluates"):
        select({"a": 1}, "string_value.size()", "x")


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


def _loop_pipeline(name):
    @dsl.pipeline(name="kubeflow-loop-name")
    def loop(xs: list[int] = [1]) -> int:  # noqa: B006 (the compiled default)
        with dsl.ParallelFor(xs, name=name) as x:
            doubled = double(x=x)
        return total(xs=dsl.Collected(doubled.output)).output

    return loop


@pytest.fixture(scope="module")
def loop_yamls(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loops")
    paths = {}
    for name in ("renamed", None):
        paths[name] = str(folder / f"{name}.yaml")
        compiler.Compiler().compile(_loop_pipeline(name), paths[name])
    return paths


def test_before_kfp_2_16_a_named_loops_consumer_does_not_find_it(store, loop_yamls, tmp_path):
    """The 2.14/2.15 compiler gives a loop's driver no task name: the loop is recorded under
    its display name, and `Collected` looks its producer up by key (kubeflow/pipelines#13239,
    fixed in 2.16). Other tasks are recorded under their keys on every version."""
    spec, _ = load(loop_yamls["renamed"])
    assert renamed_loops(spec) == {"for-loop-1": "renamed"}
    with pytest.raises(RehearsalError) as failed:
        rehearse_kubeflow(loop_yamls["renamed"], str(tmp_path / "r15"), {},
                          pipeline_root=kubeflow_demo.ROOT, backend="2.15")
    for named in ("'for-loop-1'", "'renamed'", "2.15", "#13239"):
        assert named in str(failed.value)
    report = json.loads((tmp_path / "r15" / "rehearsal.json").read_text())
    states = {r["display_name"]: (r["state"], r["note"]) for r in report}
    assert states["renamed"][0] == "succeeded" and "recorded as 'renamed'" in states[
        "renamed"][1]
    assert states["total"][0] == "failed"  # its driver: the producer is not found
    summary = rehearse_kubeflow(loop_yamls["renamed"], str(tmp_path / "r16"), {},
                                pipeline_root=kubeflow_demo.ROOT, backend="2.16")
    assert summary["outputs"]["Output"] == 2 and summary["rehearsal"]["backend"] == "2.16"
    assert renamed_loops(load(loop_yamls[None])[0]) == {}
    for backend in ("2.15", "2.17"):
        summary = rehearse_kubeflow(loop_yamls[None], str(tmp_path / backend), {"xs": "[1]"},
                                    pipeline_root=kubeflow_demo.ROOT, backend=backend)
        assert summary["outputs"]["Output"] == 2


def test_the_kubeflow_tuning_variants_loop_is_shown_under_its_key(tmp_path):
    """The tuning pipelines' trial loop carries no name, so a 2.14/2.15 backend finds it."""
    import compile as compile_cli

    assert compile_cli.main(["--target", "kubeflow", "--output-dir", str(tmp_path),
                             "--tune-trials", "2", "--tune-parallel-trials", "2",
                             "--pipelines", "text_tuning_pipeline"]) == 0
    spec, _ = load(str(tmp_path / "text_tuning_pipeline.yaml"))
    loops = {key: task for c in [spec["root"], *spec["components"].values()]
             for key, task in c.get("dag", {}).get("tasks", {}).items()
             if "parameterIterator" in task}
    assert len(loops) == 1 and renamed_loops(spec) == {}
    ((key, loop),) = loops.items()
    assert loop["taskInfo"]["name"] == key


@dsl.component(base_image=LOCAL_IMAGE, install_kfp_package=False)
def prepare(data: dsl.Output[dsl.Dataset]):
    import os

    os.makedirs(data.path, exist_ok=True)
    with open(os.path.join(data.path, "rows.txt"), "w") as f:
        f.write("3")


@dsl.component(base_image=LOCAL_IMAGE, install_kfp_package=False)
def resumable_train(data: dsl.Input[dsl.Dataset], run_id: str) -> str:
    """A trainer in miniature: its first phase's checkpoint goes to the object store
    (AIP_CHECKPOINT_DIR, the run's id below it); a pod that finds it resumes there."""
    import os
    import time

    from components.common.storage import filesystem

    with open(os.path.join(data.path, "rows.txt")) as f:
        rows = f.read()
    fs, root = filesystem(f"{os.environ['AIP_CHECKPOINT_DIR']}/{run_id}")
    if fs.exists(f"{root}/phase1.done"):
        return f"resumed after phase 1 of {rows} rows"
    fs.pipe(f"{root}/phase1.done", b"done")
    time.sleep(120)  # phase 2: its pod is deleted before it ends
    return "ran whole"


def _retry_pipeline(endpoint):
    @dsl.pipeline(name="kubeflow-retry-probe")
    def retried() -> str:
        data = prepare()
        train = resumable_train(data=data.outputs["data"], run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        train.set_retry(num_retries=2)  # not for a deleted pod: Argo's OnFailure
        train.set_env_variable("AIP_CHECKPOINT_DIR", "s3://checkpoints/retry")
        train.set_env_variable("AWS_ENDPOINT_URL_S3", endpoint)
        kubernetes.use_secret_as_env(train, secret_name=kubeflow_demo.SECRET,
                                     secret_key_to_env={k: k for k in kubeflow_demo.CREDENTIALS})
        return train.output

    return retried


def test_a_deleted_pod_is_not_retried_and_a_run_retry_resumes_it(store, tmp_path, capsys):
    """--delete-pod: the training pod deleted after its first checkpoint ends Error, which
    the retry policy does not retry, and the run fails. --retry-run (KFP's run retry): the
    same run id, `prepare` kept (not run again, its output reused), the training step run
    again in a new pod, which finds its checkpoint and resumes."""
    kubeflow_demo.make_bucket("s3://checkpoints")
    path, out = str(tmp_path / "retry.yaml"), str(tmp_path / "r")
    compiler.Compiler().compile(_retry_pipeline(store), path)
    secret = [f"--secret={kubeflow_demo.SECRET}={k}={v}"
              for k, v in kubeflow_demo.CREDENTIALS.items()]
    assert main([path, "--output", out, "--pipeline-root", kubeflow_demo.ROOT, *secret,
                 "--delete-pod", "resumable-train=checkpoints/retry/*/phase1.done"]) == 1
    assert "ended Error" in capsys.readouterr().err
    first = {r["display_name"]: r for r in json.loads((tmp_path / "r" / "rehearsal.json")
                                                      .read_text())}
    train = first["resumable-train"]
    assert train["state"] == "failed" and train["attempts"] == 1  # two retries left, unused
    assert "ended Error (pod deleted with its node" in train["note"]
    assert "not retried" in train["note"]
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["state"] == "failed" and run["tasks"]["resumable-train"]["phase"] == "Error"
    assert ObjectStore().matches(f"checkpoints/retry/{run['run_id']}/phase1.done")
    with pytest.raises(RehearsalError, match="no rehearsed run"):
        retry_kubeflow(str(tmp_path / "none"))

    assert main(["--retry-run", "--output", out, *secret]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["outputs"]["Output"] == "resumed after phase 1 of 3 rows"
    rehearsal = summary["rehearsal"]
    assert rehearsal["run_id"] == run["run_id"] and rehearsal["retries"] == 1
    tasks = {t["display_name"]: t for t in rehearsal["tasks"]}
    assert tasks["prepare"]["attempts"] == 0 and tasks["prepare"]["note"].startswith("kept")
    assert tasks["resumable-train"]["attempts"] == 1
    logs = tmp_path / "r" / "logs"
    assert sorted(p.name for p in (logs / "prepare").iterdir()) == ["attempt1.log"]
    assert sorted(p.name for p in (logs / "resumable-train").iterdir()) == [
        "attempt1.log", "retry1-attempt1.log"]
    again = json.loads((tmp_path / "r" / "run.json").read_text())
    # the driver had run: the retried step writes where the deleted pod would have
    assert again["tasks"]["resumable-train"]["task_root"] == run["tasks"][
        "resumable-train"]["task_root"]
    with pytest.raises(RehearsalError, match="succeeded: KFP retries only a failed run"):
        retry_kubeflow(out)


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
    # This small model's epoch takes ~0.2 s: with the demo's 4 epochs the first attempt
    # could finish before the kill (polled every 0.2 s) saw its first checkpoint.
    epochs = 12
    with kubeflow_demo.mlflow_server(str(tmp_path / "mlflow")) as tracking:
        summaries = kubeflow_demo.rehearse_both(
            build, str(tmp_path), tracking,
            image_params={"weights": weights, "epochs": str(epochs)})
        client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
        image = client.get_model_version_by_alias("pets", "challenger")
        text = client.get_model_version_by_alias("Docstring Packages", "challenger")

    tasks = {t["display_name"]: t for t in summaries["image"]["rehearsal"]["tasks"]}
    train = tasks["train-densenet121"]
    assert train["attempts"] == 2 and "container stopped (SIGTERM)" in train["note"]
    logs = tmp_path / "image" / "logs" / "train-image-classifier"
    first, second = (logs / "attempt1.log").read_text(), (logs / "attempt2.log").read_text()
    last = f"head epoch {epochs - 1}:"
    assert "head epoch 0:" in first and last not in first  # stopped mid-training
    assert "belongs to this run: finished work is reused" in second
    assert "head epoch 0:" not in second and last in second  # resumed, then finished
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
