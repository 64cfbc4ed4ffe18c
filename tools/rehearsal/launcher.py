"""Open-source KFP's launcher as a rehearsal stands in for it: pods, and the copies in and out.

On open-source KFP `/gcs`, `/minio` and `/s3` are plain folders of the pod: the launcher
(backend/src/v2/component/launcher_v2.go) copies each input artifact to `LocalPathForURI`
(`s3://B/K` -> `/s3/B/K`) and uploads the outputs from there if the step succeeded; output
parameters are read from `/tmp/kfp/outputs/NAME`. A pod here is a fresh folder per attempt.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import time
from collections.abc import Mapping
from typing import Any

from components.common.storage import filesystem
from tools.rehearsal.records import Preemption, RehearsalError, secret_value
from tools.rehearsal.runtimes import containers_for, open_mount, start_step, stop, without_gpus

# What a KFP pod's python has between a SIGTERM and its end, whatever the grace period:
# Argo's emissary passes the SIGTERM to its child's group, KFP's launcher (Go, no handler)
# dies of it, the emissary reaps it within its 1 s poll and exits, the kernel kills the rest
# (argo-workflows v3.6 cmd/argoexec/commands/emissary.go, read from source).
KFP_POD_GRACE_S = 1.0
# KFP's LocalPathForURI: the pod folder an object store URI is copied to.
MOUNTS = {"gs://": "/gcs/", "minio://": "/minio/", "s3://": "/s3/"}
# Where the launcher has a step write its output parameters (driver.go, provisionOutputs).
PARAMETER_OUTPUTS = "/tmp/kfp/outputs"
# A pod's own folders (its /gcs, /minio, /s3 and /tmp): each attempt's afresh.
POD_FOLDERS = ("gcs", "minio", "s3", "tmp")
# Argo's phases of an attempt's node (a pod).
SUCCEEDED, FAILED, ERROR = "Succeeded", "Failed", "Error"


def mount_path(uri: str) -> str:
    """The path in a pod that KFP's launcher gives an object store URI."""
    for scheme, mount in MOUNTS.items():
        if uri.startswith(scheme):
            return mount + uri[len(scheme):]
    raise RehearsalError(f"{uri!r} is not a gs://, minio:// or s3:// URI: KFP's launcher "
                         "has no local path for it")


def store_uri(uri: str) -> str:
    """The URI fsspec reads `uri` with (a MinIO bucket is an S3 bucket at its endpoint)."""
    return "s3://" + uri[len("minio://"):] if uri.startswith("minio://") else uri


class ObjectStore:
    """The pipeline root's object store, read and written as the launcher does (fsspec)."""

    def download(self, uri: str, local: str) -> bool:
        """Copies the object or folder at `uri` to `local`; False if there is none."""
        fs, path = filesystem(store_uri(uri))
        fs.invalidate_cache()
        if fs.isdir(path):
            os.makedirs(local, exist_ok=True)
            fs.get(path.rstrip("/") + "/", local.rstrip("/") + "/", recursive=True)
            return True
        if fs.isfile(path):
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs.get(path, local)
            return True
        return False

    def upload(self, local: str, uri: str) -> bool:
        """Copies the file or folder `local` to `uri`; False if the step wrote nothing."""
        if not os.path.exists(local):
            return False
        fs, path = filesystem(store_uri(uri))
        try:  # a folder's content into `path`, as the launcher's upload puts it
            fs.put(local.rstrip("/") + "/" if os.path.isdir(local) else local, path,
                   recursive=True)
        except OSError as err:
            raise RehearsalError(f"failed to upload {local} to {uri}: {err}") from err
        fs.invalidate_cache()
        return True

    def check_bucket(self, uri: str, make: bool = False) -> None:
        """Refuses a pipeline root whose bucket does not exist (every upload would fail), or,
        `make`, makes it."""
        fs, path = filesystem(store_uri(uri))
        bucket = path.split("/", 1)[0]
        try:
            found = fs.exists(bucket)
        except OSError as err:
            raise RehearsalError(f"the object store of {uri} cannot be reached: {err}") from err
        if not found and make:
            fs.mkdir(bucket)
        elif not found:
            raise RehearsalError(f"the pipeline root's bucket {bucket!r} does not exist: "
                                 "make it, or pass another --pipeline-root")

    def matches(self, pattern: str) -> bool:
        """Whether an object matches `pattern` (`BUCKET/glob`, `**` for any folders)."""
        bucket, _, rest = pattern.partition("/")
        fs, path = filesystem(f"s3://{bucket}")
        fs.invalidate_cache()
        try:
            keys = fs.find(path)
        except FileNotFoundError:
            return False
        return any(fnmatch.fnmatch(key, f"{bucket}/{rest}") for key in keys)


