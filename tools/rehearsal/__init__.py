"""Rehearse a compiled pipeline on this machine: the Vertex JSON users upload, or the
Kubeflow YAML (`tools.rehearsal.kubeflow`).

The file runs as Vertex Pipelines would run it, not as the Python pipeline function; only
the Vertex service is stood in for. `python -m tools.rehearsal --help` (the doc of `cli`) says
what is rehearsed and how; `rehearse(path, output, params)` is the same from Python. A
package of its own beside `pipelines`: it runs the compiled JSON, not the definitions, and
takes from `pipelines` only the parameter parser (`params`) and the run summaries
(`catalogue`). By responsibility (each module imports only those above it):

    gcs_api   a real Cloud Storage JSON API on loopback (an emulator), for steps inside
              images and for tests
    records   the error, each task's record, artifacts as they are passed on
    spec      reading the compiled IR: parameters, typed values, conditions, task order,
              executor inputs and placeholders, resolved as the Vertex backend does
    runtimes  where a step's process runs, here (local) or in its image with buildah, and
              `start_step`, which starts every step's process of both rehearsals
    cache     Vertex's execution cache, kept across rehearsals
    jobs      the Vertex service: CustomJobs with replicas, CLUSTER_SPEC/TF_CONFIG/AIP_*,
              preemption, tuning jobs and the best trial, API calls answered and written
    walk      the DAG walk both rehearsals share (order, records, skips)
    driver    `Rehearsal`, which walks the DAG task by task, and `rehearse`
    cli       the command line (`__main__` runs it)
    launcher  open-source KFP's pods and launcher (copies in, uploads on success)
    kubeflow  the Kubeflow YAML rehearsed as KFP's driver runs it (`python -m
              tools.rehearsal.kubeflow`), retries, loops and `Collected` included
    kubeflow_demo  the image and transformer Kubeflow pipelines on loopback S3 and MLflow
    step_site/sitecustomize.py   loaded by local step processes only (KFP's /gcs prefix)

The names other code uses as `rehearsal.<name>` are re-exported here.
"""

import importlib
from typing import Any

# Each re-exported name and the module it lives in, imported when first asked for: the
# emulator (`python -m tools.rehearsal.gcs_api`, started for every rehearsal in images and by the
# tests) imports this package first, and must not load KFP and the pipelines with it.
_HOMES = {
    "records": ("ArtifactRef", "RehearsalError", "TaskRecord"),
    "spec": ("LOCATION", "PROJECT", "PROJECT_NUMBER", "evaluate_condition", "render",
             "topological_order", "typed_value"),
    "runtimes": ("BUILDAH", "GCS_MOUNT", "RUNTIMES", "SITE_DIR",
                 "ImageContainers", "open_mount"),
    "cache": ("TaskCache", "cache_key"),
    "jobs": ("BEST_TRIAL_STEPS", "CUSTOM_JOB_LAUNCHER", "GCPC_LAUNCHER_PREFIX",
             "REGISTRY_LOOKUP", "TUNING_JOB_LAUNCHER", "VERTEX_METRIC_FILE", "Preemption",
             "aip_env", "cluster_env"),
    "driver": ("Rehearsal", "rehearse"),
    "cli": ("main",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
