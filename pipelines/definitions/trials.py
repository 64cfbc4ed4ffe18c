"""Tuning by trials the pipeline runs itself, for targets without a tuning service (Kubeflow).

The points are drawn at compile time (random search) and each runs the trainer's trial step
(the trainer's parameters and the point's), so a trial takes the training task's inputs and
runs the same code.
"""

from __future__ import annotations

from collections.abc import Callable

from components.tune.contract import TUNABLE, draw_points
from components.tune.task_trial import GOAL_INPUT, METRIC_INPUT, POINT_INPUT, TRIAL_ID

TRIAL_DISPLAY_NAME = "trial"


def parallel_search(trainer, kind: str, tune, display_name: str, image: str,
                    place: Callable, step: str) -> Callable:
    """The tuning variant's search by trials in a `ParallelFor`, made before the body.

    Args:
        trainer: The trainer's (unwrapped) component.
        kind: "image", "text" or "transformer".
        tune: The tuning settings: `tune.spaces[kind]`, trial counts and the draw's seed.
        display_name: The selection step's name stem (the Vertex variant's tuning step).
        image: The runtime image the trials and the selection step run in.
        place: The target's `place(task, step, resumable)`; a trial is not resumable (a
            failed trial is a result).
        step: The training step's key in DEFAULT_MACHINES.

    Returns:
        `search(training, job)`: adds the trials and the selection to the body being
        defined and returns `training` with the best trial's values.
    """
    from kfp import dsl

    from components.tune.component import SELECT_TRIAL, TRIAL
    from pipelines.definitions.steps import component

    space = tune.spaces[kind]
    # Each point carries its trial's number: dsl.Collected promises no order.
    points = [{TRIAL_ID: number, **point} for number, point
              in enumerate(draw_points(space, tune.max_trials, tune.seed), start=1)]
    trial_op = component(TRIAL[kind], image)
    select_op = component(SELECT_TRIAL[kind], image)

    def search(training: dict, job: dict) -> dict:
        # No display name for the loop: the 2.14/2.15 driver records a loop under its
        # display name, and `Collected` finds it by task key (kubeflow/pipelines#13239,
        # fixed in 2.16 by #12808); KFP's default name is the task key.
        with dsl.ParallelFor(points, parallelism=tune.parallel_trials) as point:
            trial = place(trial_op(**training, **job, **{
                POINT_INPUT: point, METRIC_INPUT: space.metric, GOAL_INPUT: space.goal,
            }).set_display_name(TRIAL_DISPLAY_NAME), step, resumable=False)
        best = select_op(results=dsl.Collected(trial.outputs["Output"]), goal=space.goal,
                         max_failed_trials=tune.max_failed_trials,
                         **{name: training[name] for name in TUNABLE[kind]},
                         ).set_display_name(display_name)
        place(best, "")
        return {**training, **{name: best.outputs[name] for name in TUNABLE[kind]}}

    return search
