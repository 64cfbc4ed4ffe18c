"""The best trial of a finished Vertex tuning job (which names none), or of the trials a
Kubeflow pipeline ran itself, by the study's metric and goal."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from components.tune.contract import TUNABLE, coerce

# What gcp_resources names (`job_resources`): the job's REST URI.
_JOB_URI = re.compile(r"(projects/[^/]+/locations/(?P<location>[^/]+)/"
                      r"hyperparameterTuningJobs/[^/]+)$")
TRIALS_FILE = "trials.json"
# Trial.State of a trial the study stopped early (`--tune-early-stopping`): not a failure.
STOPPED = "STOPPING"
RANKED = ("SUCCEEDED", STOPPED)


class TuningError(RuntimeError):
    """No trial can be chosen; the message says why and where to look."""


def tuning_job_name(gcp_resources: str) -> str:
    """The job's resource name from GCPC's `gcp_resources` JSON.

    Raises:
        TuningError: It names no HyperparameterTuningJob.
    """
    resources = json.loads(gcp_resources).get("resources", [])
    for resource in resources:
        match = _JOB_URI.search(resource.get("resourceUri", ""))
        if resource.get("resourceType") == "HyperparameterTuningJob" and match:
            return match.group(1)
    raise TuningError(f"gcp_resources names no HyperparameterTuningJob: {gcp_resources}")


def job_resources(name: str) -> str:
    """The `gcp_resources` JSON of the tuning job `name`, as GCPC's launchers write it."""
    location = _JOB_URI.search(name).group("location")
    return json.dumps({"resources": [{
        "resourceType": "HyperparameterTuningJob",
        "resourceUri": f"https://{location}-aiplatform.googleapis.com/v1/{name}"}]})


def job_client(location: str):
    """Vertex's `JobServiceClient` on the regional endpoint of `location`."""
    from google.cloud import aiplatform_v1

    return aiplatform_v1.JobServiceClient(
        client_options={"api_endpoint": f"{location}-aiplatform.googleapis.com"})


def fetch_tuning_job(name: str):
    """Reads the job from Vertex (the regional endpoint of its location)."""
    return job_client(_JOB_URI.search(name).group("location")).get_hyperparameter_tuning_job(
        name=name)


def trial_table(job) -> list[dict[str, Any]]:
    """One row per trial of `job` (an `aiplatform_v1.HyperparameterTuningJob`): id, state,
    parameters, the metric's final value (or None) and its folder. A trial stopped early
    without a final measurement is ranked by its last one."""
    metric = job.study_spec.metrics[0].metric_id
    base = job.trial_job_spec.base_output_directory.output_uri_prefix.rstrip("/")
    rows = []
    for trial in job.trials:
        measured = trial.final_measurement
        if not measured.metrics and trial.state.name == STOPPED and trial.measurements:
            measured = trial.measurements[-1]
        values = {m.metric_id: m.value for m in measured.metrics}
        value = values.get(metric)
        rows.append({
            "id": trial.id,
            "state": trial.state.name,
            # proto-plus gives a parameter's Value as a Python number or string
            "parameters": {p.parameter_id: p.value for p in trial.parameters},
            "metric": value if value is not None and math.isfinite(value) else None,
            "folder": f"{base}/{trial.id}" if base else None,
        })
    return rows


def best_row(rows: list[Mapping[str, Any]], maximize: bool) -> Mapping[str, Any] | None:
    """The succeeded (or stopped early) row ranking first (ties: the earlier); None if none."""
    ranked = [row for row in rows if row.get("state") in RANKED
              and row.get("metric") is not None]
    return max(ranked, key=lambda row: row["metric"] if maximize else -row["metric"],
               default=None)


def best_values(kind: str, best: Mapping[str, Any], defaults: Mapping[str, Any]
                ) -> dict[str, Any]:
    """Every tunable parameter of `kind`: the `best` trial's value, else the run's."""
    return {name: coerce(kind, name, best["parameters"][name]) if name in best["parameters"]
            else defaults[name] for name in TUNABLE[kind]}


