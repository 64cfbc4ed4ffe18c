"""One trial of a Vertex hyperparameter tuning job: the trainer component with the trial's values.

    python3 -m components.tune.trial --kind image|text|transformer --metric NAME \
        --executor_input JSON [--PARAMETER=VALUE ...]

Vertex appends the trial's values as `--name=value`; the training step's executor input
(`pipelines.definitions.tuning.as_tuning_job`) gets them, its outputs point into the
trial's folder, and KFP's executor runs the trainer component as the pipeline would.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from components.common.commands import reports
from components.tune.contract import TUNABLE, SearchSpaceError, coerce

# The trainer component each kind's trials run (an exception tests/test_structure.py names).
TRAINERS = {
    "image": ("components.train_image.component", "train_image_classifier"),
    "text": ("components.train_text.component", "train_text_classifier"),
    "transformer": ("components.train_transformer.component", "train_transformer_classifier"),
}
METRIC_PARAMETER = "hypertune_metric"


def trainer(kind: str) -> Callable:
    """The trainer component function of `kind`'s trials."""
    module, name = TRAINERS[kind]
    return getattr(importlib.import_module(module), name)


class TrialError(ValueError):
    """The trial cannot run as given; the message says what is missing."""


def parse_hyperparameters(kind: str, extra: Sequence[str]) -> dict[str, int | float]:
    """The `--name=value` arguments Vertex appends, typed for the trainer.

    Raises:
        TrialError: An argument that is not `--name=value` of a tunable parameter.
    """
    # No abbreviations (`--learn` names no parameter), no --help: refusals, never an exit.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name in TUNABLE[kind]:
        parser.add_argument(f"--{name}")
    try:
        given, unknown = parser.parse_known_args(extra)
    except argparse.ArgumentError as err:  # a name with no value after it
        raise TrialError(f"{err}; Vertex passes --name=value") from err
    if unknown:
        name = unknown[0][2:].partition("=")[0] if unknown[0].startswith("--") else ""
        raise TrialError(f"--{name}: the {kind} trainer cannot tune it; tunable: "
                         f"{sorted(TUNABLE[kind])}" if name else f"unexpected trial argument "
                         f"{unknown[0]!r}; Vertex passes --name=value")
    try:
        return {name: coerce(kind, name, value) for name, value in vars(given).items()
                if value is not None}
    except SearchSpaceError as err:  # its message names the parameter
        raise TrialError(f"trial argument {err}") from err


def output_definitions(function) -> dict[str, str]:
    """Output artifact name -> schema title (e.g. "system.Model") of a component function."""
    from kfp.dsl.types import type_annotations

    titles = {}
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        if type_annotations.is_artifact_wrapped_in_Output(hint):
            titles[name] = type_annotations.get_io_artifact_class(hint).schema_title
    return titles


def trial_folder(environ: Mapping[str, str]) -> str:
    """gs:// folder of this trial: the parent of Vertex's AIP_MODEL_DIR.

    Raises:
        TrialError: No AIP_MODEL_DIR.
    """
    model_dir = environ.get("AIP_MODEL_DIR", "").rstrip("/")
    if not model_dir:
        raise TrialError("AIP_MODEL_DIR is not set: this runs as a trial of a Vertex tuning "
                         "job whose base output directory is set "
                         "(pipelines.definitions.tuning does it)")
    return os.path.dirname(model_dir)


def trial_executor_input(executor_input: Mapping[str, Any], outputs: Mapping[str, str],
                         hyperparameters: Mapping[str, Any], metric: str,
                         folder: str) -> dict[str, Any]:
    """The training step's executor input, rewritten for one trial.

    Args:
        executor_input: What the backend resolved for the tuning step (the training step's).
        outputs: The trainer's output artifacts, name -> schema title.
        hyperparameters: This trial's values, overriding the run's.
        metric: Epoch value the trainer reports to the tuning service.
        folder: This trial's folder; outputs go to `<folder>/<name>`.

    Returns:
        A new executor input.
    """
    from kfp.dsl import Artifact

    written = f"{folder}/executor_output.json"  # gs://B/P: the /gcs/B/P file Vertex mounts
    result = copy.deepcopy(dict(executor_input))
    inputs = result.setdefault("inputs", {})
    inputs["parameterValues"] = {**inputs.get("parameterValues", {}), **hyperparameters,
                                 METRIC_PARAMETER: metric}
    result["outputs"] = {
        "parameters": {},
        "artifacts": {name: {"artifacts": [{"name": name, "type": {"schemaTitle": title},
                                            "uri": f"{folder}/{name}", "metadata": {}}]}
                      for name, title in outputs.items()},
        "outputFile": Artifact(uri=written).path if written.startswith("gs://") else written,
    }
    return result


def check_metric_file(environ: Mapping[str, str]) -> str:
    """Where hypertune writes the trial's metric, checked writable before the first paid epoch.

    Raises:
        TrialError: The folder cannot be made or written, naming it and the user.
    """
    path = environ.get("CLOUD_ML_HP_METRIC_FILE") or "/tmp/hypertune/output.metrics"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
    except OSError as err:
        raise TrialError(
            f"cannot write the tuning metric file {path} as uid {os.getuid()} ({err.strerror}): "
            "the image must make that folder its user's (containers/*/Dockerfile makes "
            "/var/hypertune uid 1000's; GoogleCloudPlatform/cloudml-hypertune#6)") from err
    return path


def run(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Runs one trial; returns the executor input it ran with."""
    parser = argparse.ArgumentParser(prog="python3 -m components.tune.trial")
    parser.add_argument("--kind", required=True, choices=sorted(TRAINERS))
    parser.add_argument("--metric", required=True,
                        help="epoch value reported to the tuning service")
    parser.add_argument("--executor_input", required=True,
                        help="the training step's executor input (JSON)")
    args, extra = parser.parse_known_args(argv)
    environ = os.environ if environ is None else environ
    hyperparameters = parse_hyperparameters(args.kind, extra)
    check_metric_file(environ)
    function = trainer(args.kind)
    executor_input = trial_executor_input(
        json.loads(args.executor_input), output_definitions(function), hyperparameters,
        args.metric, trial_folder(environ))
    print(f"trial of {args.kind} tuning: {json.dumps(hyperparameters, sort_keys=True)}, "
          f"reporting {args.metric}", flush=True)
    from kfp.dsl.executor import Executor

    Executor(executor_input=executor_input, function_to_execute=function).execute()
    return executor_input


@reports(TrialError)
def main(argv: Sequence[str] | None = None) -> int:
    run(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
