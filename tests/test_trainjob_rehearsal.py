"""The TrainJob node contract rehearsed (issue 57, item 4): the launcher's TrainJob played
here as Trainer 2.3's `torch-distributed` runtime runs it (`tools.rehearsal.trainjob`), its
nodes the real `python -m components.train_transformer.node` (CPU, gloo, two processes a
node) against S3 on loopback, through the Kubernetes API stub (`tests.kube_stub`).

A node killed after the first sealed checkpoint fails the launcher; its retry's new job
resumes from that checkpoint and registers the model as the one-pod path does. A cancelled
launcher's nodes are stopped within a one-second grace. `pytest -k trainjob` runs these.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from components.train_transformer import multinode
from components.train_transformer.node import MODEL_ROOT, copy_folder
from components.trainjob import launcher
from components.trainjob.contract import torchrun_environment
from tools.rehearsal import kubeflow_demo
from tools.rehearsal.launcher import ObjectStore
from tools.rehearsal.records import RehearsalError
from tools.rehearsal.trainjob import (
    BACKOFF_LIMIT,
    COMPLETE,
    DELETED,
    FAILED,
    TrainJobRun,
    container_env,
)

ROOT = "s3://checkpoints/root"
NS = "rehearsal"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The launcher's polling here: a tiny model's epoch takes well under a second.
TIMING = launcher.Timing(poll_seconds=0.2, clear_seconds=30, log_grace_seconds=5)
# The launcher step in a process of its own (a pod), so that a test can signal it.
LAUNCHER = """
import json, sys
from kubernetes import client
from components.trainjob import launcher
configuration = client.Configuration()
configuration.host = sys.argv[1]
launcher.launch(client.ApiClient(configuration), json.loads(sys.argv[2]),
                timing=launcher.Timing(poll_seconds=0.2))
