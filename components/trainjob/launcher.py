"""The launcher: creates the TrainJob, follows it to its end, and always deletes it.

KFP cannot create a custom resource, so a launcher pod does (strict field validation), then
polls (the API server closes watches) the job's conditions and node pods, streaming node 0's
log. A failed node fails the step at once (`node_problem`): JobSet would restart it in place
while the others wait in the rendezvous until NCCL's timeout.

The job is deleted on the way out, and on SIGTERM by the handler on its own connections
(Argo's emissary exits within a second of a cancel); node 0 watches the launcher pod
(`watch_owner`) for a launcher stopped without cleanup. Before creating, the task's
earlier jobs are deleted and waited for: their result cannot be adopted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import tenacity

from components.trainjob.spec import GROUP, NODE, PLURAL, VERSION

# Node pods' labels: JobSet's (named after the TrainJob) and the completion index (the rank).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
COMPLETE, FAILED = "Complete", "Failed"
# Waiting reasons the kubelet retries for ever and that never clear by themselves.
STUCK = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError")
# What node 0 is given to watch its owner (`watch_owner`): the job, and the launcher pod.
OWNER_VARIABLES = ("TRAINJOB_NAME", "TRAINJOB_NAMESPACE", "TRAINJOB_OWNER_POD",
                   "TRAINJOB_OWNER_UID")
OWNER_POLL_VARIABLE = "TRAINJOB_OWNER_POLL_SECONDS"  # over OWNER_POLL_SECONDS (rehearsals)
OWNER_POLL_SECONDS = 30.0


class TrainJobError(RuntimeError):
    """The TrainJob could not be run to its end; the message says why."""


class TrainJobFailed(TrainJobError):
    """The TrainJob ended `Failed`; the message carries its reason and message."""


class TrainJobCancelled(TrainJobError):
    """The step was cancelled (SIGTERM or the stop event) and the TrainJob deleted."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """The launcher's pace: between polls, the longest waits for a leftover job to go and
    node 0's log to end, API errors in a row tolerated, and how long a node pod may stay
    unschedulable (an autoscaler adds a GPU machine in minutes)."""

    poll_seconds: float = 10.0
    clear_seconds: float = 600.0
    log_grace_seconds: float = 60.0
    api_retries: int = 5
    pending_seconds: float = 900.0


def node0_selector(name: str) -> str:
    """The label selector of node 0's pod(s) of TrainJob `name`."""
    return (f"{JOBSET_NAME_LABEL}={name},{REPLICATED_JOB_LABEL}={NODE},"
            f"{COMPLETION_INDEX_LABEL}=0")


