"""Rehearse a compiled pipeline on this machine: the Vertex JSON users upload, or the
Kubeflow YAML (`tools.rehearsal.kubeflow`), run as the service would run it, not as the
Python pipeline function. `python -m tools.rehearsal --help` says what is rehearsed;
`rehearse(path, output, params)` is the same from Python. Its modules, each importing only
those above it:

    gcs_api   a Cloud Storage JSON API on loopback (an emulator)
    records   the error, task records, artifacts as they are passed on
    spec      the compiled IR read as the backend reads it
    runtimes  where a step's process runs (here or in its image); `start_step`
    cache     Vertex's execution cache, kept across rehearsals
    jobs      the Vertex service: CustomJobs, tuning jobs, API calls written down
    walk      the DAG walk both rehearsals share
    driver    `Rehearsal` and `rehearse`
    cli       the command line (`__main__` runs it)
    launcher  open-source KFP's pods and launcher
    kubeflow  the Kubeflow YAML rehearsed as KFP's driver runs it
    kubeflow_demo  the image and transformer Kubeflow pipelines on loopback S3 and MLflow
    trainjob  a Kubeflow Trainer TrainJob's nodes as processes
    step_site/sitecustomize.py   loaded by local step processes only (KFP's /gcs prefix)

The names other code uses as `rehearsal.<name>` are re-exported here.
"""

import importlib
from typing import Any

# Each re-exported name's module, imported when first asked for: the emulator
# (`python -m tools.rehearsal.gcs_api`) imports this package and must not load KFP with it.
_HOMES = {
    "records": ("RehearsalError",),
    "spec": ("LOCATION", "PROJECT", "evaluate_condition", "render"),
    "runtimes": ("ImageContainers", "open_mount"),
    "jobs": ("BEST_TRIAL_STEPS", "TUNING_JOB_LAUNCHER", "Preemption", "aip_env", "cluster_env"),
    "driver": ("Rehearsal", "rehearse"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