"""
SECRETS = {kubeflow_demo.SECRET: dict(kubeflow_demo.CREDENTIALS)}
TASK = "train-transformer"
# The tiny BERT from scratch at test_train_transformer's settings; a checkpoint each epoch.
CONFIG = {"model_name": "s3://datasets/encoders/tiny", "epochs": 3, "batch_size": 8,
          "learning_rate": 1e-3, "max_length": 48, "early_stopping_patience": 0}

# Put on the nodes' PYTHONPATH as sitecustomize.py, so that every process of a node (torch's
# spawned workers too) records the checkpoint files it reads (`TRAINJOB_AUDIT`), and, where
# `TRAINJOB_HOLD` is set, a worker stops at its second checkpoint (its os.makedirs of the
# folder, before it saves its part there) until it is killed: the job can then seal its
# first checkpoint and no other, however fast or slow this machine is when the kill lands.
HOOK = r'''
import json, os, re, sys, time

_audit_folder = os.environ.get("TRAINJOB_AUDIT")
_hold = os.environ.get("TRAINJOB_HOLD") == "1"
_checkpoint = re.compile(r"/checkpoint-(\d+)(?:/([^/]+))?$")
_seen = set()
_busy = []


def _audit(event, args):
    if _busy or event not in ("open", "os.mkdir") or not os.environ.get("RANK"):
        return
    if not isinstance(args[0], (str, bytes)):
        return
    found = _checkpoint.search(os.fsdecode(args[0]))
    if not found:
        return
    _busy.append(1)
    try:
        if event == "os.mkdir" and _hold:
            _seen.add(found.group(1))
            if len(_seen) > 1:
                time.sleep(3600)
        if event == "open" and _audit_folder and found.group(2):
            flags = args[2] if isinstance(args[2], int) else 0
            if not flags & (os.O_WRONLY | os.O_RDWR):
                with open(os.path.join(_audit_folder, f"{os.getpid()}.jsonl"), "a") as f:
                    f.write(json.dumps({"node": os.environ.get("PET_NODE_RANK"),
                                        "rank": os.environ["RANK"],
                                        "step": int(found.group(1)),
                                        "file": found.group(2)}) + "\n")
    finally:
        _busy.clear()


sys.addaudithook(_audit)
'''


def _manifest(command, args=(), num_nodes=2, secret=kubeflow_demo.SECRET, deadline=None):
    from components.trainjob import spec

    nodes = spec.Nodes(num_nodes=num_nodes, procs_per_node=2, gpus=0, cpu="1", memory="1Gi",
                       storage_secret=secret, image="img", deadline_seconds=deadline)
    return spec.trainjob_manifest(nodes, name="tj-probe", namespace="ns", command=command,
                                  args=args, env={"OBJECT_STORE_MOUNTED": "0"})


@pytest.fixture
def cluster(kube):
    """The stub of the Kubernetes API (a test sets its `play`), and a client of it."""
    yield kube
    for job in list(kube[0].played.values()):
        job.delete()  # no node left running, whatever the test's end


def test_trainjob_rehearsal_gives_each_node_what_trainer_gives_and_no_more(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-launchers-own")
    monkeypatch.setenv("RANK", "7")
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    run = TrainJobRun(_manifest(["python", "-c", code]), str(tmp_path), SECRETS)
    run.start()
    assert run.wait(120).state == COMPLETE
    envs = [json.loads(run.log(i).strip().splitlines()[-1]) for i in (0, 1)]
    for index, env in enumerate(envs):
        assert {k: env[k] for k in env if k.startswith("PET_")} == {
            "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": envs[0]["PET_MASTER_PORT"]}
        # the secret's keys, not the launcher's credentials nor its torchrun variables
        assert env["AWS_SECRET_ACCESS_KEY"] == "rehearsal" and "RANK" not in env
        assert env["OBJECT_STORE_MOUNTED"] == "0"
        assert env["TMPDIR"] == str(tmp_path / f"node-{index}" / "tmp")
        # the node contract reads this environment
        assert torchrun_environment(env)["RANK"] == str(index)
    with pytest.raises(RehearsalError, match="secret 'absent'.*would not start"):
        container_env(_manifest(["true"], secret="absent")["spec"]["trainer"], SECRETS)


def test_trainjob_rehearsal_restarts_a_failed_node_in_place_as_jobset_does(tmp_path):
    code = ("import os, sys, time\n"
            "if os.environ['PET_NODE_RANK'] == '1': sys.exit(3)\n"
            "time.sleep(600)\n")
    run = TrainJobRun(_manifest(["python", "-c", code]), str(tmp_path), SECRETS)
    run.start()
    outcome = run.wait(120)
    # restartPolicy OnFailure, backoffLimit 6: the seventh failure fails the job
    assert outcome.state == FAILED and outcome.exit_codes[1] == 3
    assert outcome.reason == ("BackoffLimitExceeded: node 1 exited with 3 (restarts [0, 6]); "
                              "nodes [0] stopped")
    assert run.processes[0].returncode == -9  # stopped with the job, not left running
    node0, node1 = (status["containerStatuses"][0] for status in run.pod_statuses())
    assert (node1["restartCount"], node1["lastState"]["terminated"]["exitCode"]) == (
        BACKOFF_LIMIT, 3)
    assert (node0["restartCount"], node0["state"]["terminated"]["exitCode"]) == (0, 137)
    late = TrainJobRun(_manifest(["python", "-c", "import time; time.sleep(600)"],
                                 deadline=1), str(tmp_path / "late"), SECRETS)
    late.start()
    assert late.wait(120).reason.startswith("DeadlineExceeded")


def test_trainjob_node_mirror_pulls_no_peers_probe(store, tmp_path, monkeypatch):
    """A node's process that pulls the checkpoint folder while rank 0 probes it (writes,
    lists and deletes a `.tmp-probe-*` object) must not copy the probe: listed, then gone,
    it failed the resumed job's start with NoSuchKey (seen in this rehearsal)."""
    import tempfile

    from components.common import storage

    monkeypatch.setattr(storage, "_MIRRORS", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("RANK", "1")  # a process that pulls and does not push
    kubeflow_demo.make_bucket("s3://mirrored")
    fs, _ = storage.filesystem("s3://mirrored")
    fs.pipe("mirrored/run/task/checkpoint-3/trainer_state.json", b"{}")
    probe = f"mirrored/run/task/{storage.TMP_PREFIX}probe-1234"
    fs.pipe(probe, b"rank 0's")
    listed = fs._find

    async def listed_then_probe_removed(path, *args, **kwargs):
        found = await listed(path, *args, **kwargs)
        with contextlib.suppress(FileNotFoundError):
            await fs._rm_file(probe)  # rank 0 ends its probe meanwhile
        return found

    monkeypatch.setattr(fs, "_find", listed_then_probe_removed)
    assert storage.filesystem("s3://mirrored/run/task")[0] is fs  # the mirror's
    local = storage.Mirror("s3://mirrored/run/task").local
    found = sorted(os.path.relpath(os.path.join(d, n), local)
                   for d, _, names in os.walk(local) for n in names)
    assert [f for f in found if not f.startswith(storage.TMP_PREFIX)] == [
        "checkpoint-3/trainer_state.json"]
    assert f"{storage.TMP_PREFIX}probe-1234" not in found


def _audited(folder) -> list[dict]:
    return [json.loads(line) for name in sorted(os.listdir(folder))
            for line in (folder / name).read_text().splitlines()]


def _epochs_logged(log: str) -> list[int]:
    """The epochs a node's Trainer logged a training loss for (its local rank 0 prints)."""
    return [int(float(line.split("'epoch': '")[1].split("'")[0]))
            for line in log.splitlines() if line.startswith("{'loss'")]


@pytest.mark.slow
def test_trainjob_node_lost_after_a_sealed_checkpoint_resumes_in_a_new_job_and_registers(
        store, tmp_path, cluster):
    """2 nodes x 2 processes; node 1 killed once the first checkpoint is sealed in S3; the
    retried launcher's new job resumes on every node from it; the model node 0 uploaded is
    copied into the launcher's output, evaluated and registered."""
    wall, cpu = time.monotonic(), _cpu_seconds()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    try:
        _rehearse(store, tmp_path, run_id, wall, cpu, cluster)
    finally:  # the nodes' model folders (a pod's /tmp, on a cluster gone with it)
        shutil.rmtree(os.path.join(MODEL_ROOT, run_id), ignore_errors=True)


def _inputs(store, tmp_path) -> tuple[str, multinode.NodeSettings]:
    """The prepared dataset (a local folder), the tiny encoder in S3, and the nodes."""
    from components.prepare_text.contract import read_split
    from components.prepare_text.preparation import PrepareConfig, prepare_text_dataset
    from components.train_transformer.tiny import write_tiny_model
    from tools.datamakers.demo_text import write_reviews_csv

    write_reviews_csv(str(tmp_path / "reviews.csv"), rows=120, seed=3)
    dataset = str(tmp_path / "dataset")
    prepare_text_dataset(str(tmp_path / "reviews.csv"), dataset, PrepareConfig())
    write_tiny_model(read_split(dataset, "train")["text"], str(tmp_path / "tiny"),
                     hidden_size=32, heads=2, max_length=64)
    kubeflow_demo.upload(str(tmp_path / "tiny"), CONFIG["model_name"])
    kubeflow_demo.make_bucket(ROOT)
    return dataset, multinode.NodeSettings(
        num_nodes=2, procs_per_node=2, gpus=0, cpu="2", memory="4Gi",
        storage_secret=kubeflow_demo.SECRET, checkpoint_root=ROOT, s3_endpoint=store,
        image="rehearsal", deadline_seconds=900)


def _rehearse(store, tmp_path, run_id, wall, cpu, cluster):
    from mlflow import MlflowClient

    from components.common.storage import filesystem
    from components.evaluate_text.evaluation import evaluate_text_model
    from components.register.component import register_in_mlflow, registration_gate
    from components.train_transformer.component import record_outputs
    from components.train_transformer.contract import TransformerConfig
    from components.train_transformer.training import SEALED_FILE

    dataset, settings = _inputs(store, tmp_path)
    stub, api = cluster
    # The launcher step's Output[Model] (KFP's local path .../<run>/<task>/model), and what
    # train_on_nodes makes of it: the model URI node 0 uploads to, the dataset staged.
    model = SimpleNamespace(path=str(tmp_path / "launcher" / "minio" / run_id / TASK / "model"),
                            uri=f"s3://pipelines/root/{run_id}/{TASK}/model", metadata={})
    task = multinode.task_folder(model.path)
    model_uri = "/".join([ROOT, "models", *task, "model"])
    staged = multinode.stage_dataset(f"minio://pipelines/{run_id}/prepare/dataset", dataset,
                                     ROOT, task)
    hooks, audit = tmp_path / "hooks", tmp_path / "audit"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOK)
    checkpoints = f"checkpoints/root/checkpoints/{run_id}/{TASK}"
    fs, _ = filesystem(ROOT)

    def attempt(number: int, node_env, kill_when=None):
        """One attempt of the launcher step: its TrainJob (named by the pod's uid), run by
        the launcher, played; (the job, the launcher's TrainJobFailed or None, selector)."""
        pod = f"launcher-{number}"
        environ = {multinode.POD_NAME: pod, multinode.POD_UID: f"uid-{number}-{run_id}"}
        manifest, selector = multinode.trainjob(
            settings, dataset_uri=staged, model_uri=model_uri, config=CONFIG,
            tensorboard_dir="", namespace=NS, environ=environ)
        (audit / str(number)).mkdir(parents=True)
        stub.add_pod(NS, pod, environ[multinode.POD_UID])
        played = []

        def play(created):  # the cluster's Trainer and JobSet: the nodes started
            job = TrainJobRun(created, str(tmp_path / f"attempt{number}"), SECRETS,
                              python_path=[str(hooks)], kubeconfig=kubeconfig,
                              node_env={i: {"TRAINJOB_AUDIT": str(audit / str(number)),
                                            **node_env.get(i, {})} for i in (0, 1)})
            if kill_when:
                job.kill_node_when(1, kill_when)
            job.start()
            played.append(job)
            return job

        stub.play, stop = play, threading.Event()
        timer = threading.Timer(240, stop.set)  # the launcher cancelled: the test fails
        timer.start()
        try:
            launcher.launch(api, manifest, task_selector=selector, stop=stop,
                            write=lambda line: None, timing=TIMING)
            failed = None
        except launcher.TrainJobFailed as error:
            failed = error
        finally:
            timer.cancel()
            stub.set_phase(NS, pod, "Succeeded")  # the launcher pod ends
        return played[0], failed, selector

    def sealed() -> list[int]:
        fs.invalidate_cache()
        return sorted(int(path.split("/checkpoint-")[1].split("/")[0])
                      for path in fs.glob(f"{checkpoints}/checkpoint-*/{SEALED_FILE}"))

    store_ = ObjectStore()
    kubeconfig = stub.write_kubeconfig(str(tmp_path / "kubeconfig"))
    first, failed, selector = attempt(
        1, {1: {"TRAINJOB_HOLD": "1"}},
        kill_when=lambda: store_.matches(f"{checkpoints}/checkpoint-*/{SEALED_FILE}"))
    logs = "\n".join(f"--- node {i}:\n{first.log(i)[-3000:]}" for i in (0, 1))
    # JobSet restarted node 1 in place; the launcher saw it in the pods at once, deleted
    # the job and failed, leaving the retry to the step's
    assert failed is not None and first.outcome.state == DELETED, logs
    assert re.search(r"failed: node 1 \(pod \S+\): its container 'node' was restarted in "
                     r"place \(1 time\(s\)\) after it ended with exit code 137", str(failed))
    assert first.restarts == [0, 1]
    assert "[owner] watching launcher pod rehearsal/launcher-1" in first.log(0)
    [step] = sealed()  # the first checkpoint, and no other
    parts = sorted(os.path.basename(p) for p in fs.ls(f"{checkpoints}/checkpoint-{step}"))
    assert {f"rng_state_{rank}.pth" for rank in range(4)} <= set(parts)  # node 1's too
    assert not fs.exists(model_uri)

    second, failed, again = attempt(2, {})
    logs = "\n".join(f"--- node {i}:\n{second.log(i)[-4000:]}" for i in (0, 1))
    assert failed is None and second.outcome.state == COMPLETE, logs
    assert second.name != first.name and again == selector  # a new job of the same task
    # Every process of every node read that checkpoint's state, and no later one's ...
    reads = _audited(audit / "2")
    assert {(r["node"], r["rank"]) for r in reads if r["step"] == step
            and r["file"] == "trainer_state.json"} == {("0", "0"), ("0", "1"), ("1", "2"),
                                                       ("1", "3")}
    assert {(r["rank"], r["file"]) for r in reads if r["step"] == step
            and r["file"].startswith("rng_state_")} == {
        (str(rank), f"rng_state_{rank}.pth") for rank in range(4)}  # its own RNG state
    # ... and each node trained on from the epoch after it, as node 0's result says.
    for index in (0, 1):
        assert _epochs_logged(first.log(index))[0] == 1
        assert _epochs_logged(second.log(index)) == [2, 3], logs
    assert "[node] model uploaded to " + model_uri in second.log(0)
    assert "Could not locate the best model" not in first.log(1) + second.log(1)

    # The launcher: the model node 0 uploaded copied into its Output[Model] (multinode's
    # copy), its outputs recorded as the step records them.
    copy_folder(model_uri, model.path)
    with open(os.path.join(model.path, "metrics.json")) as f:
        result = json.load(f)
    assert result["run"]["resumed_from"].endswith(f"/checkpoint-{step}")
    assert result["run"]["world_size"] == 4
    assert [row["epoch"] for row in result["history"]] == [1, 2, 3]
    logged: dict[str, float] = {}
    record_outputs(result, model, SimpleNamespace(log_metric=logged.__setitem__), dataset,
                   TransformerConfig(**CONFIG), "")
    assert model.metadata["framework"] == "transformers" and logged
    # Both nodes validated with the model saved: its own scores on the validation split
    # are those metrics.json has (node 1 predicted half of its rows).
    own = evaluate_text_model(model.path, dataset, str(tmp_path / "validation"),
                              split="validation", baseline=False)
    for name in ("micro_f1", "macro_f1", "hamming_loss"):
        assert (own[name], own["tuned"][name]) == pytest.approx(
            (result["fixed"][name], result["tuned"][name])), name

    # Then as in one pod: the evaluation, the gate, and (KFP's launcher having uploaded
    # the Output[Model]) MLflow's registry with the KServe manifest.
    evaluation = tmp_path / "evaluation"
    scores = evaluate_text_model(model.path, dataset, str(evaluation), split="test")
    decision = SimpleNamespace(path=str(tmp_path / "decision.md"), metadata={})
    assert registration_gate(SimpleNamespace(path=str(evaluation)), decision, "micro_f1",
                             0.0) is True
    kubeflow_demo.upload(model.path, model.uri)
    registered = SimpleNamespace(path=str(tmp_path / "registered"),
                                 uri=f"s3://pipelines/root/{run_id}/register/registered",
                                 metadata={})
    tracking = f"sqlite:///{tmp_path}/mlflow.db"
    version = register_in_mlflow(model, registered, tracking, "trainjob-rehearsal",
                                 "transformer", "runtime:rehearsal", run_id).version
    client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    challenger = client.get_model_version_by_alias("trainjob-rehearsal", "challenger")
    assert (str(challenger.version), challenger.source) == (version, model.uri)
    import yaml

    service = yaml.safe_load((tmp_path / "registered" / "inferenceservice.yaml").read_text())
    assert service["kind"] == "InferenceService"
    assert model.uri in json.dumps(service)  # KServe serves what was registered

    cpu_used = _cpu_seconds() - cpu + first.killed_cpu_seconds + second.killed_cpu_seconds
    print(f"[trainjob rehearsal] resumed from checkpoint-{step}; attempt 1 "
          f"{first.outcome.seconds:.1f}s, attempt 2 {second.outcome.seconds:.1f}s; test "
          f"micro_f1 {scores['micro_f1']:.3f} (validation {logged}); in S3: {parts}; "
          f"wall {time.monotonic() - wall:.1f}s, CPU {cpu_used:.1f}s")


