"""The transformer training step past one pod on Kubeflow: a launcher of a TrainJob.

With `--target kubeflow` and `--train-transformer-replica-count N` (N > 1) the training
step runs `components.train_transformer.component.train_transformer_trainjob` in place of
the one-pod trainer: a pod without GPUs that creates a Kubeflow Trainer 2.3 TrainJob of N
nodes, follows it and copies its model into the step's output. KFP 2.14 (the oldest
backend supported) has no `TaskConfig` passthrough, so what each node holds is compiled
into the launcher's inputs (`node_inputs`): the pod the step would have been (CPU, memory,
/dev/shm, GPUs and their node selector and toleration, the spot pool), the pull secrets,
the storage secret and its keys, the checkpoint root, the S3 endpoint, the runtime, the
image, the nodes' service account (the launcher's own unless named: it learns it from the
downward API), the Kueue queue, how long a node may wait to be scheduled and the step
timeout as the job's deadline. The launcher takes every input of the one-pod trainer
too, so the pipeline body calls it alike.
"""

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
    """The launcher's compiled inputs: the TrainJob's nodes.

    Args:
        settings: The target's `kubeflow.KubeflowSettings` (its `nodes` name the step's).
        step: The step (a key of `LAUNCHERS`).
        image: The step's image, the nodes' too.
    """
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
    """The step's launcher, called as the one-pod `component` is (its inputs), the node
    settings compiled in.

    Args:
        component: The one-pod step's component (its image is the launcher's and the
            nodes').
        step: The step (a key of `LAUNCHERS`).
        settings: The target's `kubeflow.KubeflowSettings`.
    """
    from kfp import kubernetes

    from pipelines.definitions.steps import component as make

    image = component.component_spec.implementation.container.image
    op, inputs = make(LAUNCHERS[step], image), node_inputs(settings, step, image)

    def launch(**arguments):
        # the pod's own account, the nodes' unless `service_account` names another
        return kubernetes.use_field_path_as_env(op(**arguments, **inputs), SERVICE_ACCOUNT,
                                                "spec.serviceAccountName")

    return launch
