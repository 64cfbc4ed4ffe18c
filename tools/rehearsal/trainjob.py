"""One Kubeflow Trainer TrainJob played on this machine: its nodes as processes, as Trainer
2.3's `torch-distributed` runtime would run them on a cluster.

    run = TrainJobRun(manifest, folder, secrets={"s3-credentials": {...}})
    run.kill_node_when(1, lambda: store.matches("b/**/sealed"))
    run.start()
    outcome = run.wait(timeout=600)

Each of `spec.trainer.numNodes` nodes runs `command` + `args` (`runtimes.start_step`) with
the container's `env`, the `PET_*` variables of Trainer's torch plugin (master 127.0.0.1 and
a free port), `KUBECONFIG` of the stub given, a `TMPDIR` of its own, `OMP_NUM_THREADS=1`.
A node that exits non-zero restarts in place (JobSet's OnFailure) until `BACKOFF_LIMIT` is
passed. Not modelled: the scheduler, images, networking, `resourcesPerNode`, `runtimePatches`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from components.trainjob.contract import PET_VARIABLES
from tools.rehearsal.gcs_api import free_port
from tools.rehearsal.records import RehearsalError, secret_value
from tools.rehearsal.runtimes import start_step, stop

COMPLETE, FAILED, DELETED = "Complete", "Failed", "Deleted"  # the TrainJob's conditions, gone
# Failures the Job tolerates (Kubernetes' default: JobSet and Trainer set none), each
# restarting the node's container in place (JobSet's default restartPolicy OnFailure).
BACKOFF_LIMIT = 6


@dataclasses.dataclass
class JobOutcome:
    """How a played TrainJob ended."""

    state: str  # Complete, Failed or Deleted
    reason: str  # why it failed or was deleted; empty when complete
    exit_codes: list[int | None]  # negative: the signal; None: running when stopped
    seconds: float


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
        ref = source["secretKeyRef"]
        value = secret_value(secrets, ref["name"], ref["key"], ref.get("optional", False),
                             "the node")
        if value is not None:
            env[entry["name"]] = value
    return env


class TrainJobRun:
    """One TrainJob's nodes as local processes (see the module's docstring).

    Args:
        manifest: The TrainJob (camelCase keys, as the launcher creates it).
        folder: Local folder of this job: `node-<i>/tmp` (TMPDIR) and `node-<i>.log`.
        secrets: The namespace's secrets: name -> key -> value.
        python_path: Folders put first on the nodes' PYTHONPATH (tests' sitecustomize.py).
        node_env: Variables of one node (by index) over its others (a test's hooks).
        kubeconfig: The API the nodes' service account reaches; empty: none.
    """

    def __init__(self, manifest: Mapping[str, Any], folder: str,
                 secrets: Mapping[str, Mapping[str, str]] | None = None, *,
                 python_path: Sequence[str] = (),
                 node_env: Mapping[int, Mapping[str, str]] | None = None,
                 kubeconfig: str = ""):
        self.manifest, self.folder = manifest, os.path.abspath(folder)
        self.name = manifest["metadata"]["name"]
        self.trainer = manifest["spec"]["trainer"]
        self.nodes = int(self.trainer.get("numNodes", 1))
        self.secrets = secrets or {}
        self.python_path = list(python_path)
        self.node_env = {int(k): dict(v) for k, v in (node_env or {}).items()}
        self.kubeconfig = kubeconfig
        self.deadline = manifest["spec"].get("activeDeadlineSeconds")
        self.processes: list[subprocess.Popen] = []
        self.environments: list[dict[str, str]] = []
        self.restarts = [0] * self.nodes  # each node's container's restartCount
        self.last_exit: list[int | None] = [None] * self.nodes  # its exit before the restart
        self.killed: set[int] = set()
        self.kill_rule: tuple[int, Callable[[], bool]] | None = None
        # CPU seconds of the nodes' own children (torch's workers), sampled as each group
        # was killed: nobody here reaps them, so RUSAGE_CHILDREN misses them.
        self.killed_cpu_seconds = 0.0
        self.started = 0.0
        self.outcome: JobOutcome | None = None

    def log_path(self, index: int, restart: int = 0) -> str:
        return os.path.join(self.folder, f"node-{index}"
                            + (f".restart{restart}" if restart else "") + ".log")

    def log(self, index: int) -> str:
        """Node `index`'s output so far, every container's (first, then each restart's)."""
        text = ""
        for restart in range(self.restarts[index] + 1):
            with contextlib.suppress(FileNotFoundError), open(
                    self.log_path(index, restart), errors="replace") as f:
                text += f.read()
        return text

    def command(self) -> list[str]:
        command = [*(self.trainer.get("command") or []), *(self.trainer.get("args") or [])]
        if not command:
            raise RehearsalError(f"TrainJob {self.name} gives no command: the runtime's own "
                                 "is not played here")
        return command

    def variables(self, index: int, master_port: int) -> dict[str, str]:
        """What node `index`'s pod gives its process (`runtimes.step_env` adds the rest), the
        `PET_*` variables of Trainer 2.3's torch plugin among them."""
        procs = self.trainer.get("numProcPerNode")
        pet = (str(self.nodes), "auto" if procs is None else str(procs), str(index), "127.0.0.1",
               str(master_port))
        return {"OMP_NUM_THREADS": "1", "KUBECONFIG": self.kubeconfig,
                "KUBERNETES_SERVICE_HOST": "", **container_env(self.trainer, self.secrets),
                **dict(zip(PET_VARIABLES, pet)), **self.node_env.get(index, {})}

    def start(self) -> None:
        """Starts every node (node 0 first, as its pod hosts the rendezvous)."""
        if self.processes:
            raise RehearsalError(f"TrainJob {self.name} was started already")
        os.makedirs(self.folder, exist_ok=True)
        port = free_port()
        self.environments = [self.variables(i, port) for i in range(self.nodes)]
        self.command()  # refused before any node starts
        self.started = time.monotonic()
        self.processes = [self._start_node(i) for i in range(self.nodes)]
        print(f"[trainjob] {self.name}: {self.nodes} nodes started (master 127.0.0.1:{port})",
              flush=True)

    def _start_node(self, index: int) -> subprocess.Popen:
        tmp = os.path.join(self.folder, f"node-{index}", "tmp")
        os.makedirs(tmp, exist_ok=True)
        return start_step(self.command(), self.environments[index],
                          self.log_path(index, self.restarts[index]), {tmp: "/tmp"},
                          python_path=self.python_path)

    def kill_node(self, index: int) -> None:
        """Node `index`'s container killed (SIGKILL to its group: an OOM kill, a crash);
        the kubelet restarts it in place (`poll`)."""
        self.killed.add(index)
        self._kill(self.processes[index])
        print(f"[trainjob] {self.name}: node {index} killed", flush=True)

    def kill_node_when(self, index: int, when: Callable[[], bool]) -> None:
        """Kills node `index` once, at the first `poll` that finds `when()` true."""
        self.kill_rule = (index, when)

    def delete(self) -> None:
        """The job deleted: every node still running is killed (JobSet deletes its pods)."""
        self._stop_all()
        if self.outcome is None:
            self._end(DELETED, "deleted", [p.returncode for p in self.processes],
                      time.monotonic() - self.started)

    def _stop_all(self) -> None:
        for process in self.processes:
            self._kill(process)

    def _kill(self, process: subprocess.Popen) -> None:
        if process.returncode is None:
            self.killed_cpu_seconds += _group_cpu_seconds(process.pid)
        stop(process)

    def poll(self) -> JobOutcome | None:
        """The job's outcome once it has ended (restarting a failed node in place, up to
        `BACKOFF_LIMIT` times in all); None while it runs."""
        if self.outcome is not None:
            return self.outcome
        if self.kill_rule and self.kill_rule[0] not in self.killed and self.kill_rule[1]():
            self.kill_node(self.kill_rule[0])
        codes = [process.poll() for process in self.processes]
        seconds = time.monotonic() - self.started
        reason = ""
        for index, code in enumerate(codes):
            if code in (None, 0):
                continue
            if sum(self.restarts) >= BACKOFF_LIMIT:
                reason = (f"BackoffLimitExceeded: node {index} exited with {code} "
                          f"(restarts {self.restarts})")
                break
            self.restarts[index] += 1
            self.last_exit[index] = code
            self.processes[index] = self._start_node(index)
            codes[index] = None
            print(f"[trainjob] {self.name}: node {index} exited with {code}: restarted in "
                  f"place ({self.restarts[index]})", flush=True)
        if not reason and self.deadline and seconds > self.deadline:
            reason = f"DeadlineExceeded: activeDeadlineSeconds {self.deadline} passed"
        if not reason:
            return self._end(COMPLETE, "", codes, seconds) if all(
                code == 0 for code in codes) else None
        running = [i for i, code in enumerate(codes) if code is None]
        self._stop_all()  # the Job failed: its other nodes are stopped with it
        return self._end(FAILED, reason + (f"; nodes {running} stopped" if running else ""),
                         codes, seconds)

    def _end(self, state: str, reason: str, codes: list[int | None], seconds: float
             ) -> JobOutcome:
        self.outcome = JobOutcome(state, reason, codes, seconds)
        print(f"[trainjob] {self.name}: {state}" + (f" ({reason})" if reason else "")
              + f" after {seconds:.1f}s", flush=True)
        return self.outcome

    def conditions(self) -> list[dict[str, Any]]:
        """The TrainJob's conditions now (Trainer's `Complete` or `Failed`, once ended)."""
        outcome = self.poll()
        if outcome is None or outcome.state == DELETED:
            return []
        return [{"type": outcome.state, "status": "True", "message": outcome.reason,
                 "reason": "JobsCompleted" if outcome.state == COMPLETE else "FailedJobs"}]

    def pod_statuses(self) -> list[dict[str, Any]]:
        """Each node's pod `status` now, as the kubelet reports it (phase, the `node`
        container's state, restartCount and last state)."""
        self.poll()
        statuses = []
        for index, process in enumerate(self.processes):
            code, last = process.returncode, self.last_exit[index]
            failed = self.outcome is not None and self.outcome.state == FAILED
            statuses.append({
                "phase": "Succeeded" if code == 0 else "Failed" if failed else "Running",
                "containerStatuses": [{
                    "name": "node", "image": self.trainer.get("image", ""), "imageID": "",
                    "ready": code is None, "restartCount": self.restarts[index],
                    "state": {"running": {}} if code is None else _terminated(code),
                    "lastState": {} if last is None else _terminated(last)}]})
        return statuses

    def wait(self, timeout: float, poll_seconds: float = 0.2) -> JobOutcome:
        """Waits for the job's end.

        Raises:
            RehearsalError: It did not end within `timeout` seconds (its nodes killed first).
        """
        ends = time.monotonic() + timeout
        try:
            while (outcome := self.poll()) is None:
                if time.monotonic() > ends:
                    raise RehearsalError(f"TrainJob {self.name} did not end within {timeout}s")
                time.sleep(poll_seconds)
        finally:
            if self.outcome is None:
                self.delete()
        return outcome


def _terminated(code: int) -> dict[str, Any]:
    """A container state that has terminated with process status `code`."""
    return {"terminated": {"exitCode": 128 - code if code < 0 else code,
                           "reason": "Completed" if code == 0 else "Error"}}


def _group_cpu_seconds(group: int) -> float:
    """CPU seconds (their own and their children's) of group `group`'s processes but its
    leader."""
    import psutil

    total = 0.0
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # gone meanwhile
            if process.pid != group and os.getpgid(process.pid) == group:
                total += sum(process.cpu_times()[:4])  # user, system, children's
    return total
