"""The node contract of a TrainJob: Trainer's torchrun settings as the trainer reads them.

A contract (what a node is given), so a step's node entry point may import it.

Trainer 2.3's `torch-distributed` runtime gives each node's `node` container (its
`pkg/runtime/framework/plugins/torch/torch.go`, names in `pkg/constants`):

- `PET_NNODES`: the nodes of the job;
- `PET_NPROC_PER_NODE`: processes per node: the TrainJob's `numProcPerNode`, else `auto`
  (the GPUs), which Trainer itself turns into the node's CPUs when it has no GPU;
- `PET_NODE_RANK`: this node, from the Job's completion index annotation;
- `PET_MASTER_ADDR`: `<job>-node-0-0.<job>`, node 0's pod in the JobSet's headless service;
- `PET_MASTER_PORT`: 29500, the port Trainer opens on the node container.

The transformer trainer (`components.train_transformer.distributed`) reads the machines of a
job from `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` (machines, not processes) and `RANK`
(this machine), or Vertex's `CLUSTER_SPEC`, and its launcher starts one process per GPU on
each. `torchrun_environment` maps the one onto the other; it returns nothing where no
`PET_*` variable is set, so `environ = {**environ, **torchrun_environment(environ)}` is
safe on every target. `processes_per_node` resolves `PET_NPROC_PER_NODE` for the
launcher's `gpus` argument (which sets the processes it starts).
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
        `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` (nodes) and `RANK` (this node); empty
        when no `PET_*` variable is set (not a Trainer node).

    Raises:
        NodeEnvironmentError: Some `PET_*` variables are set but others missing or empty,
            a value is malformed (a rank outside the nodes, a port outside 1-65535,
            `PET_NPROC_PER_NODE` neither `auto` nor >= 1), or a trainer variable is
            already set to another value.
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
    """Processes to start on this node: `PET_NPROC_PER_NODE`, or for `auto` (and where it
    is not set) one per GPU, one on a machine without.

    Args:
        environ: The node's environment.
        gpus: GPUs this node sees (`torch.cuda.device_count()`).

    Raises:
        NodeEnvironmentError: The variable is neither `auto` nor a whole number >= 1.
    """
    raw = environ.get(NPROC, "").strip()
    if raw in ("", "auto"):
        return max(1, gpus)
    return _whole(environ, NPROC, 1)
