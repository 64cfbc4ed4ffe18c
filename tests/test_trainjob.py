"""The TrainJob past one pod on Kubeflow: its manifest (read back through Trainer 2.3's
models), the node environment, and the launcher against a loopback stub of the Kubernetes
API (`tests.kube_stub`) through the real `kubernetes` client."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import threading
import time

import pydantic
import pytest

from components.train_transformer import launch
from components.trainjob import contract as node
from components.trainjob import launcher, spec
from tests.kube_stub import KubeStub, Plan, condition, serving

NS = "kubeflow-user"
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
               {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                "effect": "NoSchedule"}]
SELECTOR = {"nvidia.com/gpu.product": "Tesla-T4", "cloud.google.com/gke-spot": "true"}
FAST = launcher.Timing(poll_seconds=0.02, clear_seconds=5, log_grace_seconds=5)


def full_manifest(name: str = "", **changes) -> dict:
    """2 nodes x 2 processes with every setting the launcher step gives; `changes` of the
    nodes (`spec.Nodes`) or of the job."""
    nodes = {field.name for field in dataclasses.fields(spec.Nodes)}
    settings = spec.Nodes(**{
        "num_nodes": 2, "procs_per_node": 2, "gpus": 2, "cpu": "14.1", "memory": "48Gi",
        "shm": "12Gi", "storage_secret": "s3-keys", "node_selector": SELECTOR,
        "tolerations": TOLERATIONS, "image_pull_secrets": ["regcred"],
        "service_account": "pipeline-runner", "deadline_seconds": 604800,
        "image": "europe-docker.pkg.dev/p/r/fastai:abc1234",
        **{key: value for key, value in changes.items() if key in nodes}})
    job = dict(
        name=name or spec.trainjob_name("run-7f3a", "train-transformer-classifier", 0),
        namespace=NS, command=["python", "-m", "node_entry_point"], args=["--epochs", "2"],
        env={"AIP_CHECKPOINT_DIR": "s3://bucket/run/checkpoints", "KFP_STORAGE": "0"},
        labels={"vertex-gpu-pipelines/run": "run-7f3a", "vertex-gpu-pipelines/task": "train"},
        owner_pod="train-transformer-launcher-pod",
        owner_uid="0b1c2d3e-0000-1111-2222-333344445555")
    job.update({key: value for key, value in changes.items() if key not in nodes})
    return spec.trainjob_manifest(settings, **job)


def _pod_patch(manifest: dict) -> dict:
    [patch] = manifest["spec"]["runtimePatches"]
    [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return job["template"]["spec"]["template"]


def test_trainjob_manifest_two_nodes_two_procs_every_setting():
    from kubeflow_trainer_api import models

    manifest = full_manifest()
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert manifest["kind"] == "TrainJob"
    meta = manifest["metadata"]
    assert meta["namespace"] == NS and meta["labels"]["vertex-gpu-pipelines/task"] == "train"
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod",
                                        "name": "train-transformer-launcher-pod",
                                        "uid": "0b1c2d3e-0000-1111-2222-333344445555"}]
    assert manifest["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org",
                                              "kind": "ClusterTrainingRuntime",
                                              "name": "torch-distributed"}
    assert manifest["spec"]["activeDeadlineSeconds"] == 604800
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
    amounts = {"cpu": "14.1", "memory": "48Gi", "nvidia.com/gpu": "2"}
    assert trainer["resourcesPerNode"] == {"requests": amounts, "limits": amounts}
    assert trainer["image"].endswith("fastai:abc1234") and trainer["args"] == ["--epochs", "2"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer["env"]}
    assert env == {"AIP_CHECKPOINT_DIR": "s3://bucket/run/checkpoints", "KFP_STORAGE": "0",
                   "EXPECTED_GPU_COUNT": "2",
                   **{key: {"secretKeyRef": {"name": "s3-keys", "key": key}}
                      for key in spec.S3_SECRET_KEYS}}
    pod = _pod_patch(manifest)
    assert pod["metadata"]["labels"] == {**meta["labels"], spec.ISTIO_INJECT: "false"}
    assert pod["spec"]["nodeSelector"] == SELECTOR
    assert pod["spec"]["tolerations"] == TOLERATIONS
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["serviceAccountName"] == "pipeline-runner"
    assert pod["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                     "sizeLimit": "12Gi"}}]
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "dshm", "mountPath": "/dev/shm"}]}]
    # Read back through Trainer 2.3's models: every field survives, typed.
    job = models.TrainerV1alpha1TrainJob.from_dict(manifest)
    assert job.to_dict() == manifest
    assert job.spec.trainer.num_nodes == 2 and job.spec.runtime_patches[0].manager == \
        spec.DEFAULT_MANAGER
    spec.validate_manifest(manifest)


def test_trainjob_manifest_without_gpus_or_shm_sets_neither():
    manifest = full_manifest(gpus=0, shm="", procs_per_node=None, storage_secret="",
                             owner_pod="", owner_uid="")
    trainer = manifest["spec"]["trainer"]
    assert trainer["numProcPerNode"] == 1  # not Trainer's auto: a CPU node's CPUs
    assert full_manifest(procs_per_node=None)["spec"]["trainer"]["numProcPerNode"] == 2  # GPUs
    assert "nvidia.com/gpu" not in trainer["resourcesPerNode"]["limits"]
    assert [e["name"] for e in trainer["env"]] == ["AIP_CHECKPOINT_DIR", "KFP_STORAGE"]
    assert "volumes" not in _pod_patch(manifest)["spec"]
    assert "ownerReferences" not in manifest["metadata"]


@pytest.mark.parametrize("where, key, value, error, words", [
    (("spec",), "podTemplateOverrides", [{"targetJobs": [{"name": "node"}]}],  # Trainer 2.1
     spec.ManifestError, r"\.spec\.podTemplateOverrides: not a field"),
    (("spec", "trainer"), "nodeSelector", {"a": "b"},  # a pod field at the wrong level
     spec.ManifestError, r"\.spec\.trainer\.nodeSelector: not a field"),
    (("metadata",), "label", {"a": "b"}, spec.ManifestError, r"\.metadata\.label: not a field"),
    (("spec", "trainer"), "numNodes", "2", pydantic.ValidationError, "numNodes"),  # a type
    ((), "apiVersion", "kubeflow.org/v1", spec.ManifestError,
     "not a trainer.kubeflow.org/v1alpha1"),
])
def test_trainjob_validation_refuses_what_trainer_2_3_does_not_take(where, key, value, error,
                                                                     words):
    manifest = copy.deepcopy(full_manifest())
    target = manifest
    for part in where:
        target = target[part]
    target[key] = value
    with pytest.raises(error, match=words):
        spec.validate_manifest(manifest)


@pytest.mark.parametrize("changes, words", [
    ({"env": {"PET_NNODES": "2"}}, "Trainer's torch runtime sets these"),
    ({"env": {"AWS_ACCESS_KEY_ID": "x"}}, "given more than once"),
    ({"cpu": "lots"}, "not a Kubernetes quantity"),
    ({"shm": "12 GB"}, "not a Kubernetes quantity"),
    ({"num_nodes": 0}, "must be >= 1"),
    ({"procs_per_node": 0}, "must be >= 1"),
    ({"deadline_seconds": 0}, "deadline_seconds must be >= 1"),
    ({"name": "Train_Job"}, "DNS-1035"),
    ({"name": "a" * 56}, "too long for 2 nodes"),
    ({"labels": {"run": "x" * 64}}, "not a Kubernetes label value"),
    ({"owner_uid": ""}, "go together"),
    ({"manager": "launcher"}, "domain-prefixed path"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerate": True}]},
     "tolerate: not a field"),
])
def test_trainjob_manifest_refuses_what_the_api_would(changes, words):
    with pytest.raises(spec.ManifestError, match=words):
        full_manifest(**changes)


def test_trainjob_name_is_a_short_dns_label_per_run_task_and_attempt():
    name = spec.trainjob_name("run-7f3a", "train-transformer-classifier", 0)
    assert name == spec.trainjob_name("run-7f3a", "train-transformer-classifier", 0)
    others = {spec.trainjob_name("run-7f3a", "train-transformer-classifier", 1),
              spec.trainjob_name("run-7f3b", "train-transformer-classifier", 0),
              spec.trainjob_name("run-7f3a", "train-transformer-tuned", 0),
              spec.trainjob_name("run-7f3a", "train-transformer-classifier", "pod-abc"),
              spec.trainjob_name("run-7f3a", "train-transformer-classifier", "pod-abd")}
    assert len(others | {name}) == 6
    for made in (*others, name, spec.trainjob_name("r", "9 Ünïcode_TASK " * 9, 12345),
                 spec.trainjob_name("r", "---", 0)):
        assert spec.DNS_1035.match(made) and len(made) <= spec.MAX_NAME, made
    assert name.startswith("tj-train-transformer") and name.endswith("-a0")
    with pytest.raises(spec.ManifestError):
        spec.trainjob_name("", "task", 0)
    with pytest.raises(spec.ManifestError):
        spec.trainjob_name("run", "task", -1)


# -- the node environment ------------------------------------------------------------------
PET = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
       "PET_MASTER_ADDR": "tj-x-node-0-0.tj-x", "PET_MASTER_PORT": "29500"}


def test_trainjob_node_environment_maps_onto_what_the_trainer_reads():
    mapped = node.torchrun_environment(PET)
    assert mapped == {"MASTER_ADDR": "tj-x-node-0-0.tj-x", "MASTER_PORT": "29500",
                      "WORLD_SIZE": "2", "RANK": "1"}
    assert tuple(mapped) == launch.TORCHRUN_VARIABLES
    cluster = launch.cluster_from_environment({**PET, **mapped})
    assert cluster == launch.Cluster("tj-x-node-0-0.tj-x", 29500, 2, 1)
    assert node.torchrun_environment({"HOME": "/root"}) == {}  # not a Trainer node
    assert node.torchrun_environment({**PET, "MASTER_PORT": "29500"}) == mapped  # agrees


@pytest.mark.parametrize("environ, words", [
    ({**PET, "PET_NODE_RANK": ""}, "PET_NODE_RANK missing or empty"),
    ({"PET_NNODES": "2"}, "PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT"),
    ({**PET, "PET_NODE_RANK": "2"}, "not within PET_NNODES=2"),
    ({**PET, "PET_NNODES": "two"}, "PET_NNODES='two' must be a whole number >= 1"),
    ({**PET, "PET_NODE_RANK": "\u00b2"}, "PET_NODE_RANK="),
    ({**PET, "PET_MASTER_PORT": "70000"}, "not a port"),
    ({**PET, "PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE='0'"),
    ({**PET, "WORLD_SIZE": "4"}, "WORLD_SIZE='4'"),
])
def test_trainjob_node_environment_names_what_is_missing_or_bad(environ, words):
    with pytest.raises(node.NodeEnvironmentError, match=words):
        node.torchrun_environment(environ)


def test_trainjob_node_processes_auto_is_one_per_gpu():
    auto = {**PET, "PET_NPROC_PER_NODE": "auto"}
    assert node.torchrun_environment(auto)["WORLD_SIZE"] == "2"
    assert node.processes_per_node(auto, gpus=4) == 4
    assert node.processes_per_node(auto, gpus=0) == 1
    assert node.processes_per_node(PET, gpus=0) == 2  # 2 CPU processes (gloo)
    assert node.processes_per_node({}, gpus=2) == 2


# -- the launcher against a loopback Kubernetes API ---------------------------------------
def _name_of(manifest: dict) -> str:
    return manifest["metadata"]["name"]


def _job_path(name: str) -> str:
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/{name}"


def _planned(stub, **plan) -> tuple[dict, str]:
    """The full manifest and its name, the stub's `Plan(**plan)` for that job."""
    manifest = full_manifest()
    stub.plans[_name_of(manifest)] = Plan(**plan)
    return manifest, _name_of(manifest)


