"""The registration gate's contract: the metrics it may compare and what it refuses in its
settings (the preflight asks it too, before any paid job)."""

from __future__ import annotations

from collections.abc import Sequence

# Metrics the gate may compare: in every metrics.json of the kind's evaluation; first: default.
IMAGE_REGISTRATION_METRICS = ("accuracy", "macro_f1")
TEXT_REGISTRATION_METRICS = ("micro_f1", "macro_f1")


def gate_problems(metric: str, threshold: float, metrics: Sequence[str] = ()) -> list[str]:
    """What the gate refuses in its settings, each named as the pipeline names it.

    Args:
        metric: The metric compared; held to `metrics` unless empty (the gate holds it to
            the evaluation's metrics.json).
        threshold: The bar; every registration metric is in [0, 1].

    Returns:
        One message per problem; empty when fine.
    """
    problems = []
    if metrics and metric not in metrics:
        problems.append(f"registration_metric must be one of {list(metrics)}, got {metric!r}")
    if not 0 <= threshold <= 1:
        problems.append(f"registration_threshold must be in [0, 1], got {threshold}")
    return problems
