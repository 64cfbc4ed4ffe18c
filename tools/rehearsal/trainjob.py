"""One Kubeflow Trainer TrainJob played on this machine: its nodes as processes, as Trainer
2.3's `torch-distributed` runtime would run them on a cluster.

    run = TrainJobRun(manifest, folder, secrets={"s3-credentials": {...}})
    run.start()
    outcome = run.wait(timeout=600, kill_node=1, when=lambda: store.matches("b/**/sealed"))

The manifest is the one the launcher step creates (`components.train_transformer.
multinode.trainjob`, validated through `kubeflow-trainer-api`'s models). For each of its
`spec.trainer.numNodes` nodes this starts `spec.trainer.command` + `args` as every step
of a rehearsal is started (`runtimes.start_step`: `python` is this venv's, a process group
of its own, a node's pod, killed whole), with:

- the node container's `env` from the manifest: plain values, and each `secretKeyRef` read
  from `secrets` (the namespace's secrets; a missing one stops the job before it starts,
  as the pod would fail with CreateContainerConfigError);
- what Trainer 2.3's torch plugin adds (`pkg/runtime/framework/plugins/torch/torch.go`):
  `PET_NNODES`, `PET_NPROC_PER_NODE` (`numProcPerNode`, else `auto`), `PET_NODE_RANK`
  (the node's completion index), `PET_MASTER_ADDR` and `PET_MASTER_PORT`; on a cluster
  the master is `<job>-node-0-0.<job>:29500`, here 127.0.0.1 and a free port;
- nothing of this process's credentials or cluster variables (`runtimes.NOT_INHERITED*`:
  `AWS_*`, `PET_*`, torchrun's, Vertex's `AIP_*` and `CLUSTER_SPEC`), a `TMPDIR` of its own
  (a pod's local disk) and `OMP_NUM_THREADS=1` (several training processes share this
  machine's cores).

Like the runtime, the job has no failure policy: the first node that exits non-zero fails
the job, and the others are stopped (JobSet's failure policy restarts nothing). The job is
`Complete` when every node exited 0. What a cluster adds and this does not model: the
scheduler, images, pod networking and DNS, `resourcesPerNode` and `runtimePatches`
(reported by the launcher's tests, not enforced here), and JobSet's own restarts.

tests/test_trainjob_rehearsal.py plays the launcher's retry with it: node 1 of a job lost
after the first sealed checkpoint is in S3, then a new job of the same task whose nodes
resume from that checkpoint, the model registered as one pod's is.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from components.trainjob.contract import PET_VARIABLES
from tools.rehearsal.gcs_api import free_port
from tools.rehearsal.records import RehearsalError
from tools.rehearsal.runtimes import start_step, stop

COMPLETE, FAILED = "Complete", "Failed"  # the TrainJob's conditions


@dataclasses.dataclass
class JobOutcome:
    """How a played TrainJob ended.

    Attributes:
        state: `Complete` or `Failed`.
        reason: Why it failed (the first node that exited non-zero, or the deadline);
            empty when complete.
        exit_codes: Each node's exit status (negative: the signal that ended it; None:
            still running when the job was stopped, then killed).
        seconds: Wall seconds from start to end.
    """

    state: str
    reason: str
    exit_codes: list[int | None]
    seconds: float


def secret_value(secrets: Mapping[str, Mapping[str, str]], ref: Mapping[str, Any]) -> str | None:
    """The value of a `secretKeyRef`, or None where an optional one is missing.

    Raises:
        RehearsalError: A required secret or key is missing (the pod would not start).
    """
    value = secrets.get(ref["name"], {}).get(ref["key"])
    if value is None and not ref.get("optional"):
        raise RehearsalError(f"the node reads key {ref['key']!r} of secret {ref['name']!r}, "
                             "which the namespace does not hold: its pod would not start "
                             "(CreateContainerConfigError)")
    return value


def container_env(trainer: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]]
                  ) -> dict[str, str]:
    """The node container's variables from `spec.trainer.env` (values and secret keys)."""
    env = {}
    for entry in trainer.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        source = entry.get("valueFrom") or {}
        if "secretKeyRef" not in source:
            raise RehearsalError(f"env {entry['name']}: only values and secretKeyRef are "
                                 f"played here, got {source}")
        value = secret_value(secrets, source["secretKeyRef"])
        if value is not None:
            env[entry["name"]] = value
    return env


def trainer_variables(trainer: Mapping[str, Any], node_rank: int, master_port: int
                      ) -> dict[str, str]:
    """The `PET_*` variables Trainer 2.3's torch plugin gives node `node_rank`."""
    procs = trainer.get("numProcPerNode")
    return dict(zip(PET_VARIABLES, (str(trainer.get("numNodes", 1)),
                                    "auto" if procs is None else str(procs), str(node_rank),
                                    "127.0.0.1", str(master_port))))


