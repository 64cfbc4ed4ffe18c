"""A tuning trial as a pipeline task (targets without a tuning service): the trainer's own
code with the trial's values, a failed training a FAILED result rather than a failed task,
so one bad point does not fail the loop and `max_failed_trials` keeps its meaning."""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from components.tune.contract import TUNABLE, SearchSpaceError, coerce

POINT_INPUT, METRIC_INPUT, GOAL_INPUT = "trial_point", "study_metric", "study_goal"
TRIAL_ID = "trial"  # the point's number in the drawn list, carried into its result
FAILED, SUCCEEDED = "FAILED", "SUCCEEDED"


def run_trial(trainer: Callable, kind: str, metric: str, goal: str, point: Mapping[str, Any],
              arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Trains with `point`'s values and measures the study metric; never raises for the
    trainer's failure.

    Args:
        trainer: The trainer component's function.
        kind: "image", "text" or "transformer".
        metric: The study metric.
        goal: "maximize" or "minimize".
        point: The trial's values of tunable parameters (and its `TRIAL_ID`).
        arguments: The trainer's other arguments.

    Returns:
        `{"state", "parameters", "model"}`, the `id`, and the best epoch's `metric` or
        the `error`; never a None value (kfp.local refuses nulls in a struct).
    """
    from components.tune.measure import epoch_values, trial_metric

    model = arguments["model"]
    point = dict(point)
    result: dict[str, Any] = {"state": FAILED, "model": getattr(model, "uri", "")}
    if TRIAL_ID in point:
        result["id"] = str(int(point.pop(TRIAL_ID)))  # kfp.local hands ints back as floats
    result["parameters"] = dict(point)
    try:
        unknown = sorted(set(point) - set(TUNABLE[kind]))
        if unknown:
            raise SearchSpaceError(f"the {kind} trainer cannot tune {unknown}; tunable: "
                                   f"{sorted(TUNABLE[kind])}")
        values = {name: coerce(kind, name, value) for name, value in point.items()}
        result["parameters"] = values
        print(f"trial of {kind} tuning: {values}, measuring {metric}", flush=True)
        trainer(**{**arguments, **values})
        measured = trial_metric(epoch_values(kind, model.path, metric), goal)
    except Exception as err:  # the trial's failure is its result, not the loop's
        logging.error("trial failed:\n%s", traceback.format_exc())
        result["error"] = f"{type(err).__name__}: {err}"[:2000]
        return result
    result["state"] = SUCCEEDED
    if math.isfinite(measured):
        result["metric"] = measured
    return result


def run_step(kind: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """`run_trial` of a trial step's inputs: the point, the study, the trainer's arguments."""
    from components.tune.trial import trainer

    arguments = dict(inputs)
    return run_trial(trainer(kind), kind, arguments.pop(METRIC_INPUT), arguments.pop(GOAL_INPUT),
                     arguments.pop(POINT_INPUT), arguments)