@pytest.mark.slow
def test_trainjob_cancelled_launchers_nodes_are_stopped_within_a_one_second_grace(
        store, tmp_path, cluster):
    """The launcher in a process of its own, the real node command on 2 nodes: SIGTERM,
    SIGKILL a second later (Argo's emissary), and the nodes are gone by then (its handler's
    DELETE); SIGKILL alone (a KFP terminate, a step deadline: the pod object stays, no longer
    running), and node 0's watch of the launcher pod deletes the job within its poll."""
    stub, _ = cluster
    dataset, settings = _inputs(store, tmp_path)
    kubeconfig = stub.write_kubeconfig(str(tmp_path / "kubeconfig"))
    poll = 1.0
    run_ids = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    try:
        for run_id, grace in zip(run_ids, (1.0, None)):
            pod, uid = f"launcher-{run_id}", f"uid-{run_id}"
            manifest, _ = multinode.trainjob(
                settings, dataset_uri=dataset, model_uri=f"{ROOT}/models/{run_id}/{TASK}/model",
                config={**CONFIG, "epochs": 20}, tensorboard_dir="", namespace=NS,
                environ={multinode.POD_NAME: pod, multinode.POD_UID: uid})
            stub.add_pod(NS, pod, uid)
            played = []

            def play(created, folder=str(tmp_path / run_id), played=played):
                played.append(TrainJobRun(created, folder, SECRETS, kubeconfig=kubeconfig,
                                          node_env={0: {launcher.OWNER_POLL_VARIABLE: str(poll)}}))
                played[0].start()
                return played[0]

            stub.play = play
            step = subprocess.Popen([sys.executable, "-c", LAUNCHER, stub.host,
                                     json.dumps(manifest)], cwd=REPOSITORY,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            ends = time.monotonic() + 120
            while not (played and "[owner] watching" in played[0].log(0)):
                assert time.monotonic() < ends and step.poll() is None, step.stdout.read()
                time.sleep(0.2)
            job, cancelled = played[0], time.monotonic()
            if grace:
                step.send_signal(signal.SIGTERM)
                time.sleep(grace)
                stopped_in_grace = job.outcome is not None
                step.kill()
                assert stopped_in_grace and job.outcome.state == DELETED, step.stdout.read()
                assert "[owner] launcher pod" not in job.log(0)  # the handler's DELETE
            else:
                step.kill()  # no cleanup at all
                stub.set_phase(NS, pod, "Failed")  # as the kubelet reports it
                while job.outcome is None:
                    assert time.monotonic() - cancelled < poll + 20, job.log(0)
                    time.sleep(0.05)
                assert f"[owner] launcher pod {NS}/{pod} is Failed: deleting TrainJob " \
                       f"{job.name}" in job.log(0)
            seconds = job.outcome.seconds - (cancelled - job.started)
            assert all(process.returncode is not None for process in job.processes)
            assert [r[1].rsplit("/", 1)[1] for r in stub.calls("DELETE")][-1] == job.name
            print(f"[trainjob rehearsal] {'SIGTERM' if grace else 'SIGKILL'}: nodes stopped "
                  f"{seconds:.2f}s after the launcher's (node 0's owner poll {poll:g}s)")
            step.wait()
            step.stdout.close()
    finally:
        for run_id in run_ids:
            shutil.rmtree(os.path.join(MODEL_ROOT, run_id), ignore_errors=True)


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has reaped."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

