"""Where each step runs on open-source Kubeflow Pipelines: each step's pod, sized from the
same `Machine` options as Vertex's (`kfp-kubernetes`: the YAML's second document)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from components.common.gpus import EXPECTED_GPUS_VARIABLE
from components.common.storage import MOUNTED_VARIABLE
from components.train_transformer import component as train_transformer
from components.train_transformer.multinode import SERVICE_ACCOUNT
from components.trainjob.launcher import Timing
from components.trainjob.spec import DEFAULT_RUNTIME as DEFAULT_TRAINJOB_RUNTIME
from components.trainjob.spec import QUEUE_LABEL, S3_SECRET_KEYS
from pipelines.definitions.help_text import KUBEFLOW as KUBEFLOW_WORDS
from pipelines.definitions.machine import GPU_MACHINES, TRAINING_STEPS, Machine

# The steps a Kubeflow Trainer TrainJob runs past one pod, and each one's launcher: a pod
# without GPUs whose TrainJob's nodes are compiled into its inputs (KFP 2.14 has no
# `TaskConfig` passthrough); it takes every input of the one-pod trainer too.
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
# A Compute Engine machine family's GiB per vCPU (its machine type pages, read 2026-11).
GIB_PER_VCPU = {
    "n1-standard": 3.75, "n1-highmem": 6.5, "n1-highcpu": 0.9,
    "n2-standard": 4.0, "n2-highmem": 8.0, "n2-highcpu": 1.0,
    "e2-standard": 4.0, "e2-highmem": 8.0, "e2-highcpu": 1.0,
    "c2-standard": 4.0, "g2-standard": 4.0,
}
# Accelerator-optimised and memory-optimised machines: (vCPUs, GiB).
FIXED_SHAPES: Mapping[str, tuple[int, float]] = {
    **{f"a2-highgpu-{n}g": (12 * n, 85.0 * n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": (96, 1360.0),
    **{f"a2-ultragpu-{n}g": (12 * n, 170.0 * n) for n in (1, 2, 4, 8)},
    **{f"a3-highgpu-{n}g": (26 * n, 234.0 * n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": (208, 1872.0), "a3-ultragpu-8g": (224, 2952.0),
    "a4-highgpu-8g": (224, 3968.0),
    "m1-ultramem-40": (40, 961.0), "m1-ultramem-80": (80, 1922.0),
    "m1-ultramem-160": (160, 3844.0), "m1-megamem-96": (96, 1433.6),
}
# Left to the node (kubelet, daemon sets): a pod sized to the whole machine never schedules.
CPU_SHARE, CPU_KEPT = 0.9, 0.3
MEMORY_SHARE, MEMORY_KEPT_GIB = 0.85, 1.0
# /dev/shm (DataLoader workers and NCCL pass tensors through it): a quarter of the memory.
SHM_SHARE, SHM_MAX_GIB = 0.25, 16

# Vertex's GPU name -> GPU Feature Discovery's product label value (the name nvidia-smi
# prints, spaces as "-"); GKE's accelerator label value is the name in lowercase, "_" as "-".
_GFD_PRODUCTS = {
    "NVIDIA_TESLA_K80": "Tesla-K80", "NVIDIA_TESLA_P4": "Tesla-P4",
    "NVIDIA_TESLA_P100": "Tesla-P100-PCIE-16GB", "NVIDIA_TESLA_V100": "Tesla-V100-SXM2-16GB",
    "NVIDIA_TESLA_T4": "Tesla-T4", "NVIDIA_TESLA_A100": "NVIDIA-A100-SXM4-40GB",
    "NVIDIA_A100_80GB": "NVIDIA-A100-SXM4-80GB", "NVIDIA_L4": "NVIDIA-L4",
    "NVIDIA_H100_80GB": "NVIDIA-H100-80GB-HBM3", "NVIDIA_H100_MEGA_80GB":
    "NVIDIA-H100-80GB-HBM3", "NVIDIA_H200_141GB": "NVIDIA-H200", "NVIDIA_B200": "NVIDIA-B200",
}
# The labels that name a node's GPU type, each with its values.
GPU_LABELS: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "gfd": ("nvidia.com/gpu.product", _GFD_PRODUCTS),
    "gke": ("cloud.google.com/gke-accelerator",
            {gpu: gpu.lower().replace("_", "-") for gpu in _GFD_PRODUCTS}),
}
GPU_RESOURCE = "nvidia.com/gpu"
# The taint GPU node pools carry (GKE: nvidia.com/gpu=present:NoSchedule), any value.
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# GKE's spot node pools; EKS' and AKS' are given as options.
GKE_SPOT_SELECTOR = "cloud.google.com/gke-spot=true"
GKE_SPOT_TOLERATION = "cloud.google.com/gke-spot=true:NoSchedule"
SHM_VOLUME = "dshm"
# A failed training pod starts again after 60 s, then 120 s, ... (Argo's back-off).
RETRY_BACKOFF_S, RETRY_FACTOR = 60, 2
# What an attempt may wait to be scheduled, in the retries' bound (a GPU node scaled up).
RETRY_SCHEDULING_S = 3600
# The quantities KFP's own setters take (PipelineTask.set_cpu_limit, set_memory_limit).
CPU_QUANTITY = re.compile(r"^([0-9]*[.])?[0-9]+m?$")
MEMORY_QUANTITY = re.compile(r"^[0-9]+(E|Ei|P|Pi|T|Ti|G|Gi|M|Mi|K|Ki)?$")
DOCS = "docs/kubeflow.md"
NO_REGISTRY = ("The model cleared the registration gate, but the run names no tracking_uri: "
               "nothing was registered. Set tracking_uri to an MLflow server with a Model "
               f"Registry to register it and get its KServe InferenceService ({DOCS}).")


@dataclasses.dataclass(frozen=True)
class PodResources:
    """One step's pod: requests (= limits) as quantities ("6.9", "24Gi"), /dev/shm counted
    inside `memory`, and its GPUs (Vertex's GPU name)."""

    cpu: str
    memory: str
    shm: str
    gpu_type: str = ""
    gpu_count: int = 0


def _quantity_mib(quantity: str) -> float:
    """A memory quantity (MEMORY_QUANTITY) in MiB, for sizing /dev/shm inside it."""
    return float(parse_quantity(quantity)) / 2**20


def pod_resources(step: str, machine: Machine, cpu: str = "", memory: str = "",
                  shm: str = "") -> PodResources:
    """The pod of `step` on `machine`, each quantity from the machine unless given.

    Args:
        step: A key of DEFAULT_MACHINES (names the options in messages).
        machine: The step's machine options, as for Vertex.
        cpu: `--<step>-cpu`, given directly; empty: from the machine.
        memory: `--<step>-memory`, as `cpu`.
        shm: `--<step>-shm-size`, as `cpu`.

    Raises:
        ValueError: Naming the option: an unknown machine type without CPU and memory, a
            malformed quantity, or a /dev/shm that does not fit in the memory.
    """
    flag = "--" + step.replace("_", "-")
    if cpu and not CPU_QUANTITY.match(cpu):
        raise ValueError(f"{flag}-cpu {cpu!r} is not a CPU quantity KFP takes "
                         "(cores or millicores: 8, 7.5, 500m)")
    for name, value in (("memory", memory), ("shm-size", shm)):
        if value and not MEMORY_QUANTITY.match(value):
            raise ValueError(f"{flag}-{name} {value!r} is not a memory quantity KFP takes "
                             "(a whole number with an optional unit: 24Gi, 1536Mi)")
    shape = FIXED_SHAPES.get(machine.machine_type)  # (vCPUs, GiB)
    family, _, size = machine.machine_type.rpartition("-")
    if shape is None and family in GIB_PER_VCPU and size.isdigit():
        shape = int(size), GIB_PER_VCPU[family] * int(size)
    if shape is None and not (cpu and memory):
        raise ValueError(f"{flag}-machine-type {machine.machine_type!r} has no known size: give "
                         f"{flag}-cpu and {flag}-memory (the pod's request, below a node's "
                         "allocatable capacity)")
    vcpus, gib = shape or (0, 0.0)
    cpu = cpu or f"{math.floor((vcpus * CPU_SHARE - CPU_KEPT) * 10) / 10:g}"
    memory = memory or f"{max(1, math.floor(gib * MEMORY_SHARE - MEMORY_KEPT_GIB))}Gi"
    memory_mib = _quantity_mib(memory)
    shm_mib = math.floor(min(SHM_MAX_GIB * 1024, memory_mib * SHM_SHARE))
    shm = shm or (f"{shm_mib // 1024}Gi" if shm_mib % 1024 == 0 else f"{shm_mib}Mi")
    if _quantity_mib(shm) >= memory_mib or _quantity_mib(shm) < 1:
        raise ValueError(f"{flag}-shm-size {shm} must be at least 1Mi and less than the pod's "
                         f"memory {memory}: /dev/shm is memory the pod's limit counts")
    gpu_type, gpu_count = machine.accelerator_type, machine.accelerator_count
    if machine.machine_type in GPU_MACHINES and not gpu_type:
        gpu_type, gpu_count = GPU_MACHINES[machine.machine_type]
    return PodResources(cpu=cpu, memory=memory, shm=shm,
                        gpu_type=gpu_type if gpu_count else "", gpu_count=gpu_count if gpu_type
                        else 0)


@dataclasses.dataclass(frozen=True)
class KubeflowSettings:
    """Settings of every pod the pipeline starts; the fields not listed are compile.py's
    Kubeflow options of the same names (`kubeflow_options`).

    Attributes:
        pods: Step name (a key of DEFAULT_MACHINES) to its pod.
        gpu_label: Node label naming the GPU type; empty: any GPU node.
        gpu_products: Vertex GPU name -> that label's value.
        timeout_seconds: Longest a step may run (the pod's activeDeadlineSeconds).
        nodes: Steps run past one pod (`LAUNCHERS`) -> their TrainJob's nodes.
    """

    pods: Mapping[str, PodResources]
    gpu_label: str = GPU_LABELS["gfd"][0]
    gpu_products: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: dict(GPU_LABELS["gfd"][1]))
    spot: bool = False
    spot_selectors: tuple[tuple[str, str], ...] = ()
    spot_tolerations: tuple[Mapping[str, str], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    timeout_seconds: int = 604800
    checkpoint_root: str = ""
    storage_secret: str = ""
    storage_secret_keys: tuple[str, ...] = S3_SECRET_KEYS
    s3_endpoint: str = ""
    training_retries: int = 0
    nodes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    trainjob_runtime: str = DEFAULT_TRAINJOB_RUNTIME
    trainjob_service_account: str = ""
    trainjob_pending_seconds: int = int(Timing.pending_seconds)
    kueue_queue: str = ""

    # What `Steps` asks of a target (steps.Target).
    default_job_account = ""
    words = KUBEFLOW_WORDS

    def wrap(self, component: Callable, step: str, display_name: str) -> Callable:
        """The component as it is (`place` sizes its pod), or past one pod the launcher of
        its TrainJob (`LAUNCHERS`, in the component's image), called as the component is,
        with the TrainJob's nodes compiled in as `place` would place `step`'s pod."""
        if self.nodes.get(step, 1) <= 1:
            return component
        from kfp import kubernetes

        from pipelines.definitions.steps import component as make

        image = component.component_spec.implementation.container.image
        pod, op = self.pods[step], make(LAUNCHERS[step], image)
        selector, tolerations = self.placement(pod)
        nodes = {
            "num_nodes": self.nodes[step], "procs_per_node": max(1, pod.gpu_count),
            "gpus_per_node": pod.gpu_count, "cpu_per_node": pod.cpu,
            "memory_per_node": pod.memory, "shm_per_node": pod.shm, "node_selector": selector,
            "tolerations": tolerations, "image_pull_secrets": list(self.image_pull_secrets),
            "storage_secret": self.storage_secret,
            "storage_secret_keys": list(self.storage_secret_keys),
            "runtime": self.trainjob_runtime, "node_image": image,
            "checkpoint_root": self.checkpoint_root, "s3_endpoint": self.s3_endpoint,
            "service_account": self.trainjob_service_account, "queue_name": self.kueue_queue,
            "pending_seconds": self.trainjob_pending_seconds,
            "deadline_seconds": self.timeout_seconds,
        }

        def launch(**arguments):
            # the pod's own account, the nodes' unless `service_account` names another
            return kubernetes.use_field_path_as_env(op(**arguments, **nodes), SERVICE_ACCOUNT,
                                                    "spec.serviceAccountName")

        return launch

    def job(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Nothing: the run's service account is chosen when it is submitted."""
        return {}

    def preflight_inputs(self) -> dict[str, str]:
        """Nothing: no compile-time setting for the preflight to check."""
        return {}

    def search(self, trainer: Callable, kind: str, tune, step: str, display_name: str,
               image: str) -> Callable:
        """The tuning variant's search, with no tuning service to run it: the points drawn
        here (random search, `tune.seed`), each a trial pod of the training step in a
        ParallelFor running the trainer's trial step (the training task's inputs and the
        point's, the same code), then the selection step (`display_name`) whose best values
        the training takes. A trial is not resumable: a failed trial is a result."""
        from kfp import dsl

        from components.tune.component import SELECT_TRIAL, TRIAL
        from components.tune.contract import TUNABLE, draw_points
        from components.tune.task_trial import GOAL_INPUT, METRIC_INPUT, POINT_INPUT, TRIAL_ID
        from pipelines.definitions.steps import component

        space = tune.spaces[kind]
        # Each point carries its trial's number: dsl.Collected promises no order.
        points = [{TRIAL_ID: number, **point} for number, point
                  in enumerate(draw_points(space, tune.max_trials, tune.seed), start=1)]
        trial_op = component(TRIAL[kind], image)
        select_op = component(SELECT_TRIAL[kind], image)

        def search(training: dict, job: dict) -> dict:
            # No display name for the loop: the 2.14/2.15 driver records a loop under its
            # display name, and `Collected` finds it by task key (kubeflow/pipelines#13239,
            # fixed in 2.16 by #12808); KFP's default name is the task key.
            with dsl.ParallelFor(points, parallelism=tune.parallel_trials) as point:
                trial = self.place(trial_op(**training, **job, **{
                    POINT_INPUT: point, METRIC_INPUT: space.metric, GOAL_INPUT: space.goal,
                }).set_display_name("trial"), step, resumable=False)
            best = select_op(results=dsl.Collected(trial.outputs["Output"]), goal=space.goal,
                             max_failed_trials=tune.max_failed_trials,
                             **{name: training[name] for name in TUNABLE[kind]},
                             ).set_display_name(display_name)
            self.place(best, "")
            return {**training, **{name: best.outputs[name] for name in TUNABLE[kind]}}

        return search

    def registration(self, kind: str, image: str) -> Callable:
        """A model that clears the gate (`add` runs under its condition): a version in
        `tracking_uri`'s MLflow Model Registry with its KServe InferenceService, or a step
        saying nothing was registered."""
        from kfp import dsl

        from components.register.component import register_in_mlflow, registration_skipped
        from pipelines.definitions.steps import component

        op, skipped = component(register_in_mlflow, image), component(registration_skipped,
                                                                      image)

        def add(params: Mapping[str, Any], model) -> None:
            with dsl.If(params["tracking_uri"] != "", name="registry-named"):
                task = op(model=model, tracking_uri=params["tracking_uri"],
                          model_display_name=params["model_display_name"], kind=kind,
                          serving_image="" if kind == "image" else image,
                          run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER)
                # the registry changes between runs: never a cached registration
                self.place(task.set_display_name("register-model").set_caching_options(False), "")
            with dsl.Else(name="no-registry"):
                self.place(skipped(reason=NO_REGISTRY).set_display_name("nothing-registered"), "")

        return add

    def place(self, task, step: str, resumable: bool = True):
        """Puts `task` on its nodes: pull secrets, timeout, storage and Kueue for all; a
        step with machines (`step`) its pod's resources and `placement`; a `resumable`
        training step (not a trial: a failed trial is a result) retries and checkpoints."""
        from kfp import kubernetes

        if self.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, list(self.image_pull_secrets))
        kubernetes.set_timeout(task, self.timeout_seconds)
        # KFP's /gcs is a scratch folder the launcher fills, not Vertex's bucket mount
        task.set_env_variable(MOUNTED_VARIABLE, "0")
        if self.storage_secret:
            kubernetes.use_secret_as_env(task, self.storage_secret,
                                         dict(zip(self.storage_secret_keys, S3_SECRET_KEYS)))
            without_default_optional(task)
        if self.kueue_queue:  # Kueue's pod integration admits each step pod alone
            kubernetes.add_pod_label(task, QUEUE_LABEL, self.kueue_queue)
        if self.s3_endpoint:
            # S3's own variable: other AWS clients in the pod (STS) keep their endpoints
            task.set_env_variable("AWS_ENDPOINT_URL_S3", self.s3_endpoint)
        if step in TRAINING_STEPS and resumable and self.training_retries:
            task.set_retry(self.training_retries, backoff_duration=f"{RETRY_BACKOFF_S}s",
                           backoff_factor=RETRY_FACTOR, backoff_max_duration=(
                               f"{retry_window(self.training_retries, self.timeout_seconds)}s"))
        if step in TRAINING_STEPS and self.checkpoint_root and resumable:
            root = self.checkpoint_root.rstrip("/")
            # The trainers' own contract (Vertex's names); never the /gcs scratch folder.
            task.set_env_variable("AIP_CHECKPOINT_DIR", f"{root}/checkpoints")
            task.set_env_variable("AIP_TENSORBOARD_LOG_DIR", f"{root}/tensorboard")
        if not step or self.nodes.get(step, 1) > 1:  # a TrainJob's launcher holds no GPU
            return task
        pod = self.pods[step]
        task.set_cpu_request(pod.cpu).set_cpu_limit(pod.cpu)
        task.set_memory_request(pod.memory).set_memory_limit(pod.memory)
        kubernetes.empty_dir_mount(task, volume_name=SHM_VOLUME, mount_path="/dev/shm",
                                   medium="Memory", size_limit=pod.shm)
        if pod.gpu_count:
            task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(pod.gpu_count)
            task.set_env_variable(EXPECTED_GPUS_VARIABLE, str(pod.gpu_count))
        selector, tolerations = self.placement(pod)
        for key, value in selector.items():
            kubernetes.add_node_selector(task, key, value)
        for toleration in tolerations:
            kubernetes.add_toleration(task, **toleration)
        return task

    def placement(self, pod: PodResources) -> tuple[dict[str, str], list[dict[str, str]]]:
        """The node selector and tolerations of `pod` (its GPUs, the spot pool)."""
        selector, tolerations = {}, []
        if pod.gpu_count:
            if self.gpu_label:
                selector[self.gpu_label] = self.gpu_products[pod.gpu_type]
            tolerations.append(dict(GPU_TOLERATION))
        if self.spot:
            selector.update(dict(self.spot_selectors))
            tolerations += [dict(toleration) for toleration in self.spot_tolerations]
        return selector, tolerations


def retry_window(retries: int, timeout_seconds: int) -> int:
    """Argo's `backoff.maxDuration` in seconds for a step retried `retries` times, each
    attempt at its full `timeout_seconds` plus `RETRY_SCHEDULING_S`, and every back-off
    (KFP's default 3600 s, counted from the first start, would end a training's retries)."""
    backoffs = sum(RETRY_BACKOFF_S * RETRY_FACTOR ** attempt for attempt in range(retries))
    return (retries + 1) * (timeout_seconds + RETRY_SCHEDULING_S) + math.ceil(backoffs)


def without_default_optional(task) -> None:
    """Drops kfp-kubernetes 2.17's `secretAsEnv[].optional: false` (the default) from
    `task`: KFP 2.14's API server does not know it and refuses it (`tools.kfp_backends`)."""
    for entry in task.platform_config.get("kubernetes", {}).get("secretAsEnv", []):
        if entry.get("optional") is False:
            del entry["optional"]


def gpu_problems(step: str, machine: Machine, pod: PodResources, label: str,
                 products: Mapping[str, str]) -> list[str]:
    """What cannot place `step`'s GPUs: a count without a type (or the reverse), or a GPU
    type without a known node label value."""
    flag = "--" + step.replace("_", "-")
    if machine.accelerator_count < 0:
        return [f"{flag}-accelerator-count must be >= 0, got {machine.accelerator_count}"]
    if bool(machine.accelerator_type) != bool(machine.accelerator_count) and \
            machine.machine_type not in GPU_MACHINES:
        return [f"{flag}-accelerator-type and {flag}-accelerator-count go together (a GPU "
                f"type and at least one), got {machine.accelerator_type!r} x "
                f"{machine.accelerator_count}"]
    if pod.gpu_type and label and pod.gpu_type not in products:
        return [f"{flag}-accelerator-type {pod.gpu_type!r}: no {label} value known for it; "
                f"give --gpu-product {pod.gpu_type}=VALUE (known: {sorted(products)})"]
    return []


def replica_problems(machines: Mapping[str, Machine], checkpoint_root: str = "",
                     tuned: tuple[str, ...] = ()) -> list[str]:
    """Replicas past one pod that cannot run: only `LAUNCHERS`' steps have them,
    not in a tuning variant (`tuned` steps), and only with `checkpoint_root`."""
    problems = []
    for step, machine in machines.items():
        flag = f"--{step.replace('_', '-')}-replica-count {machine.replica_count}"
        if machine.replica_count <= 1:
            continue
        if step not in LAUNCHERS:
            why = ONE_POD.get(step, "a step that is no trainer: more pods would race on its "
                                    "outputs")
            problems.append(f"{flag}: a Kubeflow step is one pod here ({why}); use all the "
                            f"GPUs of one node ({DOCS})")
            continue
        if step in tuned:
            problems.append(f"{flag}: the tuning variant's trials stay one pod each, and a "
                            "Kubeflow Trainer TrainJob runs the plain pipeline's training only: "
                            "compile the tuning variant without replicas (--pipelines "
                            f"transformer_pipeline leaves it out; {DOCS})")
        if not checkpoint_root:
            problems.append(f"{flag}: a TrainJob's nodes keep their checkpoints and hand the "
                            "model over under --checkpoint-root (gs:// or s3://): give it")
    return problems
