"""The launcher: creates the TrainJob, follows it to its end, and always deletes it.

KFP cannot create a custom resource from its IR, so a small launcher pod does: it creates
the TrainJob (`spec.trainjob_manifest`), polls its `status.conditions` until `Complete`
or `Failed` (Trainer 2.3's terminal conditions), streams node 0's log (the pod JobSet
labels with the job's name and the Job labels with completion index 0) into its own, and
raises `TrainJobFailed` with the job's reason and message when it fails.

Polling, not a watch: a training job runs for hours, and a watch connection is closed by
the API server every few minutes and must be resumed from a resourceVersion; one GET every
`poll_seconds` costs the API server nothing and needs no resume logic.

The job is deleted on the way out, whatever the way (`finally`): completed, failed, an
error here, or the step cancelled. KFP cancels a step by stopping its pod, which sends the
launcher SIGTERM: the handler installed here sets the stop event, the loop ends and the
job is deleted before the pod's grace period (30 s by default) runs out. The job's
ownerReference to the launcher pod is the backstop (garbage collection once the pod
object is deleted).

One job of a task at a time: the name is derived from the run, the task and the attempt
(`spec.trainjob_name`), and before creating it the launcher deletes any job of that name
(left by an earlier launcher of the same attempt, e.g. a pod the kubelet started again)
and, given `task_selector`, every other job of the task (earlier attempts), and waits until
each is gone: deleted in the foreground, a TrainJob is gone only once its JobSet's pods
are, so no old node still trains or writes checkpoints when the new job starts. Deleting
rather than refusing: such a job belongs to this very step and its result cannot be
adopted (its pods may have died with the earlier launcher); refusing would fail every
retry of the step until someone deleted it by hand.

The Kubernetes client is injected (`kubernetes.client.ApiClient`): in the pod, one
configured from the service account (`kubernetes.config.load_incluster_config()`); in
the tests, one pointed at a loopback stub of the API.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from components.trainjob.spec import GROUP, NODE, PLURAL, VERSION

# Labels of each node's pod: JobSet's (the TrainJob's JobSet has the TrainJob's name) and
# the Job controller's completion index (Trainer's PET_NODE_RANK).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
COMPLETE, FAILED = "Complete", "Failed"


class TrainJobError(RuntimeError):
    """The TrainJob could not be run to its end; the message says why."""


class TrainJobFailed(TrainJobError):
    """The TrainJob ended `Failed`; the message carries its reason and message."""


class TrainJobCancelled(TrainJobError):
    """The step was cancelled (SIGTERM or the stop event) and the TrainJob deleted."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """How the launcher paces its calls.

    Attributes:
        poll_seconds: Between two reads of the job's status (and looks for node 0's pod).
        clear_seconds: Longest wait for a leftover job to be gone before creating.
        log_grace_seconds: Longest wait, once the job has ended, for node 0's log to end.
        api_retries: API errors in a row (5xx, connection) tolerated while following.
    """

    poll_seconds: float = 10.0
    clear_seconds: float = 600.0
    log_grace_seconds: float = 60.0
    api_retries: int = 5


def node0_selector(name: str) -> str:
    """The label selector of node 0's pod(s) of TrainJob `name`."""
    return (f"{JOBSET_NAME_LABEL}={name},{REPLICATED_JOB_LABEL}={NODE},"
            f"{COMPLETION_INDEX_LABEL}=0")


def job_outcome(job: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(`Complete` or `Failed`, reason, message) once the job has ended; None before.

    Args:
        job: The TrainJob as the API returns it.
    """
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in (COMPLETE, FAILED) and condition.get("status") == "True":
            return (condition["type"], condition.get("reason") or "",
                    condition.get("message") or "")
    return None


def _print(line: str) -> None:
    print(line, flush=True)


def _transient(error: Exception) -> bool:
    """An API error worth another try: the server's (5xx, 429) or the connection's."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(error, ApiException):
        return error.status is None or error.status >= 500 or error.status == 429
    return isinstance(error, HTTPError)


def _status(error: Exception) -> int | None:
    return getattr(error, "status", None)


def _delete(custom, namespace: str, name: str, write: Callable[[str], None]) -> None:
    """Deletes the job (foreground: its JobSet and pods first); gone already is fine."""
    for attempt in range(3):
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                   propagation_policy="Foreground")
            write(f"[launcher] TrainJob {namespace}/{name} deleted")
            return
        except Exception as error:  # noqa: BLE001 (in a finally: never mask the cause)
            if _status(error) == 404:
                return
            if attempt == 2 or not _transient(error):
                write(f"[launcher] could not delete TrainJob {namespace}/{name} ({error}): "
                      f"delete it by hand (kubectl delete trainjob -n {namespace} {name})")
                return
            time.sleep(1)


def _exists(custom, namespace: str, name: str) -> bool:
    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except Exception as error:
        if _status(error) == 404:
            return False
        raise
    return True


def _clear(custom, namespace: str, name: str, task_selector: str, timing: Timing,
           stop: threading.Event, write: Callable[[str], None]) -> None:
    """Deletes the job of this name and, with `task_selector`, the task's other jobs, and
    waits until they are gone."""
    names = {name}
    if task_selector:
        found = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                     label_selector=task_selector)
        names |= {item["metadata"]["name"] for item in found.get("items", [])}
    left = [other for other in sorted(names) if _exists(custom, namespace, other)]
    for other in left:
        write(f"[launcher] TrainJob {namespace}/{other} is left from an earlier attempt of "
              "this task: deleting it and waiting until it is gone (one job of a task at a "
              "time)")
        _delete(custom, namespace, other, write)
    deadline = time.monotonic() + timing.clear_seconds
    while left:
        if stop.wait(timing.poll_seconds):
            raise TrainJobCancelled("cancelled while waiting for an earlier TrainJob to go")
        left = [other for other in left if _exists(custom, namespace, other)]
        if left and time.monotonic() > deadline:
            raise TrainJobError(f"TrainJob(s) {left} in {namespace} still there "
                                f"{timing.clear_seconds:g} s after being deleted (a "
                                "finalizer?): not starting another job of this task")