# the job's conditions never end (in the tests' time): only its pods or a stop can end it
UNENDING = [[]] * 500 + [[condition("Complete", "X", "late")]]


def test_trainjob_launcher_follows_a_job_to_complete_streams_node0_and_deletes_it(kube):
    stub, api = kube
    done = condition("Complete", "JobsCompleted", "jobset completed")
    manifest, name = _planned(stub, conditions=[[], [], [done]],
                              log=["epoch 1 loss 0.9", "epoch 2 loss 0.5", "saved the model"])
    lines: list[str] = []
    job = launcher.launch(api, manifest, write=lines.append, timing=FAST)
    assert launcher.job_outcome(job) == ("Complete", "JobsCompleted", "jobset completed")
    [create] = stub.calls("POST")
    assert create[1] == f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"
    assert create[3] == manifest  # what was built is what was sent
    query = stub.calls("GET", "/log")[0][2]  # the client writes True; Go's ParseBool takes it
    assert query["container"] == "node" and query["follow"].lower() == "true"
    pods = {r[2]["labelSelector"] for r in stub.calls("GET", "/pods") if "/log" not in r[1]}
    assert pods == {launcher.node0_selector(name), f"{launcher.JOBSET_NAME_LABEL}={name}"}
    assert create[2]["fieldValidation"] == "Strict"
    log = lines.index("epoch 1 loss 0.9")
    assert lines[log:log + 3] == ["epoch 1 loss 0.9", "epoch 2 loss 0.5", "saved the model"]
    [delete] = stub.calls("DELETE")
    assert delete[1] == _job_path(name) and delete[2]["propagationPolicy"] == "Foreground"
    assert lines[-1] == f"[launcher] TrainJob {NS}/{name} deleted"
    assert stub.requests.index(delete) > stub.requests.index(create)


