"""A pipeline run on this machine through `kfp.local`, for `run_local` and `tune_local`."""

from __future__ import annotations

import contextlib
import glob
import os
import warnings
from typing import Any

from kfp import local

from components.common.storage import write_json_atomically
from pipelines.catalogue import BUILDERS, DATA_PARAMETERS, SUMMARIES
from pipelines.step_log import steps_reported

# The local variant never pulls images; the URI only fills the spec.
LOCAL_IMAGE = "local/vertex-gpu-pipelines:dev"


def _predictions(model_path: str) -> dict[str, Any]:
    """Where the run's prediction step wrote (kfp.local's `<run folder>/<task>/<output>`),
    with counts and the first few lines."""
    from components.predict.contract import PREDICTIONS_FILE, read_predictions

    run_folder = os.path.dirname(os.path.dirname(model_path))
    (path,) = glob.glob(os.path.join(run_folder, "predict", "*", PREDICTIONS_FILE))
    lines = read_predictions(path)
    errors = sum("error" in line for line in lines)
    return {"file": path, "inputs": len(lines), "predicted": len(lines) - errors,
            "errors": errors, "first": lines[:3]}


def run(kind: str, data: str, output: str, params: dict[str, Any]) -> dict[str, Any]:
    """Runs pipeline `kind` locally and writes `<output>/summary.json`.

    Args:
        kind: A key of `pipelines.catalogue.BUILDERS` ("image", "text", "lm", "transformer").
        data: Input folder, file or gs:// URI.
        output: Local folder for the run's outputs.
        params: Pipeline parameters other than the data URI.

    Returns:
        The summary written.

    Raises:
        StepFailed: A step failed, with the step's own error.
    """
    output = os.path.abspath(output)
    os.makedirs(output, exist_ok=True)
    # A failed re-run must not leave the last run's summary looking like its own.
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(output, "summary.json"))
    # Local runs ignore display names and never pull the image: say nothing about it.
    warnings.filterwarnings("ignore", ".*have no effect in the current local runner")
    warnings.filterwarnings("ignore", "You may be attemping to run a task that uses custom")
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=os.path.join(output, "kfp"))
    pipeline = BUILDERS[kind](LOCAL_IMAGE)
    print(f"running the {kind} pipeline locally; step logs: {os.path.join(output, 'logs')}")
    with steps_reported(os.path.join(output, "logs")):
        task = pipeline(**{DATA_PARAMETERS[kind]: data}, **params)
    summary = SUMMARIES[kind](task.outputs)
    if params.get("predict_uri"):
        summary["predictions"] = _predictions(task.outputs["model"].path)
        summary["artifacts"]["predictions"] = summary["predictions"].pop("file")
    write_json_atomically(os.path.join(output, "summary.json"), summary, sort_keys=False)
    return summary
