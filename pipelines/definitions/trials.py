"""Tuning by trials the pipeline runs itself: for targets without a tuning service.

On open-source Kubeflow there is no Vertex tuning job: the tuning variant draws its points
at compile time from the same search space (random search, `contract.draw_points`), runs
one trial task per point in a `dsl.ParallelFor` (its parallelism: the parallel trials),
collects their results with `dsl.Collected`, and a selection step ranks them and hands the
best values to the final training, as the Vertex variant's best-trial step does.

A trial task is the trainer component with one more input, `trial_point`, and a result:
its IR is the trainer's with its executor's function swapped for
`components.tune.task_trial.as_trial` of it (KFP's lightweight-component program, extended
by two lines), so it takes exactly the training task's inputs and runs the same code.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import yaml

from components.tune.contract import TUNABLE, draw_points
from components.tune.task_trial import POINT_INPUT, TRIAL_ID

TRIAL_DISPLAY_NAME = "trial"


def trial_component(trainer, kind: str, metric: str, goal: str):
    """The trial task's component, made from the trainer component's IR.

    Args:
        trainer: The trainer's lightweight component (`steps.component` of its function).
        kind: "image", "text" or "transformer".
        metric: The study metric.
        goal: "maximize" or "minimize".

    Returns:
        A component with the trainer's inputs and outputs, `trial_point` (STRUCT) and the
        `Output` result (STRUCT).
    """
    from google.protobuf import json_format
    from kfp import components

    spec = json_format.MessageToDict(trainer.pipeline_spec)
    ((name, component),) = spec["components"].items()
    ((_, executor),) = spec["deploymentSpec"]["executors"].items()
    container = executor["container"]
    function = container["args"][container["args"].index("--function_to_execute") + 1]
    wrapped = f"trial_of_{function}"
    # The program KFP writes to ephemeral_component.py: the trainer's function, then its
    # trial (the second argument of `sh -ec`'s script is the program text).
    container["command"][3] += (
        "\n\nfrom components.tune.task_trial import as_trial as _as_trial\n"
        f"{wrapped} = _as_trial({function}, {kind!r}, {metric!r}, {goal!r})\n")
    container["args"][container["args"].index("--function_to_execute") + 1] = wrapped
    parameters = component["inputDefinitions"].setdefault("parameters", {})
    parameters[POINT_INPUT] = {"parameterType": "STRUCT"}
    component["outputDefinitions"].setdefault("parameters", {})["Output"] = {
        "parameterType": "STRUCT"}
    spec["root"]["inputDefinitions"] = copy.deepcopy(component["inputDefinitions"])
    spec["root"]["outputDefinitions"] = copy.deepcopy(component["outputDefinitions"])
    ((_, task),) = spec["root"]["dag"]["tasks"].items()
    task.setdefault("inputs", {}).setdefault("parameters", {})[POINT_INPUT] = {
        "componentInputParameter": POINT_INPUT}
    for output in spec["root"]["outputDefinitions"].get("parameters", {}):
        spec["root"]["dag"].setdefault("outputs", {}).setdefault("parameters", {})[output] = {
            "valueFromParameter": {"producerSubtask": next(iter(spec["root"]["dag"]["tasks"])),
                                   "outputParameterKey": output}}
    loaded = components.load_component_from_text(yaml.safe_dump(spec, sort_keys=False))
    loaded.component_spec.name = f"trial-{name.removeprefix('comp-')}"
    return loaded


def parallel_search(trainer, kind: str, tune, display_name: str, image: str,
                    place: Callable, step: str) -> Callable:
    """The tuning variant's search by trials in a `ParallelFor`, made before the body.

    Args:
        trainer: The trainer's (unwrapped) component.
        kind: "image", "text" or "transformer".
        tune: The tuning settings: `tune.spaces[kind]`, trial counts and the draw's seed.
        display_name: The selection step's name stem (the Vertex variant's tuning step).
        image: The runtime image the selection step runs in.
        place: The target's `place(task, step, resumable)`: a trial on the training step's
            nodes (`step`; not resumable: a failed trial is a result), the selection on a
            light step's.
        step: The training step's key in DEFAULT_MACHINES.

    Returns:
        `search(training, job)`: adds the trials and the selection to the body being
        defined and returns `training` with the best trial's values.
    """
    from kfp import dsl

    from components.tune.component import SELECT_TRIAL
    from pipelines.definitions.steps import component

    space = tune.spaces[kind]
    # Each point carries its trial's number: dsl.Collected promises no order.
    points = [{TRIAL_ID: number, **point} for number, point
              in enumerate(draw_points(space, tune.max_trials, tune.seed), start=1)]
    trial_op = trial_component(trainer, kind, space.metric, space.goal)
    select_op = component(SELECT_TRIAL[kind], image)

    def search(training: dict, job: dict) -> dict:
        # No display name for the loop: the 2.14/2.15 driver records a loop under its
        # display name, and `Collected` finds it by task key (kubeflow/pipelines#13239,
        # fixed in 2.16 by #12808); KFP's default name is the task key.
        with dsl.ParallelFor(points, parallelism=tune.parallel_trials) as point:
            trial = place(trial_op(**training, **job, **{POINT_INPUT: point})
                          .set_display_name(TRIAL_DISPLAY_NAME), step, resumable=False)
        best = select_op(results=dsl.Collected(trial.outputs["Output"]), goal=space.goal,
                         max_failed_trials=tune.max_failed_trials,
                         **{name: training[name] for name in TUNABLE[kind]},
                         ).set_display_name(display_name)
        place(best, "")
        return {**training, **{name: best.outputs[name] for name in TUNABLE[kind]}}

    return search
