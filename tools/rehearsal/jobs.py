"""The Vertex AI service as a rehearsal stands in for it: its jobs and its API calls.

Every container task runs as a job of one replica. A GCPC CustomJob task is unwrapped
from its launcher payload, parsed into Vertex's own `CustomJob` message, and every replica
of every worker pool runs as a process (`runtimes.start_step`) with the environment Vertex
sets (`CLUSTER_SPEC`, `TF_CONFIG`, `AIP_*`); a `--preempt` rule preempts a replica
(SIGTERM, the kill after the grace period) and restarts it as Vertex restarts a preempted
worker. A hyperparameter tuning job runs its trials one by one, and the best-trial steps
read that rehearsed job instead of the Vertex API. Calls to the API itself (the Model
Registry upload and lookup) are built, checked and written to `vertex-requests/`, not
sent. Every request is written there too.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

from components.common.storage import write_json_atomically
from tools.rehearsal import gcs_api
from tools.rehearsal.records import ArtifactRef, Preemption, RehearsalError, TaskRecord
from tools.rehearsal.runtimes import (
    GCS_MOUNT,
    GRACE_PERIOD_S,
    Runtime,
    start_step,
    stop,
    without_gpus,
)
from tools.rehearsal.spec import LOCATION, PROJECT_NUMBER

# Where Vertex has a trial write its metrics (CLOUD_ML_HP_METRIC_FILE), as its users report
# it (GoogleCloudPlatform/cloudml-hypertune#6: writable only by root unless the image makes
# /var/hypertune its user's).
VERTEX_METRIC_FILE = "/var/hypertune/output.metrics"
CUSTOM_JOB_LAUNCHER = "google_cloud_pipeline_components.container.v1.custom_job.launcher"
# Our tuning step's launcher: it calls the Vertex API, which the rehearsal stands in for.
TUNING_JOB_LAUNCHER = "components.tune.launch"
GCPC_LAUNCHER_PREFIX = "google_cloud_pipeline_components.container."
# Our Model Registry lookup (components.register.vertex_upload.find_registered_model): a
# Vertex API call like GCPC's, so it is stood in for, from the `registry` given.
REGISTRY_LOOKUP = "find_registered_model"
# Our best-trial steps (components.tune.component) read the tuning job from Vertex: the
# rehearsal runs their selection code on the job it rehearsed instead.
BEST_TRIAL_STEPS = {"best_image_trial": "image", "best_text_trial": "text",
                    "best_transformer_trial": "transformer"}


def task_kind(container: Mapping[str, Any], command: list[str], args: list[str]) -> str:
    """What Vertex does with a container task, judged from its container and command line.

    Args:
        container: The executor's container spec (its command unresolved).
        command: The resolved command.
        args: The resolved arguments.

    Returns:
        "custom-job" (GCPC's launcher), "tuning-job" (ours), "api-call" (another GCPC
        launcher), "registry-lookup", "best-trial" (our steps that call the API) or
        "process" (a step that runs as it is).
    """
    # The custom-job launcher is a GCPC launcher too: it is told apart first.
    if container.get("command", [])[-1:] == [CUSTOM_JOB_LAUNCHER]:
        return "custom-job"
    if TUNING_JOB_LAUNCHER in command:
        return "tuning-job"
    if any(part.startswith(GCPC_LAUNCHER_PREFIX) for part in command):
        return "api-call"
    if REGISTRY_LOOKUP in args:
        return "registry-lookup"
    if set(BEST_TRIAL_STEPS) & set(args):
        return "best-trial"
    return "process"


def cluster_env(pool_sizes: list[int], pool: int, index: int, job: dict[str, Any],
                ports: list[list[int]]) -> dict[str, str]:
    """`CLUSTER_SPEC` and `TF_CONFIG` of one replica, as Vertex sets them.

    Args:
        pool_sizes: Replica count of each worker pool.
        pool: This replica's worker pool.
        index: This replica's index within its pool.
        job: The CustomJob payload (Vertex includes it as "job").
        ports: A port per replica of each pool (loopback stands in for the hosts).

    Returns:
        The two variables; empty when the job has a single replica.
    """
    if sum(pool_sizes) <= 1:
        return {}
    tasks = ("chief", "worker", "ps", "evaluator")
    cluster = {f"workerpool{p}": [f"127.0.0.1:{port}" for port in ports[p]]
               for p, size in enumerate(pool_sizes) if size}
    tf_cluster = {tasks[p]: [f"127.0.0.1:{port}" for port in ports[p]]
                  for p, size in enumerate(pool_sizes) if size and tasks[p] != "evaluator"}
    return {
        "CLUSTER_SPEC": json.dumps({"cluster": cluster, "environment": "cloud",
                                    "task": {"type": f"workerpool{pool}", "index": index},
                                    "job": job}),
        "TF_CONFIG": json.dumps({"cluster": tf_cluster, "environment": "cloud",
                                 "task": {"type": tasks[pool], "index": index}, "job": job}),
    }


def aip_env(base_output_directory: str) -> dict[str, str]:
    """The `AIP_*` folders Vertex sets when a job has a base output directory."""
    if not base_output_directory:
        return {}
    base = base_output_directory.rstrip("/")
    return {"AIP_MODEL_DIR": f"{base}/model/", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
            "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/"}


def write_request(output: str, record: TaskRecord, kind: str, request: dict[str, Any]) -> None:
    """Keeps what would be sent to Vertex in `OUTPUT/vertex-requests/<task>.json`, to read."""
    folder = os.path.join(output, "vertex-requests")
    os.makedirs(folder, exist_ok=True)
    write_json_atomically(os.path.join(folder, record.name.replace("/", "-") + ".json"),
                          {"type": kind, "request": request}, sort_keys=False)


def _draw(parameter, rng) -> float:
    """A random value of one study-spec parameter (`contract.draw_value`), as Vertex passes
    it: numbers as floats."""
    from components.tune.contract import Parameter, draw_value

    field = type(parameter).pb(parameter).WhichOneof("parameter_value_spec")
    spec = getattr(parameter, field)
    scale = "log" if parameter.scale_type.name == "UNIT_LOG_SCALE" else "linear"
    return float(draw_value(Parameter(
        parameter.parameter_id, field.split("_")[0], getattr(spec, "min_value", None),
        getattr(spec, "max_value", None), scale, tuple(getattr(spec, "values", ()))), rng))


def _read_reports(path: str) -> list[dict[str, Any]]:
    """The hypertune reports of one trial (one JSON object per line), none if no file."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _flag(args: list[str], name: str) -> str:
    if name not in args:
        raise RehearsalError(f"launcher arguments have no {name}")
    return args[args.index(name) + 1]


