"""Submit a compiled pipeline to Vertex AI Pipelines, once or on a schedule
(`--target kubeflow`: to a Kubeflow Pipelines server, `pipelines.submit_kubeflow`).

    python -m pipelines.submit build/image_pipeline.json --project P --region R \\
        --pipeline-root gs://BUCKET/pipeline-root --param data_uri=gs://BUCKET/pets \\
        [--param image_size=160 ...] [--service-account SA] [--experiment NAME] \\
        [--schedule "0 3 * * 1"] [--display-name N] [--no-cache] [--labels k=v[,k=v]] \\
        [--encryption-key K] [--network N] [--failure-policy fast|slow] [--dry-run]

`--param name=value` values take the type the pipeline declares for `name` (JSON for lists
and structs). Calls to Vertex use application-default credentials (`gcloud auth
application-default login`, or the machine's service account). Bad input exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform

from pipelines import quota
from pipelines.compiled import SubmitError, declared_parameters, load_pipeline_spec, parse_params

# GCP label keys and values: lowercase letters, digits, `_` and `-`; keys start with a letter.
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_KMS_KEY = re.compile(
    r"^projects/[^/]+/locations/(?P<location>[^/]+)/keyRings/[^/]+/cryptoKeys/[^/]+$")
# Vertex peers with a network named by project *number*, not project id.
_NETWORK = re.compile(r"^projects/\d+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?$")
# Each option's pattern and what it takes, in the order they are checked ("" refused only
# for the options argparse requires).
_REQUIRED = ("project", "region", "pipeline_root")
_OPTION_RULES = (
    ("project", re.compile(r"^([a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$"),
     " takes a project id (e.g. my-project-123)"),
    ("region", re.compile(r"^[a-z]+-[a-z]+\d+$"), " takes a Vertex AI region (e.g. europe-west4)"),
    ("encryption_key", _KMS_KEY, " takes projects/P/locations/L/keyRings/R/cryptoKeys/K"),
    ("network", _NETWORK, " takes projects/PROJECT_NUMBER/global/networks/NAME"),
    ("service_account", re.compile(r"^[^@\s]+@[^@\s]+\.gserviceaccount\.com$"),
     " takes a service account email"),
    ("experiment", re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$"),
     ": lowercase letters, digits and -, at most 128"),
    # where Vertex needs it: on Cloud Storage
    ("pipeline_root", re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/.*)?$"),
     " must be a Cloud Storage folder gs://BUCKET[/PATH] (bucket: 3-222 lowercase letters, "
     "digits, -, _ and .)"),
    # five fields, optionally after `TZ=Zone/Name ` or `CRON_TZ=...`
    ("schedule", re.compile(r"^\s*((CRON_)?TZ=\S+\s+)?[0-9A-Za-z*?/,-]+"
                            r"(\s+[0-9A-Za-z*?/,-]+){4}\s*$"),
     ' takes a cron expression of 5 fields (e.g. "0 3 * * 1" or "TZ=Europe/Paris 0 3 * * *")'),
)


@dataclasses.dataclass(frozen=True)
class Submission:
    """A run or a schedule to start, checked and typed: the options of the same names
    (`enable_caching` None: as compiled, `schedule` empty: one run now)."""

    template_path: str
    project: str
    region: str
    pipeline_root: str
    parameter_values: Mapping[str, Any]
    display_name: str
    service_account: str = ""
    network: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    encryption_key: str = ""
    enable_caching: bool | None = None
    experiment: str = ""
    schedule: str = ""
    failure_policy: str = ""


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """`["k=v,k2=v2", "k3=v3"]` to a label dict, checked against GCP's label rules."""
    labels: dict[str, str] = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep:
                raise SubmitError(f"--labels takes key=value, got {pair!r}")
            if not _LABEL_KEY.match(key):
                raise SubmitError(f"label key {key!r}: lowercase letters, digits, _ and -, "
                                  "starting with a letter, at most 63 characters")
            if not _LABEL_VALUE.match(value):
                raise SubmitError(f"label value {value!r} of {key!r}: lowercase letters, "
                                  "digits, _ and -, at most 63 characters")
            labels[key] = value
    return labels


