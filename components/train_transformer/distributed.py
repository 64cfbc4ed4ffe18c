"""Where this replica's machine stands in a PyTorch DDP job: torchrun's `MASTER_ADDR`,
`MASTER_PORT`, `WORLD_SIZE` and `RANK` when all four are set, else Vertex's `CLUSTER_SPEC`
(workerpool0's primary is rank 0, then workerpool1's)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from components.common.written import check_settings, setting

TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_TRAINING_POOLS = ("workerpool0", "workerpool1")  # primary, then workers


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The machines of a job, as this replica sees them."""

    master_addr: str = setting("", "Host of the rank 0 replica (the rendezvous).")
    master_port: int = setting(0, "Its port.")
    nodes: int = setting(1, "Replicas (machines) in the job.", ge=1)
    node_rank: int = setting(0, "This replica's place among them, from 0.", ge=0)

    def __post_init__(self) -> None:
        check_settings(self, ValueError, *(
            [] if self.node_rank < self.nodes else
            [f"node_rank {self.node_rank} is not within {self.nodes} replica(s)"]))


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
    """The job's replicas from the environment, or None for a single machine.

    Args:
        environ: The process environment (`os.environ`).

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