class VertexService:
    """Vertex as rehearsed: its job service (every replica of a job is a process of
    `runtime`) and the other API calls of a pipeline's tasks (answered here, not sent).

    Args:
        runtime: Where the processes run (and the local files of artifacts are).
        output: The rehearsal's folder (logs/ and vertex-requests/ are in it).
        job_uuid: The pipeline job's id (tuning job ids derive from it).
        preempt: Preemptions to apply, each once.
        registry: The stand-in Model Registry: display name -> model resource name.
    """

    def __init__(self, runtime: Runtime, output: str, job_uuid: str,
                 preempt: list[Preemption], registry: Mapping[str, str] | None = None) -> None:
        self.runtime = runtime
        self.output = output
        self.job_uuid = job_uuid
        self.preempt = preempt
        self.registry = dict(registry or {})
        self.tuning_jobs: dict[str, Any] = {}  # rehearsed tuning jobs by resource name

    def container_task(self, record: TaskRecord, command: list[str], image: str) -> None:
        """Runs a pipeline task's own container, as Vertex does: a job of one replica."""
        record.replicas = 1
        self._run_replicas(record, [[command]], [[{}]], restart_all=False, images=[image])

    def custom_job(self, record: TaskRecord, args: list[str]) -> None:
        """Runs the CustomJob a GCPC launcher would create from its `--payload`."""
        job = self._payload(record, args)
        spec = job["job_spec"]
        pools = spec["worker_pool_specs"]
        if pools[0].get("replica_count", 1) != 1:
            raise RehearsalError(f"{record.name}: Vertex requires workerpool0 to have exactly "
                                 "one replica")
        sizes = [int(p.get("replica_count", 0)) if p else 0 for p in pools]
        commands = [[p["container_spec"].get("command", []) + p["container_spec"].get("args", [])
                     ] * size for p, size in zip(pools, sizes)]
        env = without_gpus({e["name"]: e["value"] for p in pools if p
                            for e in p["container_spec"].get("env", [])})
        env.update(aip_env(spec.get("base_output_directory", {}).get("output_uri_prefix", "")))
        restart_all = bool(spec.get("scheduling", {}).get("restart_job_on_worker_restart"))
        record.replicas = sum(sizes)

        def environments():
            ports = [[gcs_api.free_port() for _ in range(size)] for size in sizes]
            return [[{**env, **cluster_env(sizes, p, i, job, ports)} for i in range(size)]
                    for p, size in enumerate(sizes)]

        self._run_replicas(record, commands, environments, restart_all,
                           images=[p["container_spec"]["image_uri"] if p else "" for p in pools])

    def tuning_job(self, record: TaskRecord, args: list[str]) -> None:
        """Runs the tuning step's own launcher (`components.tune.launch`), Vertex's job
        service stood in for: a job created is written down and run (`_run_tuning_job`)."""
        from types import SimpleNamespace

        from google.protobuf import json_format

        from components.tune import launch

        parsed = launch.parse_args(args)
        parsed.gcp_resources = self.runtime.host_path(parsed.gcp_resources)
        service = SimpleNamespace(
            create_hyperparameter_tuning_job=lambda parent, hyperparameter_tuning_job: (
                self._run_tuning_job(record, hyperparameter_tuning_job)),
            get_hyperparameter_tuning_job=lambda name, retry: self.tuning_jobs[name])
        try:
            launch.launch(parsed, service, sleep=lambda _: None)
        except json_format.ParseError as err:
            raise RehearsalError(f"{record.name}: Vertex would reject the tuning job: "
                                 f"{err}") from err

    def _run_tuning_job(self, record: TaskRecord, job) -> Any:
        """Runs a hyperparameter tuning job as Vertex would: each trial is a process of the
        trial pool's container with the trial's `--name=value` arguments appended and the
        `AIP_*` folders of `<base>/<trial id>`; the metric it reports through hypertune
        becomes its final measurement. Values are drawn at random (seeded) from the study
        spec (Vertex's own search is not reproduced), one trial at a time."""
        import random

        job = type(job)(job)  # Vertex's copy
        write_request(self.output, record, "HyperparameterTuningJob",
                      type(job).to_dict(job, use_integers_for_enums=False))
        spec = job.trial_job_spec
        if len(spec.worker_pool_specs) != 1 or spec.worker_pool_specs[0].replica_count != 1:
            raise RehearsalError(f"{record.name}: trials run one pool of one replica here")
        base = spec.base_output_directory.output_uri_prefix.rstrip("/")
        if not base.startswith("gs://"):
            raise RehearsalError(f"{record.name}: the tuning job has no gs:// base output "
                                 "directory; trials would get no AIP_MODEL_DIR")
        draw = random.Random(job.display_name)
        trials = []
        for number in range(1, job.max_trial_count + 1):
            trials.append(self._trial(record, job, str(number), base, draw, trials))
        job_id = int(hashlib.sha1(f"{self.job_uuid}/{record.name}".encode()).hexdigest()[:9], 16)
        job.name = (f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/hyperparameterTuningJobs/"
                    f"{job_id}")
        job.trials = trials
        job.state = "JOB_STATE_SUCCEEDED"
        self.tuning_jobs[job.name] = job
        record.replicas = len(trials)
        return job

    def _payload(self, record: TaskRecord, args: list[str]) -> dict[str, Any]:
        """The launcher's CustomJob `--payload` as it sends it, checked by Vertex's own
        message (its refusal is the rehearsal's), and written down."""
        from google.cloud import aiplatform_v1
        from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util

        try:
            request = json_util.recursive_remove_empty(
                json.loads(_flag(args, "--payload"), strict=False))
        except json.JSONDecodeError as err:
            raise RehearsalError(f"{record.name}: the resolved CustomJob payload is not JSON "
                                 f"({err})") from err
        try:
            aiplatform_v1.CustomJob(request)
        except (KeyError, ValueError, TypeError) as err:
            raise RehearsalError(f"{record.name}: Vertex would reject the CustomJob: "
                                 f"{type(err).__name__}: {err}") from err
        write_request(self.output, record, "CustomJob", request)
        return request

    def _trial(self, record: TaskRecord, job, trial_id: str, base: str, draw,
               earlier: list) -> Any:
        """One trial of `job` as Vertex's `Trial` (INFEASIBLE if it failed; more failures
        than the job allows end the job)."""
        from google.cloud import aiplatform_v1

        pool = job.trial_job_spec.worker_pool_specs[0].container_spec
        metric = job.study_spec.metrics[0]
        maximize = metric.goal.name == "MAXIMIZE"
        containers = self.runtime.containers
        values = {p.parameter_id: _draw(p, draw) for p in job.study_spec.parameters}
        reports = self.runtime.local(f"{base}/{trial_id}/hypertune.metrics")
        # Inside the image, the metric file is where Vertex puts it, written as the
        # image's user; in-process, a file of the rehearsal's.
        metric_file = VERTEX_METRIC_FILE if containers else self.runtime.step_path(
            f"{base}/{trial_id}/hypertune.metrics")
        env = {**without_gpus({e.name: e.value for e in pool.env}),
               **aip_env(f"{base}/{trial_id}"), "CLOUD_ML_TRIAL_ID": trial_id,
               "CLOUD_ML_HP_METRIC_FILE": metric_file}
        command = [*pool.command, *pool.args, *(f"--{k}={v}" for k, v in values.items())]
        trial = aiplatform_v1.Trial(id=trial_id, state="SUCCEEDED", parameters=[
            aiplatform_v1.Trial.Parameter(parameter_id=k, value=v) for k, v in values.items()])
        try:
            self._run_replicas(record, [[command]], [[env]], restart_all=False,
                               images=[pool.image_uri])
        except RehearsalError as err:
            trial.state = "INFEASIBLE"
            print(f"[rehearse] {record.display_name}: trial {trial_id} failed: {err}")
            if len([t for t in earlier if t.state.name != "SUCCEEDED"]) + 1 > max(
                    job.max_failed_trial_count, 1):
                raise
        if containers:
            os.makedirs(os.path.dirname(reports), exist_ok=True)
            with open(reports, "w") as f:
                f.write(containers.take_file(pool.image_uri, VERTEX_METRIC_FILE))
        measured = [float(r[metric.metric_id]) for r in _read_reports(reports)
                    if metric.metric_id in r]
        if trial.state.name == "SUCCEEDED" and measured:
            trial.final_measurement = aiplatform_v1.Measurement(metrics=[
                aiplatform_v1.Measurement.Metric(
                    metric_id=metric.metric_id,
                    value=(max if maximize else min)(measured))])
        print(f"[rehearse] {record.display_name}: trial {trial_id} {values} -> "
              f"{metric.metric_id} {measured[-1:] or 'none reported'}")
        return trial

    def best_trial(self, record: TaskRecord, args: list[str],
                   executor_input: dict[str, Any]) -> dict[str, Any]:
        """Runs the best-trial step's selection on the rehearsed tuning job (the step
        itself would read it from the Vertex API); returns the step's outputs."""
        from components.tune.contract import TUNABLE
        from components.tune.selection import choose

        (step,) = set(BEST_TRIAL_STEPS) & set(args)
        kind = BEST_TRIAL_STEPS[step]
        values = executor_input["inputs"]["parameterValues"]
        artifact = executor_input["outputs"]["artifacts"]["trials"]["artifacts"][0]
        trials = ArtifactRef.of(artifact, path=self.runtime.local(artifact["uri"]))
        best = choose(kind, values["gcp_resources"], {k: values[k] for k in TUNABLE[kind]},
                      trials, fetch=self.tuning_jobs.__getitem__)
        record.state = "succeeded"
        record.note = ("GetHyperparameterTuningJob calls the Vertex API; the rehearsed job "
                       f"was read instead: best values {best}")
        print(f"[rehearse] {record.display_name}: {record.note}")
        return {"parameters": best, "artifacts": {"trials": trials}}

    def _run_replicas(self, record: TaskRecord, commands: list[list[list[str]]],
                      environments: list | Callable[[], list], restart_all: bool,
                      images: list[str]) -> None:
        """Runs each pool's replicas (`commands`, `environments`: a function makes them
        afresh, new ports, when the whole job restarts); applies a pending preemption."""
        logs = os.path.join(self.runtime.logs, record.name.replace("/", "-"))
        os.makedirs(logs, exist_ok=True)
        rule = Preemption.pending(self.preempt, record)
        self.runtime.before_job()

        log_paths: dict[tuple[int, int], str] = {}  # each replica's current log

        def start(pool: int, index: int, attempt: int, envs) -> subprocess.Popen:
            log_path = os.path.join(logs, f"workerpool{pool}-{index}.attempt{attempt}.log")
            log_paths[pool, index] = log_path
            return start_step(commands[pool][index], envs[pool][index], log_path,
                              {self.runtime.gcs: GCS_MOUNT}, self.runtime.containers,
                              images[pool])

        envs = environments() if callable(environments) else environments
        attempt = 1
        procs = {(p, i): start(p, i, attempt, envs)
                 for p in range(len(commands)) for i in range(len(commands[p]))}
        record.attempts = 1
        while True:
            codes = {key: proc.poll() for key, proc in procs.items()}  # every one polled
            failed = next((key for key, code in codes.items() if code), None)
            if failed or None not in codes.values():
                # Vertex fails the job when a replica fails and stops the others (which
                # would otherwise wait on the lost peer's all-reduce for ever).
                for proc in procs.values():
                    stop(proc)
                break
            if rule and not rule.done and glob.glob(os.path.join(self.runtime.gcs, rule.pattern),
                                                    recursive=True):
                rule.done = True
                victims = list(procs) if restart_all else [(0, 0)]
                print(f"[rehearse] {record.display_name}: preempting "
                      f"{'the whole job' if restart_all else 'workerpool0 replica 0'} "
                      f"({rule.pattern} exists), then restarting")
                for key in victims:
                    stop(procs[key], GRACE_PERIOD_S)
                attempt += 1
                record.attempts = attempt
                if restart_all:
                    envs = environments() if callable(environments) else environments
                for key in victims:
                    procs[key] = start(*key, attempt, envs)
            time.sleep(0.2)
        if failed:
            (pool, index), code, log_path = failed, procs[failed].returncode, log_paths[failed]
            with open(log_path) as f:
                tail = f.read()[-3000:]
            record.state = "failed"
            raise RehearsalError(f"{record.display_name}: workerpool{pool} replica {index} "
                                 f"exited with {code}; log {log_path}:\n{tail}")

    def gcpc_call(self, record: TaskRecord, args: list[str],
                  executor_input: dict[str, Any]) -> None:
        """Builds the request a GCPC launcher would send, checks it, and writes it down."""
        from google.cloud import aiplatform_v1
        from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util
        from google_cloud_pipeline_components.container.v1.model.upload_model import (
            remote_runner as upload,
        )

        kind = _flag(args, "--type")
        request = json.loads(_flag(args, "--payload"), strict=False)
        if kind == "UploadModel":
            request = json_util.recursive_remove_empty(
                upload.append_unmanaged_model_artifact_into_payload(
                    json.dumps(executor_input), request))
            try:
                aiplatform_v1.Model(request)
            except (KeyError, ValueError, TypeError) as err:
                raise RehearsalError(f"{record.name}: Vertex would reject the model upload: "
                                     f"{err}") from err
            if not request.get("container_spec", {}).get("image_uri"):
                raise RehearsalError(f"{record.name}: the model upload has no serving image")
            if "--parent_model_name" in args:
                # the launcher sends it beside the model: a new version of that model
                request = {**request, "parent_model": _flag(args, "--parent_model_name")}
        write_request(self.output, record, kind, request)
        record.state = "not-executed"
        record.note = f"{kind} calls the Vertex API; the request was checked and written"
        print(f"[rehearse] {record.display_name}: {record.note}")

    def registry_lookup(self, record: TaskRecord,
                        executor_input: dict[str, Any]) -> dict[str, Any]:
        """Answers the Model Registry lookup from `self.registry` (display name -> model
        resource name) and writes down the ListModels request it stands for."""
        values = executor_input["inputs"]["parameterValues"]
        name = values["display_name"]
        found = self.registry.get(name)
        write_request(self.output, record, "ListModels", {
            "parent": f"projects/{values['project']}/locations/{values['location']}",
            "filter": f'display_name="{name}"'})
        record.state = "not-executed"
        record.note = (f"ListModels calls the Vertex API; answered {found or 'none'} from the "
                       "rehearsal's registry")
        print(f"[rehearse] {record.display_name}: {record.note}")
        artifact = executor_input["outputs"]["artifacts"]["parent"]["artifacts"][0]
        parent = ArtifactRef.of(artifact, path=self.runtime.local(artifact["uri"]),
                                metadata={"resourceName": found} if found else {})
        return {"parameters": {"exists": found is not None}, "artifacts": {"parent": parent}}
