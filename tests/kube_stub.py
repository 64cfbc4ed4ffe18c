"""A loopback stand-in of the Kubernetes API server for the TrainJob launcher's tests: it
answers as the API server of a cluster with Kubeflow Trainer does, records every request
(method, path, query, body), and the real `kubernetes` client talks to it over HTTP.

- trainjobs (`/apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs[/NAME]`): create
  (409 when the name exists; a field in `unknown_fields` is refused with
  `fieldValidation=Strict`, as strict decoding does, and dropped without), get (404 when
  absent), list by label selector, delete (foreground: the job stays, with a
  deletionTimestamp, for its plan's `linger` more reads);
- pods (`/api/v1/namespaces/NS/pods`): each job's node pods (JobSet's and the Job
  controller's labels) and those `add_pod` adds, listed by label selector or `metadata.name`
  field selector; each node's log (`.../pods/NAME/log`), served whole and closed.

A job's status follows its `Plan`, or, given `play`, what `play(manifest)` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/"
PODS = "/api/v1/namespaces/"
NOW = "2026-11-27T10:00:00Z"


@dataclasses.dataclass
class Plan:
    """How one TrainJob runs: its conditions read after read, node 0's log, its deletion.

    Attributes:
        conditions: Conditions (a list, maybe empty) the 1st, 2nd, ... read of the job
            reports; the last repeats.
        log: Node 0's log lines.
        linger: Reads a deleted job still answers (deletionTimestamp set) before it is gone.
        pods: Node index -> its pod's `status` (phase, conditions, containerStatuses) over
            the one the job's conditions give it.
    """

    conditions: list[list[dict[str, Any]]] = dataclasses.field(default_factory=lambda: [[]])
    log: list[str] = dataclasses.field(default_factory=list)
    linger: int = 0
    pods: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
    """A TrainJob status condition that is true."""
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": NOW}


def _matches(labels: dict[str, str], selector: str) -> bool:
    pairs = [term.split("=", 1) for term in selector.split(",") if term]
    return all(labels.get(key) == value for key, value in pairs)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeStub:
    """The API's state (jobs, their plans and reads) and the requests it was sent.

    Args:
        play: Called with each job created; what it returns plays the job in place of a
            `Plan`: its `conditions()` now, `pod_statuses()` (each node's pod `status` now,
            by node index), `log(index)` (node `index`'s log so far) and `delete()` (the
            job deleted: its nodes stopped).
        unknown_fields: Dotted paths ("spec.runtimePatches") the installed Trainer does
            not have.
    """

    def __init__(self, play: Callable[[dict[str, Any]], Any] | None = None,
                 unknown_fields: tuple[str, ...] = ()) -> None:
        self.play, self.unknown_fields = play, unknown_fields
        self.played: dict[tuple[str, str], Any] = {}
        self.other_pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.codes: list[int] = []  # the status answered to each request, in order
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.plans: dict[str, Plan] = {}
        self.reads: dict[tuple[str, str], int] = {}
        self.lingering: dict[tuple[str, str], int] = {}
        self.server: ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add_job(self, namespace: str, job: dict[str, Any]) -> None:
        """A job the API already holds (as if an earlier launcher had created it)."""
        job = json.loads(json.dumps(job))
        job["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()),
                               creationTimestamp=NOW)
        self.jobs[(namespace, job["metadata"]["name"])] = job
        self.reads.pop((namespace, job["metadata"]["name"]), None)

    def add_pod(self, namespace: str, name: str, uid: str, phase: str = "Running") -> None:
        """A pod other than a node's (the launcher's); `set_phase` changes its phase."""
        self.other_pods[(namespace, name)] = {
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": {}},
            "status": {"phase": phase}}

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        with self.lock:
            self.other_pods[(namespace, name)]["status"]["phase"] = phase

    def write_kubeconfig(self, path: str) -> str:
        """A kubeconfig of this API at `path` (for a client in another process)."""
        with open(path, "w") as f:  # JSON is YAML
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "stub",
                       "clusters": [{"name": "stub", "cluster": {"server": self.host}}],
                       "users": [{"name": "stub", "user": {}}],
                       "contexts": [{"name": "stub",
                                     "context": {"cluster": "stub", "user": "stub"}}]}, f)
        return path

    def calls(self, method: str | None = None, contains: str = "") -> list[tuple]:
        """The recorded requests, those of `method` whose path holds `contains`."""
        with self.lock:
            return [r for r in self.requests if (method is None or r[0] == method)
                    and contains in r[1]]

    def _read(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The job as a read finds it (status by its plan), or None when gone."""
        job = self.jobs.get(key)
        if job is None:
            return None
        if key in self.lingering:
            if self.lingering[key] <= 0:
                del self.jobs[key], self.lingering[key]
                return None
            self.lingering[key] -= 1
            return job
        plan = self.plans.get(key[1], Plan())
        count = self.reads.get(key, 0)
        self.reads[key] = count + 1
        job["status"] = {"conditions": self.played[key].conditions() if key in self.played
                         else plan.conditions[min(count, len(plan.conditions) - 1)]}
        return job

    def _unknown(self, body: dict[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
        """The fields of `body` the installed Trainer does not have: path -> (the object
        that holds it, its key)."""
        found = {}
        for path in self.unknown_fields:
            *parents, last = path.split(".")
            holder = body
            for part in parents:
                holder = holder.get(part) if isinstance(holder, dict) else None
            if isinstance(holder, dict) and last in holder:
                found[path] = (holder, last)
        return found

    def trainjobs(self, method: str, namespace: str, name: str, query: dict[str, str],
                  body: Any) -> tuple[int, Any]:
        key = (namespace, name)
        if method == "POST":
            name = body["metadata"]["name"]
            if (namespace, name) in self.jobs:
                return 409, _status(409, "AlreadyExists",
                                    f'trainjobs.trainer.kubeflow.org "{name}" already exists')
            unknown = self._unknown(body)
            if unknown and query.get("fieldValidation") == "Strict":
                return 400, _status(400, "BadRequest", "TrainJob in version \"v1alpha1\" "
                                    "cannot be handled as a TrainJob: strict decoding error: "
                                    + ", ".join(f'unknown field "{p}"' for p in unknown))
            for holder, key in unknown.values():  # Warn (the server's default): pruned
                del holder[key]
            self.add_job(namespace, body)
            if self.play:
                self.played[(namespace, name)] = self.play(self.jobs[(namespace, name)])
            return 201, self.jobs[(namespace, name)]
        if method == "GET" and not name:
            items = [job for (ns, _), job in self.jobs.items() if ns == namespace
                     and _matches(job["metadata"].get("labels") or {},
                                  query.get("labelSelector", ""))]
            return 200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJobList",
                         "metadata": {}, "items": items}
        job = self._read(key) if method == "GET" else self.jobs.get(key)
        if job is None:
            return 404, _status(404, "NotFound",
                                f'trainjobs.trainer.kubeflow.org "{name}" not found')
        if method == "DELETE":
            if key not in self.lingering:
                self.lingering[key] = self.plans.get(name, Plan()).linger
                job["metadata"]["deletionTimestamp"] = NOW
                if key in self.played:
                    self.played[key].delete()
        return 200, job

    def _pods(self, namespace: str) -> list[dict[str, Any]]:
        """Each job's node pods, their phase by the job's state (or its plan's or player's
        status), then the pods added."""
        pods = []
        for (ns, name), job in self.jobs.items():
            if ns != namespace or (ns, name) in self.lingering:
                continue
            ended = [c["type"] for c in job.get("status", {}).get("conditions", [])]
            phase = ("Succeeded" if "Complete" in ended else "Failed" if "Failed" in ended
                     else "Running" if self.reads.get((ns, name), 0) else "Pending")
            played = self.played.get((ns, name))
            statuses = played.pod_statuses() if played else [
                {"phase": phase, **self.plans.get(name, Plan()).pods.get(index, {})}
                for index in range(job["spec"]["trainer"].get("numNodes", 1))]
            for index, status in enumerate(statuses):
                pods.append({"metadata": {
                    "name": f"{name}-node-0-{index}-x7k2q", "namespace": ns,
                    "uid": f"{job['metadata']['uid']}-{index}", "creationTimestamp": NOW,
                    "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                               "jobset.sigs.k8s.io/replicatedjob-name": "node",
                               "batch.kubernetes.io/job-completion-index": str(index)}},
                    "status": status})
        return pods + [pod for (ns, _), pod in self.other_pods.items() if ns == namespace]

    def pods(self, namespace: str, rest: str, query: dict[str, str]) -> tuple[int, Any]:
        if not rest:
            named = query.get("fieldSelector", "").removeprefix("metadata.name=")
            items = [pod for pod in self._pods(namespace)
                     if _matches(pod["metadata"]["labels"], query.get("labelSelector", ""))
                     and named in ("", pod["metadata"]["name"])]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        pod, _, what = rest.partition("/")
        found = [p for p in self._pods(namespace) if p["metadata"]["name"] == pod]
        if what != "log" or not found:
            return 404, _status(404, "NotFound", f'pods "{pod}" not found')
        job = found[0]["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"]
        index = found[0]["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        if (namespace, job) in self.played:
            return 200, self.played[(namespace, job)].log(int(index))
        lines = self.plans.get(job, Plan()).log if index == "0" else [f"node {index}"]
        return 200, "".join(line + "\n" for line in lines)

    def answer(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        parts = urlsplit(url)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        with self.lock:
            self.requests.append((method, parts.path, query, body))
            code, payload = self._route(method, parts.path, query, body)
            self.codes.append(code)
            return code, payload

    def _route(self, method: str, path: str, query: dict[str, str],
               body: Any) -> tuple[int, Any]:
        if path.startswith(TRAINJOBS):
            namespace, _, rest = path[len(TRAINJOBS):].partition("/")
            plural, _, name = rest.partition("/")
            if plural == "trainjobs":
                return self.trainjobs(method, namespace, name, query, body)
        if path.startswith(PODS) and method == "GET":
            namespace, _, rest = path[len(PODS):].partition("/")
            if rest.startswith("pods"):
                return self.pods(namespace, rest[len("pods/"):], query)
        return 404, _status(404, "NotFound", f"the stub does not serve {method} {path}")

    def start(self) -> KubeStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                code, payload = stub.answer(self.command, self.path,
                                            json.loads(raw) if raw else None)
                text = isinstance(payload, str)
                data = (payload if text else json.dumps(payload)).encode()
                # the client may be gone: a node stopped by the DELETE it sent
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(code)
                    self.send_header("Content-Type",
                                     "text/plain" if text else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def serving(stub: KubeStub | None = None):
    """`stub` (a new one when None) started, and a real `kubernetes` client pointed at it;
    both closed on the way out."""
    from kubernetes import client

    stub = (stub or KubeStub()).start()
    configuration = client.Configuration()
    configuration.host = stub.host
    api = client.ApiClient(configuration)
    try:
        yield stub, api
    finally:
        api.close()
        stub.stop()
