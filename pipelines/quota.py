"""The GPUs a compiled pipeline holds at once, per type, read from its JSON alone, to check
against the region's Vertex quota: steps that may run side by side add up."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping

# The regional quota a job's GPUs count against, by its scheduling strategy.
QUOTA_OF = {"STANDARD": "on-demand", "SPOT": "preemptible", "FLEX_START": "preemptible"}
RESERVED = "reserved"


def step_gpus(component: Mapping) -> dict[str, int]:
    """GPUs of each type one compiled component holds while it runs."""
    parameters = component.get("inputDefinitions", {}).get("parameters", {})
    pools = parameters.get("worker_pool_specs", {}).get("defaultValue") or []
    # A tuning job runs this many trials, each on the pools, at once.
    trials = int(parameters.get("parallel_trial_count", {}).get("defaultValue", 1))
    gpus: dict[str, int] = {}
    for pool in pools:
        spec = pool.get("machine_spec", {})
        if spec.get("accelerator_type"):
            count = int(pool.get("replica_count", 1)) * int(spec.get("accelerator_count", 0))
            gpus[spec["accelerator_type"]] = gpus.get(spec["accelerator_type"], 0) + trials * count
    return gpus


def _gpu_tasks(spec: Mapping, dag: Mapping, path: tuple[str, ...] = ()):
    """(task names from the root dag down, GPUs, component) of every step holding GPUs."""
    for name, task in dag["tasks"].items():
        component = spec["components"][task["componentRef"]["name"]]
        if "dag" in component:
            yield from _gpu_tasks(spec, component["dag"], path + (name,))
        elif gpus := step_gpus(component):
            yield path + (name,), gpus, component


def _upstream(dag: Mapping) -> dict[str, set[str]]:
    """Each task of `dag` to every task it waits for, directly or not."""
    direct = {name: set(task.get("dependentTasks", [])) for name, task in dag["tasks"].items()}
    seen: dict[str, set[str]] = {}

    def visit(name: str) -> set[str]:
        if name not in seen:
            seen[name] = set()
            for before in direct[name]:
                seen[name] |= {before} | visit(before)
        return seen[name]

    return {name: visit(name) for name in direct}


def _side_by_side(spec: Mapping, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether steps `a` and `b` (paths from the root dag) may run at the same time."""
    at = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    dag = spec["root"]["dag"]
    for name in a[:at]:
        dag = spec["components"][dag["tasks"][name]["componentRef"]["name"]]["dag"]
    upstream = _upstream(dag)
    return a[at] not in upstream[b[at]] and b[at] not in upstream[a[at]]


def gpus_at_once(spec: Mapping) -> dict[str, int]:
    """The most GPUs of each type `spec` holds at one time: the largest sum over steps that
    may all run side by side (both branches of a `dsl.If`/`dsl.Else` count: it can only
    overstate); empty without GPUs."""
    tasks = list(_gpu_tasks(spec, spec["root"]["dag"]))
    most: dict[str, int] = {}
    for gpu in sorted({g for _, gpus, _ in tasks for g in gpus}):
        using = [(path, gpus[gpu]) for path, gpus, _ in tasks if gpu in gpus]
        for size in range(1, len(using) + 1):
            for group in itertools.combinations(using, size):
                if all(_side_by_side(spec, a, b)
                       for (a, _), (b, _) in itertools.combinations(group, 2)):
                    most[gpu] = max(most.get(gpu, 0), sum(n for _, n in group))
    return most


def describe(gpus: Mapping[str, int]) -> str:
    """`gpus_at_once`'s answer as "6 x NVIDIA_TESLA_V100" (", "-joined), or "no GPU"."""
    return ", ".join(f"{n} x {gpu}" for gpu, n in sorted(gpus.items())) or "no GPU"


def step_quota(spec: Mapping, component: Mapping) -> str:
    """The quota a GPU step's jobs draw on: "on-demand", "preemptible" or "reserved"."""
    parameters = component.get("inputDefinitions", {}).get("parameters", {})
    pools = parameters.get("worker_pool_specs", {}).get("defaultValue") or []
    if any(pool.get("machine_spec", {}).get("reservation_affinity") for pool in pools):
        return RESERVED
    strategy = parameters.get("strategy", {}).get("defaultValue")
    if strategy is None:  # a tuning job: the trials' scheduling is in its launcher arguments
        executor = spec["deploymentSpec"]["executors"].get(component.get("executorLabel"), {})
        text = json.dumps(executor)
        strategy = next((s for s in ("FLEX_START", "SPOT") if re.search(rf"\b{s}\b", text)),
                        "STANDARD")
    return QUOTA_OF.get(strategy, "on-demand")


def quotas(spec: Mapping) -> dict[str, list[str]]:
    """Each GPU type the pipeline uses to the quotas its steps draw on (`step_quota`)."""
    found: dict[str, set[str]] = {}
    for _, gpus, component in _gpu_tasks(spec, spec["root"]["dag"]):
        for gpu in gpus:
            found.setdefault(gpu, set()).add(step_quota(spec, component))
    return {gpu: sorted(kinds) for gpu, kinds in sorted(found.items())}


def quota_note(kinds: Mapping[str, list[str]]) -> str:
    """Which regional quota the GPUs count against, for the quota line ("" without GPUs)."""
    if not kinds:
        return ""
    names = {"on-demand": "the on-demand GPU quota",
             "preemptible": "the preemptible GPU quota (Spot and flex-start jobs draw on it)",
             "reserved": "the reservation's machines (not the on-demand quota)"}
    return "; ".join(f"{gpu}: {' and '.join(names[k] for k in used)}"
                     for gpu, used in kinds.items())
