"""A trial's measurement, as Vertex's BEST_MEASUREMENT ranks it: the best epoch value of the
study metric the trainer reports (the local optuna search and the Kubeflow trials)."""

from __future__ import annotations

import math


def epoch_values(kind: str, model_dir: str, metric: str) -> list[float]:
    """The values of `metric` a trial of `kind` reports, one per epoch, in order.

    Raises:
        KeyError: The trainer recorded no such value (the message lists those it has).
    """
    from components.track.tracking import image_record, text_record

    if kind == "image":
        series, name = image_record(model_dir, {}, model_dir, None).series, metric
    else:  # the study ranks the classifier, not the language model
        series, name = text_record(model_dir, {}, model_dir, None).series, f"classifier/{metric}"
    if name not in series:
        raise KeyError(f"{model_dir}: the trainer recorded no {name!r}; it has {sorted(series)}")
    return [value for _, value in series[name]]


def trial_metric(values: list[float], goal: str) -> float:
    """A trial's measurement: its best finite epoch value (NaN when it has none)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan
    return max(finite) if goal == "maximize" else min(finite)
