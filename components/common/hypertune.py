"""A tuning trial's metric, reported each epoch to Vertex's hyperparameter tuning service
(through `cloudml-hypertune`), so a trial stopped early still has a value."""

from __future__ import annotations

import math
from collections.abc import Mapping


class TrialReporter:
    """Reports `metric` (as the study spec names it) of each epoch's values; without one
    (None or "") does nothing and needs no `hypertune` package."""

    def __init__(self, metric: str | None):
        self.metric = metric or None
        self._hypertune = None
        if self.metric:
            import hypertune

            self._hypertune = hypertune.HyperTune()

    def report(self, values: Mapping[str, float], step: int) -> None:
        """Reports `values[metric]` at `step` (the epoch count).

        Raises:
            ValueError: The epoch has no such value (else the job fails only at its end).
        """
        if self._hypertune is None:
            return
        if self.metric not in values:
            raise ValueError(f"tuning metric {self.metric!r} is not among this epoch's values "
                             f"{sorted(values)}; name one of them in the study spec")
        value = float(values[self.metric])
        if not math.isfinite(value):
            # A diverged epoch: no number ranks it right for both goals; keep the last one.
            return
        self._hypertune.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag=self.metric, metric_value=value, global_step=step)
