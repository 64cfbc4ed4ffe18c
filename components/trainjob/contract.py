"""The node contract of a TrainJob: Trainer 2.3's `PET_*` variables (torch-distributed
runtime) mapped onto the `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK` the trainer reads.
"""

from __future__ import annotations

from collections.abc import Mapping

NNODES, NPROC, NODE_RANK = "PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"
MASTER_ADDR, MASTER_PORT = "PET_MASTER_ADDR", "PET_MASTER_PORT"
PET_VARIABLES = (NNODES, NPROC, NODE_RANK, MASTER_ADDR, MASTER_PORT)


class NodeEnvironmentError(ValueError):
    """Trainer's node variables are incomplete or malformed; the message names them."""


def _whole(environ: Mapping[str, str], name: str, least: int) -> int:
    raw = environ[name].strip()
    if not (raw.isascii() and raw.isdigit()) or int(raw) < least:
        raise NodeEnvironmentError(f"{name}={environ[name]!r} must be a whole number >= {least}")
    return int(raw)


def torchrun_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The trainer's variables from a Trainer node's `PET_*` ones.

    Args:
        environ: The node's environment (`os.environ`).

    Returns:
        `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` and `RANK`; empty without `PET_*`.

    Raises:
        NodeEnvironmentError: Some `PET_*` variables missing, one malformed, or a trainer
            variable already set to another value.
    """
    present = [name for name in PET_VARIABLES if environ.get(name, "").strip()]
    if not present:
        return {}
    missing = [name for name in PET_VARIABLES if name not in present]
    if missing:
        raise NodeEnvironmentError(
            f"{', '.join(missing)} missing or empty beside {', '.join(present)}: not the "
            "environment Kubeflow Trainer's torch runtime gives a node")
    nodes = _whole(environ, NNODES, 1)
    rank = _whole(environ, NODE_RANK, 0)
    if rank >= nodes:
        raise NodeEnvironmentError(f"{NODE_RANK}={rank} is not within {NNODES}={nodes}")
    port = _whole(environ, MASTER_PORT, 1)
    if port > 65535:
        raise NodeEnvironmentError(f"{MASTER_PORT}={port} is not a port (1-65535)")
    processes_per_node(environ, 0)  # checks PET_NPROC_PER_NODE
    mapped = {"MASTER_ADDR": environ[MASTER_ADDR].strip(), "MASTER_PORT": str(port),
              "WORLD_SIZE": str(nodes), "RANK": str(rank)}
    clashes = [f"{name}={environ[name]!r} (Trainer's: {value!r})"
               for name, value in mapped.items() if environ.get(name, value) != value]
    if clashes:
        raise NodeEnvironmentError(f"{', '.join(clashes)}: set beside Trainer's PET_* "
                                   "variables to something else; drop it from the job's env")
    return mapped


def processes_per_node(environ: Mapping[str, str], gpus: int) -> int:
    """Processes to start on this node: `PET_NPROC_PER_NODE`, or (`auto`, unset) one per GPU.

    Args:
        environ, gpus: The node's environment and the GPUs it sees.

    Raises:
        NodeEnvironmentError: The variable is neither `auto` nor a whole number >= 1.
    """
    raw = environ.get(NPROC, "").strip()
    if raw in ("", "auto"):
        return max(1, gpus)
    return _whole(environ, NPROC, 1)