# A Vertex TensorBoard or Cloud KMS key named in a compiled pipeline, with its region.
_REGIONAL_NAME = re.compile(r"projects/[^/\"\s\\]+/locations/(?P<location>[a-z0-9-]+)/"
                            r"(?:tensorboards|keyRings)/[^\"\s\\]+")
# Cloud Storage multi-regions (their regions' prefixes) and dual-regions (their regions).
_MULTI_REGIONS = {
    "us": ("us-",), "eu": ("europe-",), "asia": ("asia-",),
    "nam4": ("us-central1", "us-east1"), "eur4": ("europe-north1", "europe-west4"),
    "eur5": ("europe-west1", "europe-west2"), "eur7": ("europe-west3", "europe-west4"),
    "eur8": ("europe-west3", "europe-west6"), "asia1": ("asia-northeast1", "asia-northeast2"),
}


def compiled_regions(spec: Mapping[str, Any]) -> dict[str, str]:
    """Each TensorBoard or KMS key resource name the compiled pipeline carries, to its
    region (in job payloads and parameter defaults alike)."""
    return {m.group(0): m["location"] for m in _REGIONAL_NAME.finditer(json.dumps(spec))}


def check_compiled_regions(spec: Mapping[str, Any], region: str) -> None:
    """SubmitError naming the TensorBoard or key of another region than `region` that the
    pipeline was compiled with (Vertex refuses each such job mid-run)."""
    elsewhere = {name: where for name, where in compiled_regions(spec).items()
                 if where != region}
    if elsewhere:
        named = "; ".join(f"{name} (in {where})" for name, where in sorted(elsewhere.items()))
        raise SubmitError(f"the pipeline was compiled with {named}, but the run is in "
                          f"{region!r}, and Vertex needs them in the run's region: submit with "
                          f"--region {next(iter(elsewhere.values()))}, or compile again with "
                          f"a TensorBoard and key in {region}")


def in_region(location: str, region: str) -> bool | None:
    """Whether a Cloud Storage location (e.g. "EUROPE-WEST4", "EU", "NAM4") holds
    `region`; None for a location this table does not know."""
    location = location.lower()
    if location == region:
        return True
    if location in _MULTI_REGIONS:
        return any(region == r or (r.endswith("-") and region.startswith(r))
                   for r in _MULTI_REGIONS[location])
    return False if re.match(r"^[a-z]+-[a-z]+\d+$", location) else None


def bucket_warnings(uris: Sequence[str], region: str,
                    locate: Callable[[str], str]) -> list[str]:
    """Warnings (data may live anywhere) for the gs:// inputs among `uris` whose bucket
    (`locate`: its location, or raises) is outside `region`."""
    warnings = []
    for bucket in sorted({u[len("gs://"):].split("/", 1)[0] for u in uris
                          if isinstance(u, str) and u.startswith("gs://")}):
        try:
            location = locate(bucket)
        except Exception as err:  # permissions, a missing bucket: the run will say
            warnings.append(f"could not read the location of bucket {bucket!r} "
                            f"({type(err).__name__}): not compared with {region}")
            continue
        inside = in_region(location, region)
        if not inside:
            warnings.append(f"bucket {bucket!r} is in {location}"
                            + (", not in" if inside is False else ", which may not hold")
                            + f" the run's region {region}: its data is read across regions "
                            "(slower, and billed as network egress)")
    return warnings


