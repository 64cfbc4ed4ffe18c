"""Where each step runs on Vertex: machine specs baked into the compiled JSON.

Machine settings cannot be pipeline parameters: GCPC's custom-job wrapper bakes them
into `worker_pool_specs` at compile time (kubeflow/pipelines#10902), so they are
`compile.py` options. Locally (`kfp.local`) the same components run unwrapped.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

from google_cloud_pipeline_components.v1.custom_job import (
    create_custom_training_job_from_component,
)


@dataclasses.dataclass(frozen=True)
class Machine:
    """One step's machines.

    Attributes:
        machine_type: Compute Engine machine type, e.g. "n1-standard-8".
        accelerator_type: e.g. "NVIDIA_TESLA_V100"; empty for none.
        accelerator_count: Accelerators per replica (ignored without a type).
        replica_count: Machines in the job; more than one runs multi-worker training.
        boot_disk_size_gb: Boot disk of each replica.
    """

    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0
    replica_count: int = 1
    boot_disk_size_gb: int = 100


# Where each step runs unless compile.py is told otherwise. Sharding is CPU-bound
# (many cores, no GPU); the image trainer gets the ancestor's 2 x V100; the text
# trainer and the language model a T4 each (an AWD-LSTM does not fill a bigger GPU);
# evaluation is small.
DEFAULT_MACHINES: Mapping[str, Machine] = {
    "shard": Machine("n1-highcpu-16"),
    "train_image": Machine("n1-standard-8", "NVIDIA_TESLA_V100", 2),
    "evaluate_image": Machine("n1-standard-4"),
    "prepare_text": Machine("n1-standard-4"),
    "train_text": Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1),
    "evaluate_text": Machine("n1-standard-4"),
    "train_lm": Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1),
    # batch prediction, when predict_uri is set; CPU unless given a GPU
    "predict_image": Machine("n1-standard-8"),
    "predict_text": Machine("n1-standard-4"),
}


# Steps whose code uses several replicas (multi-worker training); in any other step
# extra replicas would all run the same step and race on its outputs.
MULTI_REPLICA_STEPS = ("train_image",)
# Steps that write per-epoch TensorBoard series; only these get `--tensorboard` (the
# others write none, and an idle uploader would only add a run to the instance).
TRAINING_STEPS = ("train_image", "train_text", "train_lm")
# Machine families that carry each GPU (Vertex rejects other pairs when the job starts).
GPU_MACHINE_FAMILIES = {
    "NVIDIA_TESLA_K80": ("n1",), "NVIDIA_TESLA_P4": ("n1",), "NVIDIA_TESLA_P100": ("n1",),
    "NVIDIA_TESLA_V100": ("n1",), "NVIDIA_TESLA_T4": ("n1",), "NVIDIA_TESLA_A100": ("a2",),
    "NVIDIA_A100_80GB": ("a2",), "NVIDIA_L4": ("g2",), "NVIDIA_H100_80GB": ("a3",),
    "NVIDIA_H100_MEGA_80GB": ("a3",), "NVIDIA_H200_141GB": ("a3",), "NVIDIA_B200": ("a4",),
}
GPU_COUNTS = (1, 2, 4, 8, 16)
_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")


def machine_problems(step: str, machine: Machine) -> list[str]:
    """What Vertex (or this step) would reject in `machine`, each naming the option.

    Accelerator names are checked against Vertex's own `AcceleratorType` enum.

    Args:
        step: A key of DEFAULT_MACHINES (names the `--<step>-...` options in messages).
        machine: The step's machines.

    Returns:
        One message per problem; empty when the machines are fine.
    """
    from google.cloud.aiplatform_v1 import AcceleratorType

    flag = "--" + step.replace("_", "-")
    problems = []
    if not _MACHINE_TYPE.match(machine.machine_type or ""):
        problems.append(f"{flag}-machine-type {machine.machine_type!r} is not a Compute Engine "
                        "machine type (e.g. n1-standard-8)")
    kind = machine.accelerator_type
    gpus = sorted(name for name in AcceleratorType.__members__ if name.startswith("NVIDIA_"))
    if kind and kind not in gpus:
        problems.append(f"{flag}-accelerator-type {kind!r} is not a Vertex GPU type; one of "
                        f"{gpus}")
    elif kind:
        if machine.accelerator_count not in GPU_COUNTS:
            problems.append(f"{flag}-accelerator-count must be one of {GPU_COUNTS} with "
                            f"{flag}-accelerator-type {kind}, got {machine.accelerator_count}")
        families = GPU_MACHINE_FAMILIES.get(kind, ())
        family = (machine.machine_type or "").split("-")[0]
        if families and family not in families:
            problems.append(f"{flag}-machine-type {machine.machine_type!r} cannot carry {kind}: "
                            f"it needs a {'/'.join(families)} machine")
    elif machine.accelerator_count != 0:
        problems.append(f"{flag}-accelerator-count {machine.accelerator_count} needs "
                        f"{flag}-accelerator-type (or set the count to 0)")
    if machine.replica_count < 1:
        problems.append(f"{flag}-replica-count must be >= 1, got {machine.replica_count}")
    elif machine.replica_count > 1 and step not in MULTI_REPLICA_STEPS:
        problems.append(f"{flag}-replica-count must be 1: only {MULTI_REPLICA_STEPS} train on "
                        "several machines")
    if not 100 <= machine.boot_disk_size_gb <= 64000:
        problems.append(f"{flag}-boot-disk-size-gb must be in 100..64000, got "
                        f"{machine.boot_disk_size_gb}")
    return problems


@dataclasses.dataclass(frozen=True)
class VertexSettings:
    """Settings of every custom job the pipeline starts.

    Attributes:
        machines: Step name (a key of DEFAULT_MACHINES) to its machines.
        spot: Use Spot VMs (cheaper, may be preempted; training resumes from checkpoints).
        restart_job_on_worker_restart: Restart the whole job when a worker restarts; always
            on for jobs of several replicas.
        service_account: Service account the jobs run as; empty for the default.
        network: VPC network for peering, `projects/NUMBER/global/networks/NAME`.
        encryption_spec_key_name: Cloud KMS key (CMEK) for the jobs' resources.
        base_output_directory: gs:// folder for job outputs; makes Vertex set AIP_MODEL_DIR,
            AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR.
        timeout: Longest a job may run, e.g. "86400s".
        serving_image: Prediction image (pinned) of models uploaded to the Model Registry;
            empty: no upload step is compiled in.
        tensorboard: Vertex AI TensorBoard the training jobs (TRAINING_STEPS) upload
            AIP_TENSORBOARD_LOG_DIR to, `projects/P/locations/R/tensorboards/ID`; empty for none.
    """

    machines: Mapping[str, Machine] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_MACHINES))
    spot: bool = False
    restart_job_on_worker_restart: bool = False
    service_account: str = ""
    network: str = ""
    encryption_spec_key_name: str = ""
    base_output_directory: str = ""
    timeout: str = "604800s"
    serving_image: str = ""
    tensorboard: str = ""

    def wrap(self, component: Callable, step: str, display_name: str) -> Callable:
        """`as_custom_job` with this step's machines (and the TensorBoard, if it trains)."""
        return as_custom_job(component, self.machines[step], self, display_name,
                             tensorboard=self.tensorboard if step in TRAINING_STEPS else "")