class Pods:
    """Where a task's attempts run, each in a pod folder of its own under `output`/pods/."""

    def __init__(self, kind: str, output: str) -> None:
        self.containers = containers_for(kind)
        self.kind = kind
        self.root = os.path.join(output, "pods")
        self.logs = os.path.join(output, "logs")
        self.series = ""  # "retry1-": the pods of a run's first retry, beside the earlier ones

    def log_path(self, task: str, attempt: int) -> str:
        """Where the step's output of `task`'s attempt (counted from 1) is written."""
        return os.path.join(self.logs, task.replace("/", "-"),
                            f"{self.series}attempt{attempt}.log")

    def new(self, task: str, attempt: int) -> str:
        """A fresh pod folder for `task`'s attempt (counted from 1), with empty mounts."""
        pod = os.path.join(self.root, task.replace("/", "-"), f"{self.series}attempt{attempt}")
        for folder in (*POD_FOLDERS, PARAMETER_OUTPUTS[1:]):
            os.makedirs(os.path.join(pod, folder), exist_ok=True)
        return pod

    def hand_over(self, pod: str) -> None:
        """Makes what the launcher wrote in `pod` the step's user's (KFP's launcher runs as it)."""
        if self.containers:
            open_mount(pod)

    def step_path(self, pod: str, path: str) -> str:
        """A path of the pod (`/s3/...`, `/tmp/...`) as the step's process sees it."""
        return path if self.containers else os.path.join(pod, path.lstrip("/"))

    def host_path(self, pod: str, path: str) -> str:
        """The local file behind a path of the pod."""
        return os.path.join(pod, path.lstrip("/"))

    def run(self, pod: str, command: list[str], env: Mapping[str, str], image: str,
            log_path: str, deadline: float, rule: Kill | None,
            store: ObjectStore) -> tuple[str, str]:
        """Runs the step's command in `pod` until it ends, its deadline passes or `rule` ends
        it; (Argo's phase of the attempt, why it did not succeed)."""
        proc = start_step(command, env, log_path,
                          {os.path.join(pod, name): "/" + name for name in POD_FOLDERS},
                          self.containers, image)
        started = time.monotonic()
        while proc.poll() is None:
            time.sleep(0.2)
            if deadline and time.monotonic() - started > deadline:
                stop(proc)
                return FAILED, f"activeDeadlineSeconds {deadline:.0f} passed"
            # every turn: a kill meant for after a tiny model's first checkpoint must land
            if rule and store.matches(rule.pattern):
                rule.done = True
                stop(proc, 0 if rule.deleted else KFP_POD_GRACE_S)
                return rule.ended()
        if proc.returncode:
            with open(log_path) as f:
                lines = f.read().strip().splitlines() or [""]
            return FAILED, f"exited with {proc.returncode}: {lines[-1][-300:]} (log {log_path})"
        return SUCCEEDED, ""

    def remove_all(self) -> None:
        """Removes the image containers the pods ran in (the images stay)."""
        if self.containers:
            self.containers.remove_all()


@dataclasses.dataclass
class Kill(Preemption):
    """A `Preemption` of a pod once an object matches: its container stopped as a node shut
    down gracefully does (SIGTERM, the kill within `KFP_POD_GRACE_S`: `Failed`, retried) or,
    `deleted`, its pod deleted with its node (no notice: `Error`, not retried)."""

    deleted: bool = False

    def ended(self) -> tuple[str, str]:
        """(Argo's phase of the attempt it ended, why)."""
        if self.deleted:
            return ERROR, f"pod deleted with its node once {self.pattern} was in the store"
        return FAILED, f"container stopped (SIGTERM) once {self.pattern} was in the store"


def pod_env(container: Mapping[str, Any], settings: Mapping[str, Any],
            secrets: Mapping[str, Mapping[str, str]], task: str) -> dict[str, str]:
    """The step's environment: the container's own, then its secrets' keys.

    Raises:
        RehearsalError: A secret (or key) the pod needs is not given (`secret_value`).
    """
    env = without_gpus({e["name"]: e["value"] for e in container.get("env", [])})
    for mount in settings.get("secretAsEnv", []):
        for pair in mount["keyToEnv"]:
            value = secret_value(secrets, mount["secretName"], pair["secretKey"],
                                 mount.get("optional", False), f"{task}: the pod")
            if value is not None:
                env[pair["envVar"]] = value
    return env


def scheduling_note(container: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """What the pod asks of a node, which one machine cannot honour: reported."""
    resources = container.get("resources", {})
    parts = [f"{name} {resources[key]}" for name, key in (
        ("cpu", "resourceCpuLimit"), ("memory", "resourceMemoryLimit")) if key in resources]
    accelerator = resources.get("accelerator", {})
    if accelerator:
        parts.append(f"{accelerator.get('resourceCount')} x {accelerator.get('resourceType')}")
    labels = settings.get("nodeSelector", {}).get("labels", {})
    parts += [f"node {k}={v}" for k, v in sorted(labels.items())]
    parts += [f"tolerates {t['key']}" for t in settings.get("tolerations", [])]
    parts += [f"{m['mountPath']} {m.get('sizeLimit', '')}".strip()
              for m in settings.get("emptyDirMounts", [])]
    return "; ".join(parts)


def retry_policy(task: Mapping[str, Any]) -> tuple[int, float, float]:
    """(attempts, first back-off in seconds, factor) of a task's `retryPolicy`."""
    policy = task.get("retryPolicy", {})
    backoff = float(str(policy.get("backoffDuration", "0s")).rstrip("s") or 0)
    return 1 + int(policy.get("maxRetryCount", 0)), backoff, float(
        policy.get("backoffFactor", 2.0))
