"""The transformer training step past one pod on Kubeflow: a pod without GPUs launching a
Kubeflow Trainer TrainJob of N nodes, whose pods are compiled into its inputs (KFP 2.14 has
no `TaskConfig` passthrough); it takes every input of the one-pod trainer too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.train_transformer import component as train_transformer
from components.train_transformer.multinode import SERVICE_ACCOUNT

# The steps a TrainJob runs past one pod on Kubeflow, and each one's launcher component.
LAUNCHERS: dict[str, Callable] = {
    "train_transformer": train_transformer.train_transformer_trainjob,
}
# Why each trainer without a TrainJob launcher stays one pod on Kubeflow.
ONE_POD = {
    "train_image": "the image trainer is TensorFlow (MultiWorkerMirroredStrategy) and Kubeflow "
                   "Trainer v2 has no TensorFlow runtime",
    "train_text": "the fastai text trainer trains in one process on one machine",
    "train_lm": "the fastai language model trains in one process on one machine",
}


def node_inputs(settings, step: str, image: str) -> dict[str, Any]:
    """The launcher's compiled inputs: the TrainJob's nodes as `settings` (the target's
    `KubeflowSettings`) place `step`'s pod, running `image`."""
    pod = settings.pods[step]
    selector, tolerations = settings.placement(pod)
    return {
        "num_nodes": settings.nodes[step], "procs_per_node": max(1, pod.gpu_count),
        "gpus_per_node": pod.gpu_count, "cpu_per_node": pod.cpu,
        "memory_per_node": pod.memory, "shm_per_node": pod.shm, "node_selector": selector,
        "tolerations": tolerations, "image_pull_secrets": list(settings.image_pull_secrets),
        "storage_secret": settings.storage_secret,
        "storage_secret_keys": list(settings.storage_secret_keys),
        "runtime": settings.trainjob_runtime, "node_image": image,
        "checkpoint_root": settings.checkpoint_root, "s3_endpoint": settings.s3_endpoint,
        "service_account": settings.trainjob_service_account,
        "queue_name": settings.kueue_queue,
        "pending_seconds": settings.trainjob_pending_seconds,
        "deadline_seconds": settings.timeout_seconds,
    }


def launcher_op(component, step: str, settings) -> Callable:
    """`step`'s launcher (in the one-pod `component`'s image), called as `component` is,
    with `node_inputs` compiled in."""
    from kfp import kubernetes

    from pipelines.definitions.steps import component as make

    image = component.component_spec.implementation.container.image
    op, inputs = make(LAUNCHERS[step], image), node_inputs(settings, step, image)

    def launch(**arguments):
        # the pod's own account, the nodes' unless `service_account` names another
        return kubernetes.use_field_path_as_env(op(**arguments, **inputs), SERVICE_ACCOUNT,
                                                "spec.serviceAccountName")

    return launch