def job_outcome(job: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(`Complete` or `Failed`, reason, message) once the job has ended; None before."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in (COMPLETE, FAILED) and condition.get("status") == "True":
            return (condition["type"], condition.get("reason") or "",
                    condition.get("message") or "")
    return None


def _terminated(state) -> str:
    """"exit code N (REASON)" of a container state that has terminated, else ""."""
    ended = state and state.terminated
    return f"exit code {ended.exit_code} ({ended.reason or 'no reason'})" if ended else ""


def pod_problem(pod, pending_for: float, pending_seconds: float) -> str:
    """Why node pod `pod` (a `V1Pod`, seen `pending_for` s ago) fails the job now, or ""."""
    status = pod.status
    containers = [*(status.init_container_statuses or []), *(status.container_statuses or [])]
    if status.phase == FAILED:
        ended = [_terminated(c.state) for c in containers  # not an init container's 0
                 if c.state and c.state.terminated and c.state.terminated.exit_code]
        why = ", ".join(filter(None, [status.reason, *ended[:1]]))
        return f"its pod failed: {why or 'no reason'}" + (
            f": {status.message}" if status.message else "")
    for container in containers:
        last = container.last_state and container.last_state.terminated
        if container.restart_count or last:
            return (f"its container {container.name!r} was restarted in place "
                    f"({container.restart_count} time(s)) after it ended with "
                    f"{_terminated(container.last_state) or 'no exit code'}")
        waiting = container.state and container.state.waiting
        if waiting and waiting.reason in STUCK:
            return (f"its container {container.name!r} cannot start: {waiting.reason}: "
                    f"{waiting.message}")
    scheduled = next((c for c in status.conditions or [] if c.type == "PodScheduled"), None)
    if (scheduled and scheduled.status == "False" and scheduled.reason == "Unschedulable"
            and pending_for > pending_seconds):
        return (f"unschedulable for {pending_for:.0f} s (pending_seconds {pending_seconds:g}): "
                f"{scheduled.message}")
    return ""


def node_problem(pods, seen: dict[str, tuple[str, float]], now: float,
                 pending_seconds: float) -> str:
    """Why the job's node pods (`V1Pod`s) fail it now, naming node and pod, or "";
    `seen`: each node's first pod uid and when it was seen (kept across polls)."""
    for pod in sorted(pods, key=lambda pod: pod.metadata.name):
        index = (pod.metadata.labels or {}).get(COMPLETION_INDEX_LABEL, "?")
        uid, since = seen.setdefault(index, (pod.metadata.uid, now))
        where = f"node {index} (pod {pod.metadata.name})"
        if uid != pod.metadata.uid:
            return (f"{where} replaced the node's first pod: the node was lost (its pod "
                    "deleted or its machine gone)")
        problem = pod_problem(pod, now - since, pending_seconds)
        if problem:
            return f"{where}: {problem}"
    return ""


def _transient(error: Exception) -> bool:
    """An API error worth another try: the server's (5xx, 429) or the connection's."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(error, ApiException):
        return error.status is None or error.status >= 500 or error.status == 429
    return isinstance(error, HTTPError)


def _status(error: Exception) -> int | None:
    return getattr(error, "status", None)


def _message(error: Exception) -> str:
    """The API's message in an ApiException's body, else the exception's text."""
    try:
        return json.loads(error.body)["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return str(error)


def _delete(custom, namespace: str, name: str, write: Callable[[str], None],
            attempts: int = 3) -> bool:
    """Deletes the job in the foreground; False where it was gone or could not be."""
    try:
        tenacity.Retrying(retry=tenacity.retry_if_exception(_transient), reraise=True,
                          stop=tenacity.stop_after_attempt(attempts), wait=tenacity.wait_fixed(1))(
            custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
            propagation_policy="Foreground")
    except Exception as error:  # noqa: BLE001 (in a finally: never mask the cause)
        if _status(error) != 404:
            write(f"[launcher] could not delete TrainJob {namespace}/{name} ({error}): "
                  f"delete it by hand (kubectl delete trainjob -n {namespace} {name})")
        return False
    write(f"[launcher] TrainJob {namespace}/{name} deleted")
    return True


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
    """Deletes this job and the task's others (`task_selector`); waits until they are gone."""
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


def _wait(custom, core, namespace: str, name: str, timing: Timing,
          stop: threading.Event) -> dict[str, Any]:
    """Polls the job and its pods until it ends; returns it once `Complete`."""
    errors, seen = 0, {}
    while not stop.is_set():
        try:
            job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            pods = core.list_namespaced_pod(
                namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}").items
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
            problem = node_problem(pods, seen, time.monotonic(), timing.pending_seconds)
            if problem:
                raise TrainJobFailed(f"TrainJob {namespace}/{name} failed: {problem}")
        stop.wait(timing.poll_seconds)
    raise TrainJobCancelled(f"cancelled: TrainJob {namespace}/{name} deleted")


def _stream(core, namespace: str, pod: str, write: Callable[[str], None],
            stop: threading.Event) -> None:
    """Writes the pod's `node` container log, line by line, until it ends."""
    write(f"[launcher] node 0's log (pod {pod}):")
    try:
        response = core.read_namespaced_pod_log(pod, namespace, container=NODE, follow=True,
                                                _preload_content=False)
        try:
            for line in response:  # urllib3 splits the stream into lines
                write(line.decode("utf-8", "replace").rstrip("\n"))
                if stop.is_set():
                    return
        finally:
            response.release_conn()
    except Exception as error:  # noqa: BLE001 (the log is a courtesy: the job's state rules)
        write(f"[launcher] node 0's log (pod {pod}) ended early: {error}")


def _follow_logs(core, namespace: str, name: str, write: Callable[[str], None],
                 ended: threading.Event, stop: threading.Event, timing: Timing) -> None:
    """Streams each pod node 0 runs in (a restarted node is a new pod; its newest that has
    started, the log readable) until the job ends."""
    streamed: set[str] = set()
    while not stop.is_set():
        last_look = ended.is_set()
        try:
            pods = core.list_namespaced_pod(namespace, label_selector=node0_selector(name)).items
        except Exception as error:
            if not _transient(error):
                raise
            pods = []
        started = [pod for pod in pods
                   if (pod.status and pod.status.phase) not in (None, "Pending")]
        pod = max(started, default=None, key=lambda pod: (
            pod.metadata.creation_timestamp.timestamp()
            if pod.metadata.creation_timestamp else 0.0))
        if pod is not None and pod.metadata.uid not in streamed:
            streamed.add(pod.metadata.uid)
            _stream(core, namespace, pod.metadata.name, write, stop)
            continue
        if last_look:
            return
        ended.wait(timing.poll_seconds)


def _on_sigterm(stop: threading.Event, cancel: Callable[[], None]) -> Callable[[], None]:
    """On SIGTERM (main thread only) sets `stop` and calls `cancel`; returns the restorer."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def handle(signum, frame) -> None:
        stop.set()
        cancel()

    signal.signal(signal.SIGTERM, handle)
    return lambda: signal.signal(signal.SIGTERM, previous)


def launch(api, manifest: Mapping[str, Any], *, task_selector: str = "",
           stop: threading.Event | None = None, write: Callable[[str], None] | None = None,
           timing: Timing = Timing()) -> dict[str, Any]:
    """Runs the TrainJob to its end: create, follow, stream node 0's log, delete.

    Args:
        api: A `kubernetes.client.ApiClient`.
        manifest: The TrainJob (`spec.trainjob_manifest`).
        task_selector: Selects every TrainJob of this task, deleted first; empty: none.
        stop, write: Set to cancel; where its lines and node 0's log go (stdout when None).
        timing: Polling and waiting.

    Returns:
        The TrainJob as the API returned it once `Complete`.

    Raises:
        TrainJobFailed: The job ended `Failed`, or a node pod failed it.
        TrainJobCancelled: `stop` was set or SIGTERM came.
        TrainJobError: A leftover job would not go, the job vanished, or strict field
            validation refused a field.
        kubernetes.client.exceptions.ApiException: The API refused a call.
    """
    from kubernetes import client

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    spare = client.ApiClient(api.configuration)  # the SIGTERM handler's own connections
    name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
    stop, write = stop or threading.Event(), write or functools.partial(print, flush=True)
    owned, deleted = threading.Event(), threading.Event()

    def cancel() -> None:  # within the second Argo's emissary leaves: one try, no line
        if owned.is_set() and _delete(client.CustomObjectsApi(spare), namespace, name,
                                      lambda line: None, attempts=1):
            deleted.set()

    restore = _on_sigterm(stop, cancel)
    try:
        _clear(custom, namespace, name, task_selector, timing, stop, write)
        owned.set()
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                   dict(manifest), field_validation="Strict")
        except Exception as error:
            if _status(error) == 409:  # another launcher of this very attempt made it
                owned.clear()
                raise TrainJobError(f"TrainJob {namespace}/{name} appeared while this step "
                                    "created it: another launcher runs this attempt") from error
            if _status(error) == 400:
                raise TrainJobError(
                    f"the API refused TrainJob {namespace}/{name}: {_message(error)} (strict "
                    "field validation: does the cluster run Trainer 2.3?)") from error
            raise
        write(f"[launcher] TrainJob {namespace}/{name} created "
              f"({manifest['spec']['trainer'].get('numNodes')} node(s))")
        ended = threading.Event()
        logs = threading.Thread(target=_follow_logs, daemon=True, name=f"log-{name}",
                                args=(core, namespace, name, write, ended, stop, timing))
        logs.start()
        try:
            return _wait(custom, core, namespace, name, timing, stop)
        finally:
            ended.set()
            if not stop.is_set():
                logs.join(timing.log_grace_seconds)
    finally:
        try:
            if deleted.is_set():
                write(f"[launcher] TrainJob {namespace}/{name} deleted on SIGTERM")
            elif owned.is_set():
                _delete(custom, namespace, name, write)
        finally:
            restore()
            spare.close()


def owner_stopped(pods, uid: str) -> str:
    """How the launcher pod (`uid`, among `pods` of its name) stopped ("is gone"), or ""."""
    pod = next((pod for pod in pods if pod.metadata.uid == uid), None)
    if pod is None:
        return "is gone"
    if pod.metadata.deletion_timestamp:
        return "is being deleted"
    if pod.status.phase != "Running":
        return f"is {pod.status.phase}" + (f" ({pod.status.reason})" if pod.status.reason else "")
    return ""


def watch_owner(api, environ: Mapping[str, str], *, poll_seconds: float = OWNER_POLL_SECONDS,
                stop: threading.Event | None = None,
                write: Callable[[str], None] | None = None) -> bool:
    """Node 0's side of a cancel: deletes the job (a node that exits is restarted in place)
    once the launcher pod owning it stops.

    Args:
        api, environ: A `kubernetes.client.ApiClient`; `OWNER_VARIABLES` of the node.
        poll_seconds: Between two reads of the launcher pod.
        stop, write: Ends the watch when set; where its lines go (stdout when None).

    Returns:
        True once it deleted the job; False where the watch ended otherwise.
    """
    from kubernetes import client

    name, namespace, pod, uid = (environ[key] for key in OWNER_VARIABLES)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    stop, write = stop or threading.Event(), write or functools.partial(print, flush=True)
    write(f"[owner] watching launcher pod {namespace}/{pod} every {poll_seconds:g} s: "
          f"TrainJob {name} is deleted once it no longer runs")
    while True:
        try:
            found = core.list_namespaced_pod(namespace,
                                             field_selector=f"metadata.name={pod}").items
        except Exception as error:  # noqa: BLE001 (the watch must not fail the training)
            if not _transient(error):
                write(f"[owner] cannot read launcher pod {namespace}/{pod} ({error}): not "
                      "watching it")
                return False
        else:
            why = owner_stopped(found, uid)
            if why:
                write(f"[owner] launcher pod {namespace}/{pod} {why}: deleting TrainJob {name}")
                return _delete(custom, namespace, name, write)
        if stop.wait(poll_seconds):
            return False
