"""KFP faces of tuning, written from `contract.TUNABLE` and the trainers' signatures: the
best-trial (Vertex) and selection (Kubeflow) steps take and return every tunable parameter
(the best trial's value, else the run's); a trial step takes the point, then the trainer's
inputs."""

from __future__ import annotations

import inspect

from components.common.written import write_function
from components.tune.contract import TUNABLE
from components.tune.trial import trainer as trainer_function

TUNED_HELP = "The run's value, kept when the study did not search it."
_TRIALS_HELP = ("Output file trials.json: every trial's {what}, the study's metric and goal, "
                "and the best trial.")
# Each step's own inputs, before the tunable ones: (name, annotation, help).
_BEST_INPUTS = (
    ("gcp_resources", "str", "The tuning step's output: which HyperparameterTuningJob ran."),
    ("trials", "Output[Artifact]", _TRIALS_HELP.format(
        what="id, state, parameters and metric")),
)
_SELECT_INPUTS = (
    ("results", "list[dict]", "Every trial's result (state, values, the study metric's best "
                              "epoch value, error)."),
    ("goal", "str", '"maximize" or "minimize" the study metric.'),
    ("max_failed_trials", "int", "Failed trials that fail the search; 0 fails it only when "
                                 "no trial succeeded."),
    ("trials", "Output[Artifact]", "Output file trials.json: every trial's values, state, "
                                   "metric and error, and the best trial."),
)
_TRIAL_INPUTS = (
    ("trial_point", "dict", 'The trial\'s values of tunable parameters and its number '
                            '("trial").'),
    ("study_metric", "str", "The epoch value the study ranks trials by."),
    ("study_goal", "str", '"maximize" or "minimize" the study metric.'),
)


def _parameter(name: str, annotation, default=inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                             annotation=annotation)


def _args(entries) -> str:
    return "Args:\n" + "\n".join(f"    {name}: {text}" for name, text in entries)


def _tuned(kind: str, function: str, lead: str, own, chooser: str, call: str):
    """A step taking `own` inputs, then `kind`'s tunable ones, and returning the latter."""
    fields = TUNABLE[kind]
    parameters = [_parameter(name, annotation) for name, annotation, _ in own]
    parameters += [_parameter(name, kind_type) for name, kind_type in fields.items()]
    returns = (f"NamedTuple('Best{kind.title()}Trial', ["
               + ", ".join(f"('{name}', {t.__name__})" for name, t in fields.items()) + "])")
    doc = (f"{lead}\n\n" + _args([(name, text) for name, _, text in own]
                                 + [(name, TUNED_HELP) for name in fields]))
    body = f"from components.tune.selection import {chooser}\n\nreturn {call}"
    return write_function(function, parameters, doc, body, returns)


def best_trial(kind: str):
    """The Vertex best-trial step of `kind`: reads the finished tuning job."""
    return _tuned(kind, f"best_{kind}_trial", "Reads the finished tuning job and returns the "
                  f"best trial's values for the {kind} trainer.", _BEST_INPUTS, "choose",
                  f"tuple(choose({kind!r}, gcp_resources, locals(), trials).values())")


def select_trial(kind: str):
    """The Kubeflow selection step of `kind`: ranks the trials the pipeline ran."""
    return _tuned(kind, f"select_{kind}_trial", f"Ranks the {kind} trials the pipeline ran "
                  "and returns the best trial's values.", _SELECT_INPUTS, "choose_from_results",
                  f"tuple(choose_from_results({kind!r}, results, goal, max_failed_trials, "
                  "locals(), trials).values())")


def trial(kind: str):
    """The Kubeflow trial step of `kind`: the point, the study, then the trainer's inputs."""
    trainer = trainer_function(kind)
    parameters = [_parameter(name, annotation) for name, annotation, _ in _TRIAL_INPUTS]
    parameters += inspect.signature(trainer).parameters.values()
    doc = (f"Trains the {kind} classifier with the point's values (its other inputs are "
           "the trainer's) and returns the study metric; a failed training is a FAILED "
           f"result.\n\n{_args([(name, text) for name, _, text in _TRIAL_INPUTS])}")
    body = ("inputs = dict(locals())  # the step's inputs, before the import names one more\n"
            "from components.tune.task_trial import run_step\n\n"
            f"return run_step({kind!r}, inputs)")
    return write_function(f"trial_{trainer.__name__}", parameters, doc, body, "dict")


BEST_TRIAL = {kind: best_trial(kind) for kind in TUNABLE}
SELECT_TRIAL = {kind: select_trial(kind) for kind in TUNABLE}
TRIAL = {kind: trial(kind) for kind in TUNABLE}
