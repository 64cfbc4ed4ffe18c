"""Rehearse a compiled Vertex pipeline (the JSON users upload) on this machine.

The file runs as Vertex Pipelines would run it, not as the Python pipeline function; only
the Vertex service is stood in for. `python -m pipelines.rehearse --help` (the doc of
`cli`) says what is rehearsed and how; `rehearse(path, output, params)` is the same from
Python. The package, by responsibility (each module imports only those above it):

    records   the error, each task's record, artifacts as they are passed on
    spec      reading the compiled IR: parameters, typed values, conditions, task order,
              executor inputs and placeholders, resolved as the Vertex backend does
    runtimes  where a step's process runs: here (local) or in its image with buildah
    cache     Vertex's execution cache, kept across rehearsals
    jobs      the Vertex service: CustomJobs with replicas, CLUSTER_SPEC/TF_CONFIG/AIP_*,
              preemption, tuning jobs and the best trial, API calls answered and written
    driver    `Rehearsal`, which walks the DAG task by task, and `rehearse`
    cli       the command line (`__main__` runs it)

The names other code uses as `rehearse.<name>` are re-exported here.
"""

from pipelines.rehearse.cache import TaskCache, cache_key
from pipelines.rehearse.cli import main
from pipelines.rehearse.driver import Rehearsal, rehearse
from pipelines.rehearse.jobs import (
    BEST_TRIAL_STEPS,
    CUSTOM_JOB_LAUNCHER,
    GCPC_LAUNCHER_PREFIX,
    REGISTRY_LOOKUP,
    TUNING_JOB_LAUNCHER,
    VERTEX_METRIC_FILE,
    Preemption,
    aip_env,
    cluster_env,
)
from pipelines.rehearse.records import ArtifactRef, RehearsalError, TaskRecord
from pipelines.rehearse.runtimes import (
    BUILDAH,
    GCS_MOUNT,
    MOUNT_ENV,
    RUNTIMES,
    SITE_DIR,
    ImageContainers,
    open_mount,
)
from pipelines.rehearse.spec import (
    LOCATION,
    PROJECT,
    PROJECT_NUMBER,
    evaluate_condition,
    render,
    topological_order,
    typed_value,
)

__all__ = [
    "ArtifactRef", "RehearsalError", "TaskRecord",
    "LOCATION", "PROJECT", "PROJECT_NUMBER", "evaluate_condition", "render",
    "topological_order", "typed_value",
    "BUILDAH", "GCS_MOUNT", "MOUNT_ENV", "RUNTIMES", "SITE_DIR", "ImageContainers",
    "open_mount",
    "TaskCache", "cache_key",
    "BEST_TRIAL_STEPS", "CUSTOM_JOB_LAUNCHER", "GCPC_LAUNCHER_PREFIX", "REGISTRY_LOOKUP",
    "TUNING_JOB_LAUNCHER", "VERTEX_METRIC_FILE", "Preemption", "aip_env", "cluster_env",
    "Rehearsal", "rehearse",
    "main",
]
