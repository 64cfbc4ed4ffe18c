"""Runs the transformer trainer as one process per GPU on each replica of the job.

A single CPU or GPU machine trains in this process. Otherwise each process gets torchrun's
variables (`distributed.process_environment`): several GPUs on one machine are spawned
here, one process each, and the replicas of a multi-replica Vertex job find each other
through the primary replica's address (`distributed.cluster_from_environment`).

Rank 0 (on the primary replica) writes every output; the other replicas return None once
their processes are through the closing barrier, without reading its files: on another
machine they may not be visible yet.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from components.common.gpus import require_torch_gpus
from components.text_common.contract import TRAINING_METRICS_FILE
from components.text_common.scores import validation_scalars  # noqa: F401 (the component's)
from components.train_transformer import distributed
from components.train_transformer.contract import TransformerConfig

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((distributed.LOOPBACK, 0))
        return s.getsockname()[1]


def _process(local_rank: int, env: Mapping[str, str], dataset_dir: str, model_dir: str,
             config: TransformerConfig, kwargs: dict[str, Any]) -> None:
    """One spawned process: its torchrun variables, then the trainer."""
    from components.train_transformer.training import train_transformer

    os.environ.update(env)
    os.environ.update({"RANK": str(int(env["RANK"]) + local_rank),
                       "LOCAL_RANK": str(local_rank)})
    train_transformer(dataset_dir, model_dir, config, **kwargs)


def train(dataset_dir: str, model_dir: str, config: TransformerConfig,
          environ: Mapping[str, str] | None = None, gpus: int | None = None,
          **kwargs: Any) -> dict[str, Any] | None:
    """Trains on every GPU of every replica; returns the result rank 0 wrote.

    Args:
        dataset_dir: The text preparation step's folder.
        model_dir: Output folder (`train_transformer`).
        config: The run's settings.
        environ: Environment to read the cluster from; `os.environ` when None.
        gpus: GPUs on this machine; `torch.cuda.device_count()` when None.
        **kwargs: Passed on to `train_transformer` (tensorboard_folder, hypertune_metric,
            checkpoints).

    Returns:
        The training result (`metrics.json`'s content) on the primary replica; None on the
        others, where there is nothing to report (KFP keeps the primary's outputs only).
    """
    require_torch_gpus()  # before anything is read: a job without its GPUs ends now
    import torch

    from components.train_transformer.training import train_transformer

    environ = os.environ if environ is None else environ
    procs = max(1, torch.cuda.device_count() if gpus is None else gpus)
    cluster = distributed.cluster_from_environment(environ)
    if cluster is None and procs == 1:
        return train_transformer(dataset_dir, model_dir, config, **kwargs)
    cluster = cluster or distributed.Cluster(distributed.LOOPBACK, _free_port(), 1, 0)
    log.info("training on %d replica(s) x %d process(es); this replica is %d, rendezvous "
             "at %s:%d", cluster.nodes, procs, cluster.node_rank, cluster.master_addr,
             cluster.master_port)
    if procs == 1:
        os.environ.update(distributed.process_environment(cluster, 1, 0))
        result = train_transformer(dataset_dir, model_dir, config, **kwargs)
    else:
        import torch.multiprocessing as mp

        first = distributed.process_environment(cluster, procs, 0)
        mp.start_processes(_process, args=(first, dataset_dir, model_dir, config, kwargs),
                           nprocs=procs, start_method="spawn")
        result = None
        if cluster.node_rank == 0:  # rank 0 is this machine's first process, now finished
            with open(os.path.join(model_dir, TRAINING_METRICS_FILE)) as f:
                result = json.load(f)
    return result if cluster.node_rank == 0 else None