def test_trainjob_launcher_fails_with_the_jobs_reason_and_deletes_it(kube):
    stub, api = kube
    manifest, name = _planned(
        stub, conditions=[[], [condition("Failed", "FailedJobs",
                                   "jobset failed: job node-0 failed: BackoffLimitExceeded")]],
        log=["Traceback (most recent call last):", "RuntimeError: CUDA out of memory"])
    lines: list[str] = []
    with pytest.raises(launcher.TrainJobFailed,
                       match=rf"TrainJob {NS}/{name} failed: FailedJobs: jobset failed"):
        launcher.launch(api, manifest, write=lines.append, timing=FAST)
    assert "RuntimeError: CUDA out of memory" in lines  # node 0's error, in the step's log
    assert [r[1] for r in stub.calls("DELETE")] == [_job_path(name)]
    assert (NS, name) in stub.lingering or (NS, name) not in stub.jobs


def _terminated(code: int, reason: str) -> dict:
    return {"terminated": {"exitCode": code, "reason": reason}}


def _container(state: dict, restarts: int = 0, last: dict | None = None) -> dict:
    return {"containerStatuses": [{"name": "node", "image": "i", "imageID": "", "ready": False,
                                   "restartCount": restarts, "state": state,
                                   "lastState": last or {}}]}


