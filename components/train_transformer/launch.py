"""Runs the transformer trainer as one process per GPU on each replica of the job.

The replicas are torchrun's `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` and `RANK` when all
four are set, else Vertex's `CLUSTER_SPEC` (workerpool0's primary is rank 0, then
workerpool1's). A lone CPU or GPU trains in this process; otherwise torch's `elastic_launch`
starts one process per GPU. Replicas meet at the primary's address (static rendezvous:
Vertex's ranks, so rank 0, which writes every output, runs where KFP keeps them); the others
return None.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from components.common import preemption
from components.common.gpus import require_torch_gpus
from components.train_transformer.contract import TransformerConfig

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_TRAINING_POOLS = ("workerpool0", "workerpool1")  # primary, then workers


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The machines of a job, as this replica sees them: the rank 0 replica's host and port
    (the rendezvous), the replicas, and this one's place among them from 0."""

    master_addr: str
    master_port: int
    nodes: int
    node_rank: int

    def __post_init__(self) -> None:
        if not 0 <= self.node_rank < self.nodes:
            raise ValueError(f"node_rank {self.node_rank} is not within {self.nodes} replica(s)")


def _from_cluster_spec(text: str) -> Cluster | None:
    try:
        spec = json.loads(text)
        cluster, task = spec["cluster"], spec["task"]
        pools = [(name, list(cluster.get(name) or [])) for name in _TRAINING_POOLS]
        index = int(task.get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"CLUSTER_SPEC is not Vertex's cluster spec ({err}): {text[:200]}") \
            from err
    if cluster.get("workerpool2"):
        raise ValueError("CLUSTER_SPEC has parameter servers or a reduction server "
                         "(workerpool2): PyTorch DDP uses none; drop that worker pool")
    hosts = [host for _, members in pools for host in members]
    if len(hosts) < 2:
        return None
    offsets = {"workerpool0": 0, "workerpool1": len(pools[0][1])}
    if task.get("type") not in offsets:
        raise ValueError(f"CLUSTER_SPEC task type {task.get('type')!r} is not a training "
                         f"replica ({', '.join(_TRAINING_POOLS)})")
    addr, _, port = hosts[0].rpartition(":")
    if not addr or not port.isdigit():
        raise ValueError(f"CLUSTER_SPEC's primary replica {hosts[0]!r} is not host:port")
    return Cluster(addr, int(port), len(hosts), offsets[task["type"]] + index)


def cluster_from_environment(environ: Mapping[str, str]) -> Cluster | None:
    """The job's replicas from the environment (`os.environ`), or None for one machine.

    Raises:
        ValueError: Malformed variables, or a cluster DDP cannot use (naming the variable).
    """
    if all(environ.get(name) for name in TORCHRUN_VARIABLES):
        try:
            nodes, rank = int(environ["WORLD_SIZE"]), int(environ["RANK"])
            port = int(environ["MASTER_PORT"])
        except ValueError as err:
            raise ValueError(f"WORLD_SIZE, RANK and MASTER_PORT must be integers: {err}") \
                from err
        return Cluster(environ["MASTER_ADDR"], port, nodes, rank) if nodes > 1 else None
    if environ.get("CLUSTER_SPEC"):
        return _from_cluster_spec(environ["CLUSTER_SPEC"])
    return None


# The rendezvous store's key prefix, the same on every replica (torch's own is random).
RUN_ID = "train_transformer"


def launched_process(job: tuple[str, str, TransformerConfig, dict[str, Any]]) -> dict[str, Any]:
    """One process of the launcher's: the trainer on `job`, `train_transformer`'s arguments
    as one tuple (torch rewrites string arguments); its result."""
    from components.train_transformer.training import train_transformer

    dataset_dir, model_dir, config, kwargs = job
    return train_transformer(dataset_dir, model_dir, config, **kwargs)


def launch_config(cluster: Cluster | None, procs: int) -> LaunchConfig:
    """torch's launch settings: `procs` processes on each of the cluster's machines (None:
    this machine alone)."""
    from torch.distributed.launcher.api import LaunchConfig

    # No restarts: a failure fails the job at once; a restarted job resumes from checkpoints.
    common = dict(nproc_per_node=procs, run_id=RUN_ID, max_restarts=0)
    if cluster is None:
        return LaunchConfig(min_nodes=1, max_nodes=1, rdzv_backend="c10d",
                            rdzv_endpoint="localhost:0", **common)
    # Static, not c10d: c10d ranks the machines in the order they arrive.
    return LaunchConfig(min_nodes=cluster.nodes, max_nodes=cluster.nodes,
                        rdzv_backend="static",
                        rdzv_endpoint=f"{cluster.master_addr}:{cluster.master_port}",
                        rdzv_configs={"rank": cluster.node_rank}, **common)


def train(dataset_dir: str, model_dir: str, config: TransformerConfig,
          environ: Mapping[str, str] | None = None, gpus: int | None = None,
          **kwargs: Any) -> dict[str, Any] | None:
    """Trains on every GPU of every replica; returns the result rank 0 wrote.

    Args:
        dataset_dir, model_dir, config, **kwargs: `train_transformer`'s.
        environ: Environment to read the cluster from; `os.environ` when None.
        gpus: GPUs on this machine; `torch.cuda.device_count()` when None.

    Returns:
        The training result (`metrics.json`'s) on the primary replica; None on the others.

    Raises:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: A process failed.
    """
    require_torch_gpus()  # before anything is read: a job without its GPUs ends now
    import torch

    environ = os.environ if environ is None else environ
    procs = max(1, torch.cuda.device_count() if gpus is None else gpus)
    cluster = cluster_from_environment(environ)
    if cluster is None and procs == 1:
        return launched_process((dataset_dir, model_dir, config, kwargs))
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import elastic_launch

    try:
        results = elastic_launch(launch_config(cluster, procs), launched_process)(
            (dataset_dir, model_dir, config, kwargs))
    except SignalException as stopped:  # raised once the processes have ended
        if stopped.sigval != signal.SIGTERM:
            raise
        raise preemption.Preempted("by the processes, as each said above") from None
    # Keyed by global rank, this machine's only: rank 0 is the primary's first process.
    return results[0] if cluster is None or cluster.node_rank == 0 else None