def plan(args: argparse.Namespace) -> Submission:
    """Checks and types the command line; reads only the pipeline file.

    Raises:
        SubmitError: On any input Vertex would refuse.
    """
    spec = load_pipeline_spec(args.template)
    for option, pattern, takes in _OPTION_RULES:
        value = getattr(args, option)
        if (value or option in _REQUIRED) and not pattern.match(value):
            raise SubmitError(f"--{option.replace('_', '-')}{takes}, got {value!r}")
    key_region = _KMS_KEY.match(args.encryption_key)["location"] if args.encryption_key else ""
    if key_region and key_region != args.region:
        raise SubmitError(f"--encryption-key is in {key_region!r}; Vertex needs a key "
                          f"in the run's region {args.region!r}")
    if args.experiment and args.schedule:
        # The SDK links a run it creates; nothing would link the runs Vertex creates later.
        raise SubmitError("--experiment cannot be combined with --schedule")
    check_compiled_regions(spec, args.region)
    display_name = args.display_name or spec["pipelineInfo"]["name"]
    if len(display_name) > 128:
        raise SubmitError("--display-name: at most 128 characters")
    return Submission(
        template_path=args.template,
        project=args.project,
        region=args.region,
        pipeline_root=args.pipeline_root.rstrip("/"),
        parameter_values=parse_params(args.param, declared_parameters(spec)),
        display_name=display_name,
        service_account=args.service_account,
        network=args.network,
        labels=parse_labels(args.labels),
        encryption_key=args.encryption_key,
        enable_caching=False if args.no_cache else None,
        experiment=args.experiment,
        schedule=args.schedule,
        failure_policy=args.failure_policy,
    )


def build_job(submission: Submission, credentials=None) -> aiplatform.PipelineJob:
    """The unsent PipelineJob; `credentials` None: application-default credentials."""
    return aiplatform.PipelineJob(
        display_name=submission.display_name,
        template_path=submission.template_path,
        pipeline_root=submission.pipeline_root,
        parameter_values=dict(submission.parameter_values),
        enable_caching=submission.enable_caching,
        encryption_spec_key_name=submission.encryption_key or None,
        labels=dict(submission.labels) or None,
        project=submission.project,
        location=submission.region,
        credentials=credentials,
        failure_policy=submission.failure_policy or None,
    )


def build_schedule(job: aiplatform.PipelineJob, submission: Submission,
                   credentials=None) -> aiplatform.PipelineJobSchedule:
    """The unsent PipelineJobSchedule starting `job` (`build_job`) at each tick."""
    return aiplatform.PipelineJobSchedule(
        pipeline_job=job, display_name=submission.display_name, credentials=credentials,
        project=submission.project, location=submission.region)


# A schedule starts no run while its last one still runs.
RUNS_AT_ONCE = 1


def describe(submission: Submission, job: aiplatform.PipelineJob,
             schedule: aiplatform.PipelineJobSchedule | None = None) -> dict:
    """The request as JSON-ready data, without the pipeline spec, with what `launch` adds
    as it sends."""
    data = (job if schedule is None else schedule).to_dict()
    inner = data.get("createPipelineJobRequest", {}).get("pipelineJob", data)
    inner.pop("pipelineSpec", None)
    inner.update({key: value for key, value in (("serviceAccount", submission.service_account),
                                                ("network", submission.network)) if value})
    if schedule is not None:  # int64 as JSON writes it: a string
        data.update(cron=submission.schedule, maxConcurrentRunCount=str(RUNS_AT_ONCE))
    return data


def launch(submission: Submission, job: aiplatform.PipelineJob,
           schedule: aiplatform.PipelineJobSchedule | None = None) -> str:
    """Starts the run, or creates the schedule; returns its resource name."""
    if schedule is not None:
        schedule.create(cron=submission.schedule,
                        service_account=submission.service_account or None,
                        network=submission.network or None,
                        max_concurrent_run_count=RUNS_AT_ONCE)
        return schedule.resource_name
    job.submit(service_account=submission.service_account or None,
               network=submission.network or None,
               experiment=submission.experiment or None)
    return job.resource_name


def console_url(resource_name: str, project: str) -> str:
    """Where the run or schedule shows in the Google Cloud console."""
    m = re.match(r"^projects/[^/]+/locations/([^/]+)/(pipelineJobs|schedules)/([^/]+)$",
                 resource_name)
    if not m:
        return ""
    region, kind, name = m.groups()
    page = "runs" if kind == "pipelineJobs" else "schedules"
    return (f"https://console.cloud.google.com/vertex-ai/locations/{region}/pipelines/"
            f"{page}/{name}?project={project}")


LOCATE_SECONDS = 10