def _wait(custom, namespace: str, name: str, timing: Timing,
          stop: threading.Event) -> dict[str, Any]:
    """Polls the job until it ends; returns it once `Complete`."""
    errors = 0
    while not stop.is_set():
        try:
            job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            errors = 0
        except Exception as error:
            if _status(error) == 404:
                raise TrainJobError(f"TrainJob {namespace}/{name} was deleted while it ran "
                                    "(not by this step)") from error
            errors += 1
            if not _transient(error) or errors > timing.api_retries:
                raise
        else:
            outcome = job_outcome(job)
            if outcome and outcome[0] == COMPLETE:
                return job
            if outcome:
                raise TrainJobFailed(f"TrainJob {namespace}/{name} failed: {outcome[1]}: "
                                     f"{outcome[2]}")
        stop.wait(timing.poll_seconds)
    raise TrainJobCancelled(f"cancelled: TrainJob {namespace}/{name} deleted")


def _node0_pod(core, namespace: str, name: str):
    """Node 0's newest pod that has started (its log readable), or None."""
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=node0_selector(name)).items
    except Exception as error:
        if _transient(error):
            return None
        raise
    started = [pod for pod in pods if (pod.status and pod.status.phase) not in (None, "Pending")]
    return max(started, default=None, key=lambda pod: (
        pod.metadata.creation_timestamp.timestamp() if pod.metadata.creation_timestamp else 0.0))


def _stream(core, namespace: str, pod: str, write: Callable[[str], None],
            stop: threading.Event) -> None:
    """Writes the pod's `node` container log, line by line, until it ends."""
    write(f"[launcher] node 0's log (pod {pod}):")
    try:
        response = core.read_namespaced_pod_log(pod, namespace, container=NODE, follow=True,
                                                _preload_content=False)
        try:
            rest = b""
            for chunk in response.stream(4096):
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    write(line.decode("utf-8", "replace"))
                if stop.is_set():
                    return
            if rest:
                write(rest.decode("utf-8", "replace"))
        finally:
            response.release_conn()
    except Exception as error:  # noqa: BLE001 (the log is a courtesy: the job's state rules)
        write(f"[launcher] node 0's log (pod {pod}) ended early: {error}")


def _follow_logs(core, namespace: str, name: str, write: Callable[[str], None],
                 ended: threading.Event, stop: threading.Event, timing: Timing) -> None:
    """Streams each pod node 0 runs in (a restarted node is a new pod) until the job ends."""
    streamed: set[str] = set()
    while not stop.is_set():
        last_look = ended.is_set()
        pod = _node0_pod(core, namespace, name)
        if pod is not None and pod.metadata.uid not in streamed:
            streamed.add(pod.metadata.uid)
            _stream(core, namespace, pod.metadata.name, write, stop)
            continue
        if last_look:
            return
        ended.wait(timing.poll_seconds)


def _on_sigterm(stop: threading.Event) -> Callable[[], None]:
    """Sets `stop` on SIGTERM (main thread only); returns what restores the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    return lambda: signal.signal(signal.SIGTERM, previous)


def launch(api, manifest: Mapping[str, Any], *, task_selector: str = "",
           stop: threading.Event | None = None, write: Callable[[str], None] | None = None,
           timing: Timing = Timing()) -> dict[str, Any]:
    """Runs the TrainJob to its end: create, follow, stream node 0's log, delete.

    Args:
        api: A `kubernetes.client.ApiClient` (in-cluster in the pod; a stub in tests).
        manifest: The TrainJob (`spec.trainjob_manifest`); its metadata names it and its
            namespace.
        task_selector: Label selector of every TrainJob of this task (all attempts): each
            is deleted before this one is created; empty: only a job of this name.
        stop: Set to cancel (the SIGTERM handler sets it too); the job is deleted.
        write: Where the launcher's lines and node 0's log go; stdout when None.
        timing: Polling and waiting.

    Returns:
        The TrainJob as the API returned it once `Complete`.

    Raises:
        TrainJobFailed: The job ended `Failed` (its reason and message in the text).
        TrainJobCancelled: `stop` was set or SIGTERM came.
        TrainJobError: A leftover job would not go, or the job vanished while it ran.
        kubernetes.client.exceptions.ApiException: The API refused a call (e.g. the
            service account may not create trainjobs: the message says which verb).
    """
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    stop, write = stop or threading.Event(), write or _print
    restore, owned = _on_sigterm(stop), False
    try:
        _clear(custom, namespace, name, task_selector, timing, stop, write)
        owned = True
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                   dict(manifest))
        except Exception as error:
            if _status(error) == 409:  # another launcher of this very attempt made it
                owned = False
                raise TrainJobError(f"TrainJob {namespace}/{name} appeared while this step "
                                    "created it: another launcher runs this attempt") from error
            raise
        write(f"[launcher] TrainJob {namespace}/{name} created "
              f"({manifest['spec']['trainer'].get('numNodes')} node(s))")
        ended = threading.Event()
        logs = threading.Thread(target=_follow_logs, daemon=True, name=f"log-{name}",
                                args=(core, namespace, name, write, ended, stop, timing))
        logs.start()
        try:
            return _wait(custom, namespace, name, timing, stop)
        finally:
            ended.set()
            if not stop.is_set():
                logs.join(timing.log_grace_seconds)
    finally:
        try:
            if owned:
                _delete(custom, namespace, name, write)
        finally:
            restore()
