"""A tuning trial's metric, reported each epoch to Vertex's hyperparameter tuning service.

Vertex reads what `cloudml-hypertune` writes (`CLOUD_ML_HP_METRIC_FILE`, else
/tmp/hypertune/output.metrics) in every trial of a tuning job; the trainers report the
metric the study optimises after each epoch, so a trial stopped early still has a value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class TrialReporter:
    """Reports one metric of each epoch's values; does nothing when no metric is named.

    The `hypertune` package is imported only when a metric is named, so runs outside a
    tuning job never need it.
    """

    def __init__(self, metric: str | None):
        """Args:
            metric: Name of the value to report (e.g. "val_accuracy", "valid_loss"), as the
                study spec names it; None or "" reports nothing.
        """
        self.metric = metric or None
        self._hypertune = None
        if self.metric:
            import hypertune

            self._hypertune = hypertune.HyperTune()

    def report(self, values: Mapping[str, float], step: int) -> None:
        """Reports `values[metric]` at `step` (the epoch count).

        Raises:
            ValueError: The epoch has no such value (the message lists those it has): a
                trial that reports nothing would fail only when the tuning job ends.
        """
        if self._hypertune is None:
            return
        if self.metric not in values:
            raise ValueError(f"tuning metric {self.metric!r} is not among this epoch's values "
                             f"{sorted(values)}; name one of them in the study spec")
        value = float(values[self.metric])
        if not math.isfinite(value):
            # A diverged epoch: no number would rank it right for both goals (a NaN loss
            # must not look best when minimised), so the trial keeps its last finite one.
            return
        self._hypertune.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.metric, metric_value=value, global_step=step)
