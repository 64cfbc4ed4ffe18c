"""Choose the `tf.distribute` strategy and the precision policy from the environment.

`prepare_environment` alone reads the environment. MultiWorkerMirroredStrategy reads only
`TF_CONFIG`: from Vertex's `CLUSTER_SPEC` it is derived (workerpool0 -> chief, 1 -> worker,
2 -> ps, 3 -> evaluator, left out). TensorFlow is imported late (`bench/gpu_bench.py`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import MutableMapping, Sequence
from typing import Any

from components.train_image.contract import PRECISION_MODES

log = logging.getLogger(__name__)

MULTI_WORKER = "multi_worker"
MIRRORED = "mirrored"
DEFAULT = "default"
STRATEGY_KINDS = (MULTI_WORKER, MIRRORED, DEFAULT)

MIXED_FLOAT16 = "mixed_float16"
FLOAT32 = "float32"

_POOL_TO_TASK = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
                 "workerpool3": "evaluator"}


def _cluster_of(config: dict | None) -> dict[str, list]:
    return dict((config or {}).get("cluster") or {})


def choose_strategy_kind(tf_config: dict | None, cluster_spec: dict | None,
                         gpus: Sequence[Any]) -> str:
    """Picks the kind of distribution strategy.

    Args:
        tf_config, cluster_spec: Parsed `TF_CONFIG` (read alone when it names a cluster)
            and Vertex's `CLUSTER_SPEC`, or None.
        gpus: The GPUs visible to this process (anything with a length).

    Returns:
        "multi_worker" for several chiefs, masters or workers in all, "mirrored" for several
        local GPUs, otherwise "default".

    Raises:
        ValueError: The cluster has parameter servers.
    """
    cluster = _cluster_of(tf_config) or {_POOL_TO_TASK.get(pool, pool): hosts
                                         for pool, hosts in _cluster_of(cluster_spec).items()}
    if cluster.get("ps"):
        raise ValueError(
            "the cluster has parameter servers (TF_CONFIG 'ps' / Vertex workerpool2): this "
            "trainer uses synchronous all-reduce training; drop the parameter server pool"
        )
    if sum(len(cluster.get(task) or []) for task in ("chief", "master", "worker")) > 1:
        return MULTI_WORKER
    return MIRRORED if len(gpus) > 1 else DEFAULT


def tf_config_from_cluster_spec(cluster_spec: dict) -> dict:
    """Derives TensorFlow's `TF_CONFIG` from Vertex's `CLUSTER_SPEC` (module docstring).

    Raises:
        ValueError: The spec has no task, or an unknown pool.
    """
    cluster = {}
    for pool, hosts in _cluster_of(cluster_spec).items():
        if pool not in _POOL_TO_TASK:
            raise ValueError(f"CLUSTER_SPEC names an unknown worker pool {pool!r}")
        if hosts and _POOL_TO_TASK[pool] != "evaluator":
            cluster[_POOL_TO_TASK[pool]] = list(hosts)
    task = cluster_spec.get("task") or {}
    if task.get("type") not in _POOL_TO_TASK:
        raise ValueError(f"CLUSTER_SPEC has no usable task: {task!r}")
    return {"cluster": cluster,
            "task": {"type": _POOL_TO_TASK[task["type"]], "index": int(task.get("index", 0))}}


def choose_precision(mode: str, gpu_compute_capabilities: Sequence[tuple[int, int]]) -> str:
    """Picks the Keras mixed-precision policy.

    Args:
        mode: "auto", "on" (always mixed_float16) or "off" (always float32).
        gpu_compute_capabilities: `(major, minor)` of each visible GPU.

    Returns:
        "mixed_float16" or "float32"; "auto": mixed_float16 when every GPU (one at least)
        has tensor cores (7.0+).

    Raises:
        ValueError: Unknown mode.
    """
    if mode not in PRECISION_MODES:
        raise ValueError(f"precision must be one of {PRECISION_MODES}, got {mode!r}")
    if mode != "auto":
        return MIXED_FLOAT16 if mode == "on" else FLOAT32
    capabilities = [tuple(c) for c in gpu_compute_capabilities]
    if capabilities and all(c >= (7, 0) for c in capabilities):
        return MIXED_FLOAT16
    return FLOAT32


def make_strategy(kind: str, devices: Sequence[str] | None = None):
    """Creates the strategy of a kind ("multi_worker": before TensorFlow's runtime starts).

    Args:
        kind, devices: One of `STRATEGY_KINDS`; "mirrored"'s devices (default: all GPUs).

    Raises:
        ValueError: Unknown kind.
    """
    import tensorflow as tf

    if kind == MULTI_WORKER:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == MIRRORED:
        return tf.distribute.MirroredStrategy(devices=list(devices) if devices else None)
    if kind == DEFAULT:
        return tf.distribute.get_strategy()
    raise ValueError(f"strategy kind must be one of {STRATEGY_KINDS}, got {kind!r}")


def strategy_kind_of(strategy) -> str:
    """The kind name of an existing strategy."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return MULTI_WORKER
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return MIRRORED
    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():
        return DEFAULT
    return type(strategy).__name__


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """`(major, minor)` of each GPU TensorFlow sees (unknown details count as (0, 0))."""
    import tensorflow as tf

    return [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability")
                  or (0, 0)) for gpu in tf.config.list_physical_devices("GPU")]


def prepare_environment(precision_mode: str,
                        environ: MutableMapping[str, str] | None = None) -> tuple[str, str]:
    """Picks strategy and precision from TF_CONFIG / CLUSTER_SPEC and the GPUs, and writes
    a `TF_CONFIG` derived from `CLUSTER_SPEC` where several workers need one (call it before
    creating the strategy).

    Args:
        precision_mode: "auto", "on" or "off" (see `choose_precision`).
        environ: The environment to read and update; default `os.environ`.

    Returns:
        `(strategy kind, precision)`.

    Raises:
        ValueError: TF_CONFIG or CLUSTER_SPEC is not valid JSON, or an unusable cluster.
    """
    environ = os.environ if environ is None else environ
    parsed = {}
    for name in ("TF_CONFIG", "CLUSTER_SPEC"):
        try:
            parsed[name] = json.loads(environ[name]) if environ.get(name) else None
        except json.JSONDecodeError as err:
            raise ValueError(f"environment variable {name} is not valid JSON: {err}") from None
    tf_config, cluster_spec = parsed["TF_CONFIG"], parsed["CLUSTER_SPEC"]
    capabilities = gpu_compute_capabilities()
    kind = choose_strategy_kind(tf_config, cluster_spec, capabilities)
    if kind == MULTI_WORKER and not _cluster_of(tf_config):
        environ["TF_CONFIG"] = json.dumps(tf_config_from_cluster_spec(cluster_spec))
        log.info("TF_CONFIG derived from CLUSTER_SPEC: %s", environ["TF_CONFIG"])
    precision = choose_precision(precision_mode, capabilities)
    log.info("strategy %s, precision %s, GPUs %s", kind, precision, capabilities)
    return kind, precision
