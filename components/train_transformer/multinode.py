"""The transformer step past one pod on Kubeflow: the launcher's side of the TrainJob.

With N > 1 replicas the step is a pod without GPUs (`component.train_transformer_trainjob`)
that stages the dataset where nodes can read it (a node has no credentials for KFP's
`minio://`), runs a TrainJob of N nodes (`node.py`) owned by this pod, and copies the model
node 0 uploaded into its `Output[Model]`. A retried step deletes the earlier attempt's job
(the task's label); its nodes resume from the checkpoints of the same task folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from components.common.storage import MOUNTED_VARIABLE, is_remote
from components.common.written import setting
from components.text_common.contract import TRAINING_METRICS_FILE
from components.train_transformer.node import COMMAND, copy_folder
from components.trainjob import launcher, spec

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
POD_NAME, POD_UID = "KFP_POD_NAME", "KFP_POD_UID"
# The launcher's own service account (`pipelines.definitions.kubeflow` sets it).
SERVICE_ACCOUNT = "KFP_SERVICE_ACCOUNT"
# The label every TrainJob of one task carries, all attempts (launcher.launch's selector).
TASK_LABEL = "vertex-gpu-pipelines/task"
TASK = "train-transformer"
# The TrainJob step's input of each `NodeSettings` field named otherwise.
STEP_INPUTS = {"gpus": "gpus_per_node", "cpu": "cpu_per_node", "memory": "memory_per_node",
               "shm": "shm_per_node", "secret_keys": "storage_secret_keys",
               "image": "node_image", "queue": "queue_name"}


@dataclasses.dataclass(frozen=True)
class NodeSettings(spec.Nodes):
    """The TrainJob's nodes, and where they keep their files: the launcher step's inputs of
    these names (or `STEP_INPUTS`'), their help each field's."""

    checkpoint_root: str = setting("", "gs:// or s3:// folder of the checkpoints, TensorBoard "
                                   "logs, the model node 0 uploads and the staged dataset.")
    s3_endpoint: str = setting("", "S3 API URL of MinIO or Ceph for the nodes; empty: AWS.")
    pending_seconds: int = setting(int(launcher.Timing.pending_seconds), "Longest a node pod "
                                   "may wait to be scheduled before the step fails.")


def task_folder(model_path: str) -> list[str]:
    """`[<run>, <task>]` of KFP's `.../<run>/<task>/model` (as `storage.run_folder` reads)."""
    return os.path.normpath(model_path).split(os.sep)[-3:-1]


def trainjob(settings: NodeSettings, *, dataset_uri: str, model_uri: str,
             config: Mapping[str, Any], tensorboard_dir: str, namespace: str,
             environ: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """The TrainJob of this attempt and the label selector of every job of the task.

    Args:
        environ: `KFP_POD_NAME` and `KFP_POD_UID` name the attempt and own the job (else
            attempt 0, no owner); `KFP_SERVICE_ACCOUNT`: the nodes' default account.
    """
    digest = hashlib.sha256(f"{model_uri}\0{TASK}".encode()).hexdigest()[:16]
    pod, uid = environ.get(POD_NAME, ""), environ.get(POD_UID, "")
    name = spec.trainjob_name(model_uri, TASK, uid or 0)
    owner = (name, namespace, pod, uid) if pod and uid else ()  # what node 0 watches
    env = {MOUNTED_VARIABLE: "0", **dict(zip(launcher.OWNER_VARIABLES, owner))}
    if settings.s3_endpoint:
        env["AWS_ENDPOINT_URL_S3"] = settings.s3_endpoint
    manifest = spec.trainjob_manifest(
        dataclasses.replace(settings, service_account=(
            settings.service_account or environ.get(SERVICE_ACCOUNT, ""))),
        name=name, namespace=namespace, command=COMMAND, env=env, labels={TASK_LABEL: digest},
        args=["--dataset-uri", dataset_uri, "--model-uri", model_uri,
              "--config", json.dumps(dict(config), sort_keys=True),
              "--checkpoint-root", settings.checkpoint_root,
              *(["--tensorboard-dir", tensorboard_dir] if tensorboard_dir else [])],
        owner_pod=pod if uid else "", owner_uid=uid if pod else "")
    return manifest, f"{TASK_LABEL}={digest}"


def stage_dataset(dataset_uri: str, dataset_path: str, root: str, task: Sequence[str]) -> str:
    """The dataset's s3:// or gs:// URI, else a copy under `<root>/datasets/<run>/<task>`."""
    if is_remote(dataset_uri):
        return dataset_uri
    staged = "/".join([root.rstrip("/"), "datasets", *task, "dataset"])
    copy_folder(dataset_path, staged)
    return staged


def train_on_nodes(settings: NodeSettings, *, dataset_uri: str, dataset_path: str,
                   model_path: str, config: Mapping[str, Any], tensorboard_dir: str = "",
                   api=None, namespace: str | None = None,
                   environ: Mapping[str, str] | None = None,
                   write: Callable[[str], None] | None = None,
                   timing: launcher.Timing | None = None) -> dict[str, Any]:
    """Runs the training as a TrainJob; returns its result with the model in `model_path`.

    Args:
        settings, config: The nodes; `TransformerConfig`'s fields.
        dataset_uri, dataset_path, model_path: The step's dataset (URI, local path), and its
            `Output[Model]` path.
        tensorboard_dir: The step's TensorBoard folder; empty: under the checkpoint root.
        api: A `kubernetes.client.ApiClient`; None: in-cluster.
        namespace, environ: The job's namespace and the launcher's environment; None: the
            pod's and `os.environ`.
        write, timing: `launcher.launch`'s; None: stdout and `settings.pending_seconds`.

    Returns:
        The training result (the model's metrics.json).

    Raises:
        components.trainjob.launcher.TrainJobError: The job failed or was cancelled.
    """
    environ = os.environ if environ is None else environ
    task = task_folder(model_path)
    root = settings.checkpoint_root.rstrip("/")
    model_uri = "/".join([root, "models", *task, "model"])
    staged = stage_dataset(dataset_uri, dataset_path, root, task)
    namespace = namespace or pathlib.Path(NAMESPACE_FILE).read_text().strip()  # the pod's
    manifest, selector = trainjob(settings, dataset_uri=staged, model_uri=model_uri,
                                  config=config, tensorboard_dir=tensorboard_dir,
                                  namespace=namespace, environ=environ)
    if api is None:
        from kubernetes import client
        from kubernetes import config as kube_config

        kube_config.load_incluster_config()
        api = client.ApiClient()
    launcher.launch(api, manifest, task_selector=selector, write=write,
                    timing=timing or launcher.Timing(
                        pending_seconds=settings.pending_seconds))
    copy_folder(model_uri, model_path)
    with open(os.path.join(model_path, TRAINING_METRICS_FILE)) as f:
        return json.load(f)
