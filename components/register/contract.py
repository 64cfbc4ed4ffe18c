"""The registration gate's contract: the metrics it may compare, what it refuses."""

from __future__ import annotations

from collections.abc import Sequence

# Metrics the gate may compare: in every metrics.json of the kind's evaluation; first: default.
IMAGE_REGISTRATION_METRICS = ("accuracy", "macro_f1")
TEXT_REGISTRATION_METRICS = ("micro_f1", "macro_f1")


def gate_problems(metric: str, threshold: float, metrics: Sequence[str] = ()) -> list[str]:
    """What the gate refuses in its settings (named as the pipeline names them).

    Args:
        metric: Held to `metrics` unless empty (the gate holds it to the metrics.json read).
        threshold: Held to [0, 1], where every registration metric is.

    Returns:
        One message per problem; empty when fine.
    """
    problems = []
    if metrics and metric not in metrics:
        problems.append(f"registration_metric must be one of {list(metrics)}, got {metric!r}")
    if not 0 <= threshold <= 1:
        problems.append(f"registration_threshold must be in [0, 1], got {threshold}")
    return problems
