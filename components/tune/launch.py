"""The Vertex tuning step: creates the `aiplatform_v1.HyperparameterTuningJob` its arguments
describe (the proto checks every field) and waits for its end, as GCPC's launcher does: a
step restarted waits for the job its `gcp_resources` names; a SIGTERM cancels the job.

    python3 -m components.tune.launch --project P --location L --display_name NAME ... \
        --trials URI --gcp_resources FILE
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from components.common.commands import reports
from components.tune.selection import job_client, job_resources, tuning_job_name

# `--tune-early-stopping`: StudySpec's automated stopping of each rule.
STOPPING_FIELDS = {"median": "median_automated_stopping_spec",
                   "decay-curve": "decay_curve_stopping_spec"}
STOPPING_RULES = ("none", *STOPPING_FIELDS)
# The step's inputs (`pipelines.definitions.tuning.as_tuning_job` passes them all), as text
# or as JSON (numbers too: the proto refuses a count of 2.5, takes one of 2.0).
TEXT_ARGS = ("project", "location", "display_name", "study_spec_algorithm",
             "study_spec_measurement_selection_type", "study_spec_stopping", "tensorboard",
             "scheduling_strategy", "max_wait_duration", "network", "encryption_spec_key_name",
             "service_account")
JSON_ARGS = ("study_spec_metrics", "study_spec_parameters", "worker_pool_specs",
             "max_trial_count", "parallel_trial_count", "max_failed_trial_count")
POLL_SECONDS = 20  # GCPC's launcher's
# The run's labels (billing) the backend gives its steps, which GCPC's launcher puts on jobs.
SYSTEM_LABELS = "VERTEX_AI_PIPELINES_RUN_LABELS"
FAILED = ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_PAUSED")


class TuningJobError(RuntimeError):
    """The tuning job ended without succeeding; the message carries Vertex's error."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The step's command line: every input of `TEXT_ARGS` and `JSON_ARGS`, the outputs."""
    parser = argparse.ArgumentParser(prog="python3 -m components.tune.launch")
    for name in TEXT_ARGS:
        parser.add_argument(f"--{name}", required=True)
    for name in JSON_ARGS:
        # the backend's executor input (`{{$.json_escape[1]}}`) may hold control characters
        parser.add_argument(f"--{name}", required=True,
                            type=lambda text: json.loads(text, strict=False))
    parser.add_argument("--trials", required=True, help="URI of the trials' folder")
    parser.add_argument("--gcp_resources", required=True, help="file to write the job into")
    return parser.parse_args(argv)


def tuning_job(args: argparse.Namespace, labels: dict[str, str] | None = None):
    """The job `args` describe, stopping trials by elapsed time (a study's trials share
    their machines, so time tracks the epochs reported).

    Raises:
        google.protobuf.json_format.ParseError: A field Vertex's message does not have.
    """
    from google.cloud import aiplatform_v1

    stopping = STOPPING_FIELDS.get(args.study_spec_stopping)
    scheduling = {"strategy": args.scheduling_strategy,
                  "max_wait_duration": args.max_wait_duration}
    trial_job_spec = {
        "worker_pool_specs": args.worker_pool_specs, "service_account": args.service_account,
        "network": args.network, "base_output_directory": {"output_uri_prefix": args.trials},
        "scheduling": {name: value for name, value in scheduling.items() if value},
        "tensorboard": args.tensorboard}
    job = {
        "display_name": args.display_name,
        "study_spec": {
            "metrics": args.study_spec_metrics, "parameters": args.study_spec_parameters,
            "algorithm": args.study_spec_algorithm,
            "measurement_selection_type": args.study_spec_measurement_selection_type,
            **({stopping: {"use_elapsed_duration": True}} if stopping else {})},
        "max_trial_count": args.max_trial_count,
        "parallel_trial_count": args.parallel_trial_count,
        "max_failed_trial_count": args.max_failed_trial_count,
        # what is not set stays unset: an empty message would reach Vertex as one given
        "trial_job_spec": {name: value for name, value in trial_job_spec.items() if value},
        "labels": labels or {},
    }
    if args.encryption_spec_key_name:
        job["encryption_spec"] = {"kms_key_name": args.encryption_spec_key_name}
    return aiplatform_v1.HyperparameterTuningJob.from_json(json.dumps(job))


def launch(args: argparse.Namespace, client, sleep: Callable[[float], None] = time.sleep):
    """Creates the job (or finds the one `gcp_resources` names) and waits for its end.

    Args:
        args: `parse_args`'s.
        client: Vertex's `JobServiceClient` (tests and the rehearsal pass a stand-in).
        sleep: Waits between two reads of the job.

    Returns:
        The succeeded job.

    Raises:
        TuningJobError: The job failed, was cancelled or paused.
    """
    from google.api_core import retry

    if os.path.exists(args.gcp_resources) and os.path.getsize(args.gcp_resources):
        with open(args.gcp_resources) as f:
            name = tuning_job_name(f.read())
        print(f"the step restarted: waiting for its tuning job {name}", flush=True)
    else:
        try:  # GCPC's launcher skips labels that are not JSON
            labels = json.loads(os.environ.get(SYSTEM_LABELS) or "{}")
        except json.JSONDecodeError:
            labels = {}
        name = client.create_hyperparameter_tuning_job(
            parent=f"projects/{args.project}/locations/{args.location}",
            hyperparameter_tuning_job=tuning_job(args, labels)).name
        os.makedirs(os.path.dirname(args.gcp_resources) or ".", exist_ok=True)
        with open(args.gcp_resources, "w") as f:
            f.write(job_resources(name))
        print(f"created tuning job {name}", flush=True)

    def cancel(signum, frame) -> None:
        print(f"SIGTERM: cancelling tuning job {name}", flush=True)
        client.cancel_hyperparameter_tuning_job(name=name)
        sys.exit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, cancel)
    try:
        while True:
            # transient errors are retried for 10 minutes, as GCPC's launcher does
            job = client.get_hyperparameter_tuning_job(name=name, retry=retry.Retry(timeout=600))
            if job.state.name == "JOB_STATE_SUCCEEDED":
                return job
            if job.state.name in FAILED:
                raise TuningJobError(f"tuning job {name} ended {job.state.name}: "
                                     f"{job.error.message or 'no error given'} "
                                     f"(code {job.error.code})")
            sleep(POLL_SECONDS)
    finally:
        signal.signal(signal.SIGTERM, previous)


@reports(TuningJobError)
def main(argv: Sequence[str] | None = None, client: Any = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    launch(args, client or job_client(args.location))
    return 0


if __name__ == "__main__":
    sys.exit(main())