class TrainJobRun:
    """One TrainJob's nodes as local processes (see the module's docstring).

    Args:
        manifest: The TrainJob (camelCase keys, as the launcher creates it).
        folder: Local folder of this job: `node-<i>/tmp` (each node's TMPDIR) and
            `node-<i>.log` (its output).
        secrets: The namespace's secrets: name -> key -> value.
        python_path: Folders put first on the nodes' PYTHONPATH (tests put a
            sitecustomize.py there); nothing of this process's PYTHONPATH is kept.
        node_env: Variables of one node (by index) over its others (a test's hooks).
    """

    def __init__(self, manifest: Mapping[str, Any], folder: str,
                 secrets: Mapping[str, Mapping[str, str]] | None = None, *,
                 python_path: Sequence[str] = (),
                 node_env: Mapping[int, Mapping[str, str]] | None = None):
        self.manifest, self.folder = manifest, os.path.abspath(folder)
        self.name = manifest["metadata"]["name"]
        self.trainer = manifest["spec"]["trainer"]
        self.nodes = int(self.trainer.get("numNodes", 1))
        self.secrets = secrets or {}
        self.python_path = list(python_path)
        self.node_env = {int(k): dict(v) for k, v in (node_env or {}).items()}
        self.deadline = manifest["spec"].get("activeDeadlineSeconds")
        self.processes: list[subprocess.Popen] = []
        self.killed: set[int] = set()
        # CPU seconds of the processes the nodes had started (torch's workers), sampled as
        # each node's group was killed: killed with it, nobody here reaps them (a node
        # process's own, and what it reaped, count in this process's RUSAGE_CHILDREN).
        self.killed_cpu_seconds = 0.0
        self.started = 0.0
        self.outcome: JobOutcome | None = None

    def log_path(self, index: int) -> str:
        return os.path.join(self.folder, f"node-{index}.log")

    def log(self, index: int) -> str:
        """Node `index`'s output so far."""
        with open(self.log_path(index), errors="replace") as f:
            return f.read()

    def command(self) -> list[str]:
        command = [*(self.trainer.get("command") or []), *(self.trainer.get("args") or [])]
        if not command:
            raise RehearsalError(f"TrainJob {self.name} gives no command: the runtime's own "
                                 "is not played here")
        return command

    def variables(self, index: int, master_port: int) -> dict[str, str]:
        """What node `index`'s pod gives its process (`runtimes.step_env` adds the rest)."""
        return {"OMP_NUM_THREADS": "1", **container_env(self.trainer, self.secrets),
                **trainer_variables(self.trainer, index, master_port),
                **self.node_env.get(index, {})}

    def start(self) -> None:
        """Starts every node (node 0 first, as its pod hosts the rendezvous)."""
        if self.processes:
            raise RehearsalError(f"TrainJob {self.name} was started already")
        os.makedirs(self.folder, exist_ok=True)
        port, command = free_port(), self.command()
        environments = [self.variables(i, port) for i in range(self.nodes)]
        self.started = time.monotonic()
        for index, env in enumerate(environments):
            tmp = os.path.join(self.folder, f"node-{index}", "tmp")
            os.makedirs(tmp, exist_ok=True)
            self.processes.append(start_step(command, env, self.log_path(index), {tmp: "/tmp"},
                                             python_path=self.python_path))
        print(f"[trainjob] {self.name}: {self.nodes} nodes started (master 127.0.0.1:{port})",
              flush=True)

    def kill_node(self, index: int) -> None:
        """Node `index`'s pod lost (preempted, its machine gone): SIGKILL to its group."""
        self.killed.add(index)
        self._kill(self.processes[index])
        print(f"[trainjob] {self.name}: node {index} killed", flush=True)

    def delete(self) -> None:
        """The job deleted: every node still running is killed (JobSet deletes its pods)."""
        for process in self.processes:
            self._kill(process)

    def _kill(self, process: subprocess.Popen) -> None:
        if process.returncode is None:
            self.killed_cpu_seconds += _group_cpu_seconds(process.pid)
        stop(process)

    def poll(self) -> JobOutcome | None:
        """The job's outcome once it has ended (applying the runtime's failure policy);
        None while it runs."""
        if self.outcome is not None:
            return self.outcome
        codes = [process.poll() for process in self.processes]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        seconds = time.monotonic() - self.started
        if failed is not None:
            reason = (f"node {failed} exited with {codes[failed]}"
                      + (" (killed)" if failed in self.killed else ""))
        elif self.deadline and seconds > self.deadline:
            reason = f"DeadlineExceeded: activeDeadlineSeconds {self.deadline} passed"
        elif all(code == 0 for code in codes):
            return self._end(COMPLETE, "", codes, seconds)
        else:
            return None
        running = [i for i, code in enumerate(codes) if code is None]
        self.delete()  # no failure policy: the other nodes are stopped with the job
        return self._end(FAILED, reason + (f"; nodes {running} stopped" if running else ""),
                         [None if code is None else code for code in codes], seconds)

    def _end(self, state: str, reason: str, codes: list[int | None], seconds: float
             ) -> JobOutcome:
        self.outcome = JobOutcome(state, reason, codes, seconds)
        print(f"[trainjob] {self.name}: {state}" + (f" ({reason})" if reason else "")
              + f" after {seconds:.1f}s", flush=True)
        return self.outcome

    def wait(self, timeout: float, kill_node: int | None = None,
             when: Callable[[], bool] | None = None, poll_seconds: float = 0.2) -> JobOutcome:
        """Waits for the job's end; kills node `kill_node` once `when()` is true (once).

        Raises:
            RehearsalError: The job did not end within `timeout` seconds (every node is
                killed first).
        """
        ends = time.monotonic() + timeout
        try:
            while (outcome := self.poll()) is None:
                if time.monotonic() > ends:
                    raise RehearsalError(f"TrainJob {self.name} did not end within {timeout}s")
                if kill_node is not None and when is not None and kill_node not in self.killed \
                        and when():
                    self.kill_node(kill_node)
                    continue
                time.sleep(poll_seconds)
        finally:
            self.delete()
        return outcome


def _group_cpu_seconds(group: int) -> float:
    """CPU seconds (their own and their reaped children's) of the processes in process
    group `group` other than its leader, from /proc; 0 where there is no /proc."""
    ticks = 0
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == group:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == group:  # pgrp; utime, stime, cutime, cstime follow
            ticks += sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")