UNSCHEDULABLE = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}


@pytest.mark.parametrize("status, words", [
    # JobSet's OnFailure: the container restarted in place, its pod still Running
    ({"phase": "Running", **_container({"running": {}}, 1, _terminated(137, "OOMKilled"))},
     r"node 1 \(pod tj-\S+-node-0-1-x7k2q\): its container 'node' was restarted in place "
     r"\(1 time\(s\)\) after it ended with exit code 137 \(OOMKilled\)"),
    ({"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."},
     r"node 1 .*its pod failed: Evicted: The node was low on memory\."),
    ({"phase": "Failed", **_container(_terminated(137, "OOMKilled"))},
     r"node 1 .*its pod failed: exit code 137 \(OOMKilled\)"),
    ({"phase": "Pending", **_container({"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "img:nope"'}})},
     r"node 1 .*cannot start: ImagePullBackOff: Back-off pulling image \"img:nope\""),
    ({"phase": "Pending", **_container({"waiting": {
        "reason": "CreateContainerConfigError",
        "message": "couldn't find key AWS_ACCESS_KEY_ID in Secret kubeflow-user/s3-keys"}})},
     r"node 1 .*cannot start: CreateContainerConfigError: couldn't find key AWS_ACCESS_KEY_ID "
     "in Secret kubeflow-user/s3-keys"),
    (UNSCHEDULABLE, r"node 1 .*unschedulable for \d+ s \(pending_seconds 0\.1\): 0/3 nodes "
                    r"are available: 3 Insufficient nvidia\.com/gpu\."),
])
def test_trainjob_launcher_fails_at_once_on_a_node_pods_failure_and_deletes_the_job(
        kube, status, words):
    stub, api = kube
    manifest, name = _planned(stub, conditions=UNENDING, pods={1: status})
    with pytest.raises(launcher.TrainJobFailed, match=rf"TrainJob {NS}/{name} failed: {words}"):
        launcher.launch(api, manifest, write=lambda line: None,
                        timing=dataclasses.replace(FAST, pending_seconds=0.1))
    assert len(stub.calls("GET", _job_path(name))) < 50
    assert [r[1] for r in stub.calls("DELETE")] == [_job_path(name)]


def test_trainjob_launcher_waits_for_an_unschedulable_node_up_to_the_bound(kube):
    stub, api = kube
    manifest, name = _planned(stub, conditions=[[]] * 5 + [[condition("Complete", "X", "done")]],
                              pods={1: UNSCHEDULABLE})  # a GPU machine being added meanwhile
    job = launcher.launch(api, manifest, write=lambda line: None, timing=FAST)
    assert launcher.job_outcome(job)[0] == "Complete"
    assert launcher.Timing().pending_seconds == 900.0  # 15 minutes unless told otherwise


def _pod(uid: str, phase: str = "Running", reason=None, deleting=None, labels=None):
    """A pod `p-<uid>` as the kubernetes client reads it."""
    from kubernetes.client import V1ObjectMeta, V1Pod, V1PodStatus

    return V1Pod(metadata=V1ObjectMeta(name=f"p-{uid}", uid=uid, labels=labels,
                                       deletion_timestamp=deleting),
                 status=V1PodStatus(phase=phase, reason=reason))


def test_trainjob_launcher_fails_when_a_nodes_pod_is_replaced():
    node1 = {launcher.COMPLETION_INDEX_LABEL: "1"}
    seen: dict = {}
    assert launcher.node_problem([_pod("a", labels=node1)], seen, 0.0, 900.0) == ""
    assert "node 1 (pod p-b) replaced the node's first pod" in launcher.node_problem(
        [_pod("b", labels=node1)], seen, 1.0, 900.0)


def test_trainjob_launcher_creates_strictly_so_an_older_trainer_refuses_a_field():
    from kubernetes import client

    args = (spec.GROUP, spec.VERSION, NS, spec.PLURAL, full_manifest())
    older = ("spec.runtimePatches", "spec.activeDeadlineSeconds")  # Trainer 2.1 has neither
    with serving(KubeStub(unknown_fields=older)) as (stub, api):
        custom = client.CustomObjectsApi(api)
        with pytest.raises(client.ApiException) as refused:
            custom.create_namespaced_custom_object(*args, field_validation="Strict")
        assert refused.value.status == 400 and stub.jobs == {}
        assert 'unknown field "spec.runtimePatches", unknown field ' \
               '"spec.activeDeadlineSeconds"' in json.loads(refused.value.body)["message"]
        # the server's default (Warn) prunes them: the job would run without
        assert "runtimePatches" not in custom.create_namespaced_custom_object(*args)["spec"]
    with serving(KubeStub(unknown_fields=older[:1])) as (stub, api):
        with pytest.raises(launcher.TrainJobError, match=r'unknown field "spec.runtimePatches" '
                           r"\(strict field validation: does the cluster run Trainer 2.3\?\)"):
            launcher.launch(api, full_manifest(), write=lambda line: None, timing=FAST)
        assert stub.jobs == {}


def test_trainjob_launcher_cancelled_by_the_stop_event_deletes_the_job(kube):
    stub, api = kube
    manifest, name = _planned(stub, conditions=UNENDING)
    stop = threading.Event()
    lines: list[str] = []

    def write(line: str) -> None:
        lines.append(line)
        if "created" in line:
            stop.set()  # as if cancelled once the job runs

    with pytest.raises(launcher.TrainJobCancelled):
        launcher.launch(api, manifest, stop=stop, write=write, timing=FAST)
    assert [r[1] for r in stub.calls("DELETE")] == [_job_path(name)]
    assert len(stub.calls("GET", _job_path(name))) < 500


def test_trainjob_launcher_deletes_the_job_on_sigterm_and_restores_the_handler(kube):
    stub, api = kube
    manifest, name = _planned(stub, conditions=UNENDING)
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        deleted_in_the_handler = []

        def write(line: str) -> None:
            if "created" in line:
                os.kill(os.getpid(), signal.SIGTERM)  # KFP stops the launcher's pod
                # the handler has run: Argo's emissary leaves the step a second, not 30 s
                deleted_in_the_handler.append([r[1] for r in stub.calls("DELETE")])

        with pytest.raises(launcher.TrainJobCancelled):
            launcher.launch(api, manifest, write=write, timing=FAST)
        assert caught == []  # the launcher's handler took it
        assert deleted_in_the_handler == [[_job_path(name)]]
        assert [r[1] for r in stub.calls("DELETE")] == [_job_path(name)]  # and only then
        os.kill(os.getpid(), signal.SIGTERM)
        assert caught == [signal.SIGTERM]  # and gave the old one back
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_trainjob_node0_deletes_the_job_once_the_launcher_pod_no_longer_runs(kube, tmp_path):
    from components.train_transformer import node as train_node

    stub, api = kube
    manifest = full_manifest()
    name, [owner] = _name_of(manifest), manifest["metadata"]["ownerReferences"]
    stub.add_job(NS, manifest)
    stub.add_pod(NS, owner["name"], owner["uid"])  # Running
    environ = {**dict(zip(launcher.OWNER_VARIABLES, (name, NS, owner["name"], owner["uid"]))),
               launcher.OWNER_POLL_VARIABLE: "0.02", "PET_NODE_RANK": "0",
               "KUBECONFIG": stub.write_kubeconfig(str(tmp_path / "kubeconfig"))}
    assert train_node.watch_owner({**environ, "PET_NODE_RANK": "1"}) is None  # node 0 only
    assert train_node.watch_owner({"PET_NODE_RANK": "0"}) is None  # no owner: outside KFP
    watch = train_node.watch_owner(environ)
    time.sleep(0.3)
    assert watch.is_alive() and stub.calls("DELETE") == []  # the launcher runs
    # a KFP terminate or a step deadline: the pod object stays, no longer running
    stub.set_phase(NS, owner["name"], "Failed")
    watch.join(10)
    assert not watch.is_alive()
    assert [r[1] for r in stub.calls("DELETE")] == [_job_path(name)]
    reads = [r[2] for r in stub.calls("GET", "/pods")]
    assert reads and {q["fieldSelector"] for q in reads} == {f"metadata.name={owner['name']}"}
    assert launcher.Timing().poll_seconds < launcher.OWNER_POLL_SECONDS == 30.0


def test_trainjob_owner_stopped_names_how():
    assert launcher.owner_stopped([_pod("u")], "u") == ""
    assert launcher.owner_stopped([_pod("u", "Failed", "DeadlineExceeded")], "u") == \
        "is Failed (DeadlineExceeded)"
    assert launcher.owner_stopped([_pod("u", deleting="2026-11-27T10:00:00Z")], "u") == \
        "is being deleted"
    assert launcher.owner_stopped([_pod("another")], "u") == "is gone"  # a new pod of its name
    assert launcher.owner_stopped([], "u") == "is gone"


def test_trainjob_launcher_clears_a_job_left_by_an_earlier_attempt_before_creating(kube):
    stub, api = kube
    manifest = full_manifest()
    name = _name_of(manifest)
    earlier = full_manifest(name=spec.trainjob_name("run-7f3a", "train-transformer-classifier",
                                                    "earlier-pod"))
    for job in (manifest, earlier):
        stub.add_job(NS, job)
        stub.plans[_name_of(job)] = Plan(linger=3)  # foreground: gone after its pods
    stub.plans[name].conditions = [[condition("Complete", "JobsCompleted", "done")]]
    lines: list[str] = []
    launcher.launch(api, manifest, write=lines.append, timing=FAST,
                    task_selector="vertex-gpu-pipelines/task=train")
    methods = [(r[0], r[1]) for r in stub.requests if "trainjobs" in r[1]]
    create = methods.index(("POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}"
                                    "/trainjobs"))
    deletes = [m for m in methods[:create] if m[0] == "DELETE"]
    assert sorted(deletes) == sorted([("DELETE", _job_path(name)),
                                      ("DELETE", _job_path(_name_of(earlier)))])
    # both were read as gone (404) before the new job was created: never two at once
    before = stub.requests.index(stub.calls("POST")[0])
    gone = {r[1] for r, code in zip(stub.requests[:before], stub.codes[:before])
            if r[0] == "GET" and code == 404}
    assert {_job_path(name), _job_path(_name_of(earlier))} <= gone
    assert any("left from an earlier attempt" in line for line in lines)
    assert len(stub.calls("POST")) == 1 and len(stub.calls("DELETE")) == 3


def test_trainjob_launcher_refuses_to_wait_forever_for_a_job_that_will_not_go(kube):
    stub, api = kube
    manifest = full_manifest()
    stub.add_job(NS, manifest)
    stub.plans[_name_of(manifest)] = Plan(linger=10**6)  # a finalizer nobody removes
    with pytest.raises(launcher.TrainJobError, match="still there"):
        launcher.launch(api, manifest, write=lambda line: None,
                        timing=launcher.Timing(poll_seconds=0.02, clear_seconds=0.2))
    assert stub.calls("POST") == []
