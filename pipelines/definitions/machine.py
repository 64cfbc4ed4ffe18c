"""One step's machines as compile.py's options give them, for both targets (here, so that a
Kubeflow compile imports no GCPC)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Machine:
    """One step's machines.

    Attributes:
        machine_type: Compute Engine machine type, e.g. "n1-standard-8".
        accelerator_type: e.g. "NVIDIA_TESLA_V100"; empty for none.
        accelerator_count: Accelerators per replica (ignored without a type).
        replica_count: Machines in the job; more than one runs multi-worker training.
        boot_disk_size_gb: Boot disk of each replica.
        scheduling_strategy: "standard", "spot", "flex-start" (Vertex); empty: `--spot`'s.
        max_wait: With flex-start, the longest wait for the machines ("2h", "86400s").
        reservation: "any", or projects/PROJECT/zones/ZONE/reservations/NAME (Vertex).
    """

    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0
    replica_count: int = 1
    boot_disk_size_gb: int = 100
    scheduling_strategy: str = ""
    max_wait: str = ""
    reservation: str = ""


# Where each step runs unless compile.py is told otherwise: sharding is CPU-bound, the
# image trainer gets the ancestor's 2 x V100, the text trainers fill one T4.
DEFAULT_MACHINES: Mapping[str, Machine] = {
    "shard": Machine("n1-highcpu-16"),
    "train_image": Machine("n1-standard-8", "NVIDIA_TESLA_V100", 2),
    "evaluate_image": Machine("n1-standard-4"),
    "prepare_text": Machine("n1-standard-4"),
    "train_text": Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1),
    "evaluate_text": Machine("n1-standard-4"),
    "train_lm": Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1),
    "train_transformer": Machine("n1-standard-8", "NVIDIA_TESLA_T4", 1),
    # batch prediction, when predict_uri is set; CPU unless given a GPU
    "predict_image": Machine("n1-standard-8"),
    "predict_text": Machine("n1-standard-4"),
}
# Steps that write TensorBoard series and checkpoints: only these get `--tensorboard` on
# Vertex, and keep checkpoints under `--checkpoint-root` and retry on Kubeflow.
TRAINING_STEPS = ("train_image", "train_text", "train_lm", "train_transformer")
# Accelerator-optimised machines' fixed GPU type and count (`vertex.CPU_MACHINE_TYPES`' table).
GPU_MACHINES: Mapping[str, tuple[str, int]] = {
    **{f"a2-highgpu-{n}g": ("NVIDIA_TESLA_A100", n) for n in (1, 2, 4, 8)},
    "a2-megagpu-16g": ("NVIDIA_TESLA_A100", 16),
    **{f"a2-ultragpu-{n}g": ("NVIDIA_A100_80GB", n) for n in (1, 2, 4, 8)},
    **{f"g2-standard-{n}": ("NVIDIA_L4", 1) for n in (4, 8, 12, 16, 32)},
    "g2-standard-24": ("NVIDIA_L4", 2), "g2-standard-48": ("NVIDIA_L4", 4),
    "g2-standard-96": ("NVIDIA_L4", 8),
    **{f"a3-highgpu-{n}g": ("NVIDIA_H100_80GB", n) for n in (1, 2, 4, 8)},
    "a3-megagpu-8g": ("NVIDIA_H100_MEGA_80GB", 8),
    "a3-ultragpu-8g": ("NVIDIA_H200_141GB", 8),
    "a4-highgpu-8g": ("NVIDIA_B200", 8),
}


def gpu_environment(machine: Machine) -> dict[str, str]:
    """What a step on `machine` is told of its GPUs, so that it fails at once when it
    cannot see them (`components.common.gpus`)."""
    from components.common.gpus import EXPECTED_GPUS_VARIABLE

    if not (machine.accelerator_type and machine.accelerator_count):
        return {}
    return {EXPECTED_GPUS_VARIABLE: str(machine.accelerator_count)}


# A3 Ultra and A4 machines boot from Hyperdisk only (Compute Engine); every other machine
# here takes Vertex's default pd-ssd (aiplatform_v1.DiskSpec).
HYPERDISK_MACHINE_PREFIXES = ("a3-ultragpu-", "a4-highgpu-")


def boot_disk_type(machine_type: str) -> str:
    """The boot disk type Vertex takes for `machine_type`."""
    if machine_type.startswith(HYPERDISK_MACHINE_PREFIXES):
        return "hyperdisk-balanced"
    return "pd-ssd"
