"""One step's machines as compile.py's options give them, for every target.

Vertex runs a step on these machines (`vertex`); Kubeflow sizes a pod from them
(`kubeflow`); the tuning job's trials take the training step's.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Machine:
    """One step's machines.

    Attributes:
        machine_type: Compute Engine machine type, e.g. "n1-standard-8".
        accelerator_type: e.g. "NVIDIA_TESLA_V100"; empty for none.
        accelerator_count: Accelerators per replica (ignored without a type).
        replica_count: Machines in the job; more than one runs multi-worker training.
        boot_disk_size_gb: Boot disk of each replica.
        scheduling_strategy: "standard", "spot" or "flex-start" (Vertex); empty follows
            `--spot` (`scheduling`).
        max_wait: With flex-start, the longest wait for the machines ("2h", "86400s").
        reservation: A Compute Engine reservation to run on (Vertex): "any", or
            projects/PROJECT/zones/ZONE/reservations/NAME.
    """

    machine_type: str
    accelerator_type: str = ""
    accelerator_count: int = 0
    replica_count: int = 1
    boot_disk_size_gb: int = 100
    scheduling_strategy: str = ""
    max_wait: str = ""
    reservation: str = ""


def gpu_environment(machine: Machine) -> dict[str, str]:
    """What a step on `machine` is told of its GPUs (`components.common.gpus`), so it fails
    at once when it cannot see them; empty on a machine without GPUs."""
    from components.common.gpus import EXPECTED_GPUS_VARIABLE

    if not (machine.accelerator_type and machine.accelerator_count):
        return {}
    return {EXPECTED_GPUS_VARIABLE: str(machine.accelerator_count)}


# Vertex's DiskSpec.boot_disk_type takes "pd-ssd" (its default), "pd-standard" or
# "hyperdisk-balanced", its default for A3 Ultra (aiplatform_v1.DiskSpec's docstring;
# https://cloud.google.com/vertex-ai/docs/reference/rest/v1/DiskSpec). A3 Ultra and A4
# machines boot from Hyperdisk only (Compute Engine); every other machine here takes pd-ssd.
HYPERDISK_MACHINE_PREFIXES = ("a3-ultragpu-", "a4-highgpu-")


def boot_disk_type(machine_type: str) -> str:
    """The boot disk type Vertex takes for `machine_type`'s family.

    Args:
        machine_type: Compute Engine machine type, e.g. "a3-ultragpu-8g".

    Returns:
        "hyperdisk-balanced" for A3 Ultra and A4 machines, else "pd-ssd".
    """
    if machine_type.startswith(HYPERDISK_MACHINE_PREFIXES):
        return "hyperdisk-balanced"
    return "pd-ssd"
