"""The TrainJob a launcher step creates: Kubeflow Trainer 2.2-2.3 (`trainer.kubeflow.org/v1alpha1`).

Written as the API's camelCase dict and read back through `kubeflow-trainer-api`'s typed
models (2.3.0) by `validate_manifest`, which refuses what they would drop or change. The
pod settings are one `runtimePatches` entry of the `node` job, with istio injection off: the
mesh refuses node-to-node traffic through JobSet's headless service (kubeflow/trainer#2794).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING
from typing import Any

from components.common.gpus import EXPECTED_GPUS_VARIABLE
from components.common.written import check_settings, setting
from components.trainjob.contract import PET_VARIABLES

API_VERSION = "trainer.kubeflow.org/v1alpha1"
GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
# The replicated job and container of Trainer's torch runtimes (pkg/constants: Node).
NODE = "node"
GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
# Who owns the runtime patch (Trainer 2.3 requires a domain-prefixed path).
DEFAULT_MANAGER = "vertex-gpu-pipelines/trainjob-launcher"
# The variables the storage secret's two keys become (botocore's), by default its keys.
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# KFP's own pods carry this pod label (backend template/v2_template.go), the nodes too.
ISTIO_INJECT = "sidecar.istio.io/inject"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# A Secret's key (Kubernetes' IsConfigMapKey).
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
# JobSet names each node's pod (and its DNS host) <job>-node-<job index>-<pod index> and
# refuses a job whose names pass 63 characters; names made here stay well below.
MAX_NAME = 40
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[KMGTPE]i|[mkMGTPE])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DOMAIN_PATH = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


class ManifestError(ValueError):
    """A TrainJob setting the API would refuse; the message names it."""


@dataclasses.dataclass(frozen=True)
class Nodes:
    """A TrainJob's nodes: what each holds and runs, where its pods go, the runtime and the
    job's deadline (each field's help: the launcher step's input's)."""

    num_nodes: int = setting(MISSING, "Nodes of the TrainJob (pods, one machine each).", ge=1)
    # None: one per GPU, else one (not Trainer's `auto`: one per CPU)
    procs_per_node: int | None = setting(MISSING, "Processes per node: its GPUs, or 1.", ge=1)
    gpus: int = setting(MISSING, "GPUs of each node (nvidia.com/gpu); 0 for CPU nodes.", ge=0)
    cpu: str = setting(MISSING, "CPU of each node (a Kubernetes quantity; requests = limits).")
    memory: str = setting(MISSING, "Memory of each node (/dev/shm counts inside it).")
    shm: str = setting("", "Size of each node's memory-backed /dev/shm; empty: the "
                       "container's own.")
    node_selector: dict[str, str] = setting({}, "Node labels the nodes must have (GPU type, "
                                            "spot pool).")
    tolerations: list[dict[str, Any]] = setting([], "Tolerations of the nodes (key, operator, "
                                                "value, effect).")
    image_pull_secrets: list[str] = setting([], "Secrets the nodes pull the image with.")
    storage_secret: str = setting("", "Kubernetes secret whose storage_secret_keys the nodes "
                                  "get as variables; empty for none.")
    secret_keys: list[str] = setting(list(S3_SECRET_KEYS), "Its keys whose values "
                                     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY get, in that "
                                     "order.")
    runtime: str = setting(DEFAULT_RUNTIME, "The ClusterTrainingRuntime the job runs on "
                           "(torch-distributed).")
    image: str = setting("", "The nodes' image (this step's).")
    service_account: str = setting("", "The nodes' Kubernetes service account; empty: this "
                                   "pod's.")
    queue: str = setting("", "Kueue LocalQueue the TrainJob is queued in "
                         "(kueue.x-k8s.io/queue-name); empty: none.")
    deadline_seconds: int | None = setting(None, "Longest the TrainJob may run.", ge=1)


def trainjob_name(run_id: str, task: str, attempt: int | str) -> str:
    """A DNS-1035 name for one attempt of one task of one run: the task's name (cut
    short), a digest of run and task, and the attempt.

    Args:
        run_id, task: The pipeline run's id and the task's name (or id).
        attempt: A number from 0, or a string unique to it (the launcher pod's uid).

    Raises:
        ManifestError: An empty run id or task, or a negative attempt.
    """
    if not run_id or not task:
        raise ManifestError(f"trainjob_name needs a run id and a task, got {run_id!r}, {task!r}")
    if isinstance(attempt, int) and attempt < 0:
        raise ManifestError(f"attempt must be >= 0, got {attempt}")
    digest = hashlib.sha256(f"{run_id}\0{task}".encode()).hexdigest()[:10]
    tail = (f"a{attempt}" if isinstance(attempt, int)
            else "a" + hashlib.sha256(str(attempt).encode()).hexdigest()[:8])
    room = MAX_NAME - len(digest) - len(tail) - 2 - len("tj-")
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower())[:room].strip("-")
    name = "-".join(part for part in ("tj", slug, digest, tail) if part)
    if not DNS_1035.match(name) or len(name) > MAX_NAME:  # cannot happen: a guard for edits
        raise ManifestError(f"made an invalid TrainJob name {name!r}")
    return name


def secret_key_problems(keys: Sequence[str]) -> list[str]:
    """What is wrong with `keys` as the secret's keys of `S3_SECRET_KEYS`; empty if nothing."""
    if len(keys) != len(S3_SECRET_KEYS) or len(set(keys)) != len(keys):
        return [f"{list(keys)}: two different keys, of {' and '.join(S3_SECRET_KEYS)} in that "
                "order"]
    return [f"{key!r} is not a secret key name (letters, digits, -, _ and .)" for key in keys
            if not _SECRET_KEY.match(key) or key.startswith("..") or key == "."]


def _check_labels(labels: Mapping[str, str], what: str) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if (not _LABEL_NAME.match(name) or len(name) > 63 or len(prefix) > 253
                or (prefix and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", prefix))):
            raise ManifestError(f"{what} key {key!r} is not a Kubernetes label name")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise ManifestError(f"{what} {key}={value!r} is not a Kubernetes label value "
                                "(63 characters at most: letters, digits, -, _ and .)")


def _check_settings(name: str, nodes: Nodes, env: Mapping[str, str], manager: str) -> None:
    if not DNS_1035.match(name) or len(name) > 63:
        raise ManifestError(f"TrainJob name {name!r} must be a DNS-1035 label (Trainer 2.3)")
    check_settings(nodes, ManifestError)  # the bounds of its fields
    if len(f"{name}-{NODE}-0-{nodes.num_nodes - 1}") > 63:
        raise ManifestError(f"TrainJob name {name!r} is too long for {nodes.num_nodes} nodes: "
                            "JobSet refuses pod names over 63 characters")
    for what in ("cpu", "memory", *(["shm"] if nodes.shm else [])):
        if not QUANTITY.match(getattr(nodes, what)):
            raise ManifestError(f"{what} {getattr(nodes, what)!r} is not a Kubernetes quantity "
                                "(8, 7.5, 500m, 24Gi)")
    secret_keys = nodes.secret_keys if nodes.storage_secret else ()
    names = [*env, *(S3_SECRET_KEYS if secret_keys else ()),
             *([EXPECTED_GPUS_VARIABLE] if nodes.gpus else [])]
    reserved = sorted(set(names) & set(PET_VARIABLES))
    if reserved:
        raise ManifestError(f"env {reserved}: Trainer's torch runtime sets these on each node "
                            "and refuses a TrainJob that gives them")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ManifestError(f"env {repeated} given more than once")
    if secret_keys and secret_key_problems(secret_keys):
        raise ManifestError(f"storage secret keys {'; '.join(secret_key_problems(secret_keys))}")
    if not _DOMAIN_PATH.match(manager):
        raise ManifestError(f"runtime patch manager {manager!r} must be a domain-prefixed path "
                            "(such as acme.io/launcher)")


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` but the unset ones (None, an empty list or dict), as the models' `to_dict`
    leaves them out."""
    return {key: value for key, value in fields.items() if value not in (None, [], {})}


def _node_pod(nodes: Nodes, labels: Mapping[str, str]) -> dict[str, Any]:
    """The pod settings of the `node` replicated job (its runtime patch's template)."""
    shm = nodes.shm and {"medium": "Memory", "sizeLimit": nodes.shm}
    return {"metadata": {"labels": {**labels, ISTIO_INJECT: "false"}}, "spec": _present({
        "nodeSelector": dict(nodes.node_selector),
        "tolerations": [dict(toleration) for toleration in nodes.tolerations],
        "imagePullSecrets": [{"name": secret} for secret in nodes.image_pull_secrets],
        "serviceAccountName": nodes.service_account or None,
        "volumes": [{"name": SHM_VOLUME, "emptyDir": shm}] if shm else None,
        "containers": [{"name": NODE, "volumeMounts": [
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]}] if shm else None})}


def trainjob_manifest(nodes: Nodes, *, name: str, namespace: str, command: Sequence[str],
                      args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                      labels: Mapping[str, str] | None = None, owner_pod: str = "",
                      owner_uid: str = "", manager: str = DEFAULT_MANAGER) -> dict[str, Any]:
    """The TrainJob of `nodes.num_nodes` nodes, as a dict the Kubernetes API takes.

    Args:
        nodes: The nodes, what each holds, where its pods go, the runtime and the deadline.
        name, namespace: The job's (`trainjob_name`) and the run's.
        command, args, env: What each node runs, and the environment it runs in.
        labels: Labels of the TrainJob and of its node pods (`nodes.queue`: the job's only).
        owner_pod, owner_uid: The launcher pod owning the job; empty for none.
        manager: Who owns the runtime patch (a domain-prefixed path).

    Returns:
        The manifest (camelCase keys), as Trainer's models read it (`validate_manifest`).

    Raises:
        ManifestError: A setting the API or Trainer's webhook would refuse.
        pydantic.ValidationError: A value of a type the models do not take.
    """
    env, labels = dict(env or {}), dict(labels or {})
    job_labels = {**labels, **({QUEUE_LABEL: nodes.queue} if nodes.queue else {})}
    _check_settings(name, nodes, env, manager)
    _check_labels(job_labels, "label")
    _check_labels(dict(nodes.node_selector), "node selector")
    if bool(owner_pod) != bool(owner_uid):
        raise ManifestError("owner_pod and owner_uid go together (the launcher pod's name and "
                            f"uid), got {owner_pod!r}, {owner_uid!r}")
    gpus = nodes.gpus
    amounts = {"cpu": nodes.cpu, "memory": nodes.memory,
               **({GPU_RESOURCE: str(gpus)} if gpus else {})}
    variables = [{"name": key, "value": value} for key, value in env.items()]
    if gpus:
        variables.append({"name": EXPECTED_GPUS_VARIABLE, "value": str(gpus)})
    variables += [{"name": variable, "valueFrom": {"secretKeyRef": {
        "name": nodes.storage_secret, "key": key}}}
        for variable, key in zip(S3_SECRET_KEYS, nodes.secret_keys if nodes.storage_secret else ())]
    trainer = _present({
        "image": nodes.image, "command": list(command), "args": list(args), "env": variables,
        "numNodes": nodes.num_nodes, "numProcPerNode": nodes.procs_per_node or max(1, gpus),
        "resourcesPerNode": {"requests": amounts, "limits": dict(amounts)}})
    patch = {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": NODE, "template": {"spec": {
            "template": _node_pod(nodes, labels)}}}]}}}}
    manifest = {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": _present({"name": name, "namespace": namespace, "labels": job_labels,
                              "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                                   "name": owner_pod, "uid": owner_uid}]
                              if owner_pod else None}),
        "spec": _present({
            "runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime",
                           "name": nodes.runtime},
            "activeDeadlineSeconds": nodes.deadline_seconds, "trainer": trainer,
            "runtimePatches": [patch]})}
    validate_manifest(manifest)
    return manifest


def _differences(given: Any, read: Any, path: str = "") -> list[str]:
    """Where `read` (a manifest as the models read it back) differs from `given`."""
    if isinstance(given, Mapping) and isinstance(read, Mapping):
        return [problem for key in sorted(set(given) | set(read))
                for problem in (_differences(given.get(key), read.get(key), f"{path}.{key}")
                                if key in given and key in read else
                                [f"{path}.{key}: " + ("not a field of the models"
                                                      if key in given else "added")])]
    if isinstance(given, list) and isinstance(read, list) and len(given) == len(read):
        return [p for i, (a, b) in enumerate(zip(given, read))
                for p in _differences(a, b, f"{path}[{i}]")]
    return [] if given == read else [f"{path}: {given!r} is read as {read!r}"]


def validate_manifest(manifest: Mapping[str, Any]) -> None:
    """Reads a manifest through the installed release's typed models; refuses what they do not.

    Raises:
        ManifestError: A key the release's API lacks, or a value read as another (by path).
        pydantic.ValidationError: A value of a type the models do not take.
    """
    from kubeflow_trainer_api import __version__ as release
    from kubeflow_trainer_api import models as m

    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        raise ManifestError(f"not a {API_VERSION} {KIND}: apiVersion "
                            f"{manifest.get('apiVersion')!r}, kind {manifest.get('kind')!r}")
    read = m.TrainerV1alpha1TrainJob.from_dict(dict(manifest)).to_dict()
    problems = _differences(dict(manifest), read)
    if problems:
        raise ManifestError(f"the TrainJob has what Trainer {release}'s API does not: "
                            + "; ".join(problems))