def _bucket_locator(submission: Submission, credentials) -> Callable[[str], str]:
    """A bucket's location through the Cloud Storage API, with the run's credentials."""
    from google.cloud import storage

    client = storage.Client(project=submission.project, credentials=credentials)
    # Only a warning hangs on it: one short try, not the client's minutes of retries.
    return lambda bucket: client.get_bucket(bucket, timeout=LOCATE_SECONDS,
                                            retry=None).location


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m pipelines.submit`."""
    p = argparse.ArgumentParser(prog="python -m pipelines.submit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("template", help="compiled pipeline, e.g. build/image_pipeline.json")
    p.add_argument("--project", required=True, help="Google Cloud project id")
    p.add_argument("--region", required=True, help="Vertex AI region, e.g. europe-west4")
    p.add_argument("--pipeline-root", required=True,
                   help="gs:// folder the run writes its artifacts under")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="pipeline parameter; repeatable")
    p.add_argument("--display-name", default="", help="default: the pipeline's name")
    p.add_argument("--service-account", default="",
                   help="service account of the pipeline run (its light steps, and the one "
                        "that starts the jobs); the custom jobs run as compile.py "
                        "--service-account, or Vertex's Custom Code Service Agent")
    p.add_argument("--experiment", default="", help="Vertex AI experiment to record the run in")
    p.add_argument("--schedule", default="", metavar="CRON",
                   help='create a schedule instead of one run, e.g. "0 3 * * 1"')
    p.add_argument("--no-cache", action="store_true", help="re-run every step, no cached results")
    p.add_argument("--labels", action="append", default=[], metavar="KEY=VALUE[,...]",
                   help="labels of the run; repeatable")
    p.add_argument("--encryption-key", default="", help="Cloud KMS key name (CMEK)")
    p.add_argument("--network", default="", help="projects/NUMBER/global/networks/NAME")
    p.add_argument("--failure-policy", choices=("fast", "slow"), default="",
                   help="when a step fails: slow (Vertex's default) keeps starting every step "
                        "that does not depend on it, so independent branches run to the end; "
                        "fast starts no new step, and steps already running still run to "
                        "completion")
    p.add_argument("--dry-run", action="store_true", help="print the request, send nothing")
    return p


def main(argv: list[str] | None = None, credentials=None) -> int:
    """Runs the command line (`argv` default: sys.argv[1:]; `credentials` None:
    application-default); returns 0, or 1 without credentials; bad input exits with 2."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--target", choices=("vertex", "kubeflow"), default="vertex")
    known, rest = first.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    if known.target == "kubeflow":
        from pipelines import submit_kubeflow

        return submit_kubeflow.main(rest)
    p = parser()
    args = p.parse_args(rest)
    if credentials is None and args.dry_run:
        credentials = AnonymousCredentials()  # a dry run sends nothing
    try:
        submission = plan(args)
        job = build_job(submission, credentials)
        schedule = (build_schedule(job, submission, credentials) if submission.schedule
                    else None)
    except ValueError as e:  # SubmitError, or the SDK's own checks of names and labels
        p.error(str(e))
    except auth_exceptions.DefaultCredentialsError:
        print("error: no Google Cloud credentials: run `gcloud auth application-default "
              "login` (or run where a service account is attached)", file=sys.stderr)
        return 1
    # Vertex checks the region's GPU quota only when each job starts, deep into a run.
    spec = load_pipeline_spec(submission.template_path)
    print(f"quota: this run holds {quota.describe(quota.gpus_at_once(spec))} at once in "
          f"{submission.region} (Vertex custom training GPUs per region: "
          f"{quota.quota_note(quota.quotas(spec)) or 'none'})", file=sys.stderr)
    if args.dry_run:
        print(json.dumps(describe(submission, job, schedule), indent=2, sort_keys=True))
        return 0
    for warning in bucket_warnings([submission.pipeline_root,
                                    *submission.parameter_values.values()],
                                   submission.region, _bucket_locator(submission, credentials)):
        print(f"warning: {warning}", file=sys.stderr)
    name = launch(submission, job, schedule)
    print(name)
    url = console_url(name, submission.project)
    if url:
        print(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
