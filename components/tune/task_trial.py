"""A tuning trial as a pipeline task: the trainer component with the trial's values.

Targets without a tuning service (open-source Kubeflow) run the trials themselves, one
task per point in a `ParallelFor` (`pipelines.definitions.trials`). Each task runs the
trainer component's own code through `as_trial`: the trial's values override the run's,
and a trainer that fails ends in a result marked failed instead of a failed task, so one
bad point does not fail the loop and `max_failed_trials` keeps its meaning (the selection
step counts the failures).
"""

from __future__ import annotations

import inspect
import logging
import math
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from components.tune.contract import TUNABLE, SearchSpaceError, coerce

POINT_INPUT = "trial_point"
TRIAL_ID = "trial"  # the point's number in the drawn list, carried into its result
FAILED, SUCCEEDED = "FAILED", "SUCCEEDED"


def run_trial(trainer: Callable, kind: str, metric: str, goal: str, point: Mapping[str, Any],
              arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Trains with `point`'s values and measures the study metric; never raises for the
    trainer's failure.

    Args:
        trainer: The trainer component's function (its `model` argument an output artifact).
        kind: "image", "text" or "transformer".
        metric: The study metric (an epoch value the trainer records).
        goal: "maximize" or "minimize".
        point: The trial's values of tunable parameters.
        arguments: The trainer's other arguments (the run's values, its artifacts).

    Returns:
        `{"state", "parameters", "model"}`, the trial's `id` when the point carries one
        (`TRIAL_ID`) and, when SUCCEEDED, the best epoch's `metric`
        (absent when no epoch had a finite one), when FAILED the `error`. No key is ever
        None: a pipeline output struct carries no null on every runner (kfp.local refuses).
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


def as_trial(trainer: Callable, kind: str, metric: str, goal: str) -> Callable:
    """The trainer component function as one trial: KFP's executor calls it with the
    trainer's inputs and outputs plus `trial_point` (the trial's values), and stores its
    result (`run_trial`'s dict) as the task's `Output` parameter.

    The signature KFP reads is the trainer's with `trial_point: dict` first and a `dict`
    return, so the trial task takes exactly what the training task takes.
    """
    signature = inspect.signature(trainer)
    point = inspect.Parameter(POINT_INPUT, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              annotation=dict)

    def trial(**arguments) -> dict:
        values = arguments.pop(POINT_INPUT)
        return run_trial(trainer, kind, metric, goal, values, arguments)

    trial.__signature__ = signature.replace(
        parameters=[point, *signature.parameters.values()], return_annotation=dict)
    trial.__annotations__ = {POINT_INPUT: dict, **{
        name: value for name, value in trainer.__annotations__.items() if name != "return"},
        "return": dict}
    trial.__name__ = trial.__qualname__ = f"trial_of_{trainer.__name__}"
    return trial