def _conclude(kind: str, trials, summary: Mapping[str, Any], best: Mapping[str, Any] | None,
              problem: str, defaults: Mapping[str, Any], metadata: Mapping[str, Any]
              ) -> dict[str, Any]:
    """Writes `trials.json` (`summary`, the best trial with its `best_values`, or none if
    there is a `problem`); raises `problem` if any, else records `metadata` and the best
    trial's id, and returns those values."""
    from components.common.storage import write_json_atomically

    values = None if problem else best_values(kind, best, defaults)
    os.makedirs(trials.path, exist_ok=True)
    write_json_atomically(os.path.join(trials.path, TRIALS_FILE), {
        **summary, "best": None if problem else {**best, "values": values}})
    if problem:
        raise TuningError(problem)
    trials.metadata.update({"best_trial": best["id"], **metadata})
    return values


def choose(kind: str, gcp_resources: str, defaults: Mapping[str, Any], trials,
           fetch=fetch_tuning_job) -> dict[str, Any]:
    """Reads the tuning job, writes `trials.json` and returns `best_values` of the trial
    ranking first for the study's goal (`best_row`).

    Args:
        kind: "image", "text" or "transformer".
        gcp_resources: The tuning step's `gcp_resources` output.
        defaults: The run's values of the tunable parameters.
        trials: Output artifact (`.path` a folder, `.metadata` a dict).
        fetch: Reads the job by resource name (the Vertex API; tests pass a stand-in).

    Raises:
        TuningError: No trial succeeded with a value of the study's metric.
    """
    job = fetch(tuning_job_name(gcp_resources))
    table, spec = trial_table(job), job.study_spec.metrics[0]
    best = best_row(table, spec.goal.name == "MAXIMIZE")
    problem = "" if best else (
        f"tuning job {job.name}: no trial succeeded with a final {spec.metric_id} (trial "
        f"states: {sorted({r['state'] for r in table})}); see the trials' logs in the console")
    return _conclude(kind, trials, {"job": job.name, "metric": spec.metric_id,
                                    "goal": spec.goal.name.lower(), "trials": table},
                     best, problem, defaults, {
                         "job": job.name, f"best_{spec.metric_id}": best and best["metric"],
                         "succeeded": sum(r["state"] == "SUCCEEDED" for r in table),
                         "stopped_early": sum(r["state"] == STOPPED for r in table),
                         "trials": len(table)})


def choose_from_results(kind: str, results: list[Mapping[str, Any]], goal: str,
                        max_failed_trials: int, defaults: Mapping[str, Any],
                        trials) -> dict[str, Any]:
    """Ranks the trials a pipeline ran itself, writes `trials.json` and returns `best_values`.

    Args:
        kind: "image", "text" or "transformer".
        results: One `run_trial` result per trial, in the order they were drawn.
        goal: "maximize" or "minimize".
        max_failed_trials: Failed trials that fail the search (0: only when none succeeded).
        defaults: The run's values of the tunable parameters.
        trials: Output artifact (`.path` a folder, `.metadata` a dict).

    Raises:
        TuningError: Too many trials failed, or none has a value (`trials.json` written).
    """
    # In the order the points were drawn, whatever order the loop's outputs came in.
    table = sorted(({"id": str(i + 1), **dict(r)} for i, r in enumerate(results)),
                   key=lambda row: int(row["id"]))
    failed = [row for row in table if row.get("state") != "SUCCEEDED"]
    best = best_row(table, goal == "maximize")
    problem = ""
    if max_failed_trials and len(failed) >= max_failed_trials:
        problem = (f"{len(failed)} of {len(table)} trials failed, at least "
                   f"max_failed_trials={max_failed_trials}")
    elif best is None:
        problem = f"no trial of {len(table)} succeeded with a value of the study metric"
    if problem:
        errors = sorted({row["error"] for row in failed if row.get("error")})
        problem += (f"; errors: {errors or 'none recorded'} (every trial's values and error: "
                    f"{trials.uri}/{TRIALS_FILE})")
    return _conclude(kind, trials, {"goal": goal, "max_failed_trials": max_failed_trials,
                                    "trials": table}, best, problem, defaults, {
                         "best_metric": best and best["metric"],
                         "succeeded": len(table) - len(failed), "trials": len(table)})