def as_custom_job(component: Callable, machine: Machine, settings: VertexSettings,
                  display_name: str, tensorboard: str = "") -> Callable:
    """Wraps a component so it runs as a Vertex custom training job on `machine`.

    Args:
        component: A KFP component (never a task: kubeflow/pipelines#10418).
        machine: The machines it runs on.
        settings: Job-wide settings.
        display_name: Name of the custom job in the console.
        tensorboard: Vertex AI TensorBoard the job uploads its TensorBoard logs to; empty for
            none. Vertex then needs `settings.service_account` and `base_output_directory`.

    Returns:
        A component whose `worker_pool_specs` default carries the machine spec.
    """
    return create_custom_training_job_from_component(
        component,
        display_name=display_name,
        machine_type=machine.machine_type,
        accelerator_type=machine.accelerator_type,
        accelerator_count=machine.accelerator_count,
        replica_count=machine.replica_count,
        boot_disk_size_gb=machine.boot_disk_size_gb,
        strategy="SPOT" if settings.spot else "STANDARD",
        # Multi-worker all-reduce cannot go on without a lost worker: restart them all,
        # and every replica resumes from the shared checkpoints.
        restart_job_on_worker_restart=(settings.restart_job_on_worker_restart
                                       or machine.replica_count > 1),
        service_account=settings.service_account,
        network=settings.network,
        encryption_spec_key_name=settings.encryption_spec_key_name,
        base_output_directory=settings.base_output_directory,
        tensorboard=tensorboard,
        timeout=settings.timeout,
    )
