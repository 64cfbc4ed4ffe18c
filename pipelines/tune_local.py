"""Hyperparameter search on this machine with optuna: one local run per trial, valued as
Vertex's BEST_MEASUREMENT of the per-epoch metric; the best trial's model is kept."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from components.common.storage import write_json_atomically
from components.tune.contract import SearchSpace
from components.tune.measure import epoch_values, trial_metric


def tune(kind: str, data: str, output: str, space: SearchSpace, trials: int,
         params: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """Searches `space` with `trials` local pipeline runs; writes `<output>/summary.json`.

    Args:
        kind: "image", "text" or "transformer".
        data: The pipeline's data (folder, CSV or gs:// URI).
        output: Local folder: trials/<n>/ (each a run_local output) and summary.json.
        space: What to search and the metric to rank by.
        trials: Number of trials.
        params: Pipeline parameters every trial shares.
        seed: Seed of optuna's TPE sampler.

    Returns:
        The summary: `study`, `trials`, `best`, the best trial's `metrics` and `artifacts`.

    Raises:
        RuntimeError: No trial produced a finite metric.
    """
    import optuna

    from pipelines.local_run import run

    output = os.path.abspath(output)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=space.goal,
                                sampler=optuna.samplers.TPESampler(seed=seed))
    runs: dict[int, dict[str, Any]] = {}

    def objective(trial) -> float:
        values = {}  # the trial's value of every parameter of the space, drawn by optuna
        for p in space.parameters:
            if p.type == "double":
                values[p.name] = trial.suggest_float(p.name, p.min, p.max, log=p.scale == "log")
            elif p.type == "integer":
                values[p.name] = trial.suggest_int(p.name, p.min, p.max, log=p.scale == "log")
            else:
                values[p.name] = trial.suggest_categorical(p.name, list(p.values))
        folder = os.path.join(output, "trials", str(trial.number))
        summary = run(kind, data, folder, {**params, **values})
        metric = trial_metric(epoch_values(kind, summary["artifacts"]["model"], space.metric),
                              space.goal)
        runs[trial.number] = {"summary": summary, "folder": folder}
        print(f"trial {trial.number}: {json.dumps(values, sort_keys=True)} -> "
              f"{space.metric} {metric:.4f}", flush=True)
        return metric  # NaN: optuna records the trial as failed and goes on

    study.optimize(objective, n_trials=trials)
    table = [{"number": t.number, "parameters": t.params, "state": t.state.name,
              "metric": t.value, "folder": runs.get(t.number, {}).get("folder")}
             for t in study.trials]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not done:
        raise RuntimeError(f"no trial of {trials} reported a finite {space.metric}; see "
                           f"{os.path.join(output, 'trials')}")
    best = study.best_trial
    best_run = runs[best.number]["summary"]
    summary = {
        "study": {"kind": kind, "space": space.to_json(), "trials": trials,
                  "sampler": f"optuna {optuna.__version__} TPE, seed {seed}"},
        "trials": table,
        "best": {"number": best.number, "parameters": best.params, "metric": best.value},
        "metrics": best_run["metrics"],
        "artifacts": best_run["artifacts"],
    }
    write_json_atomically(os.path.join(output, "summary.json"), summary, sort_keys=False)
    return summary
