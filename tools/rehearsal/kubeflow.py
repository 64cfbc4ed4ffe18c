"""Rehearse a compiled Kubeflow pipeline (the YAML `compile.py --target kubeflow` writes) as
open-source Kubeflow Pipelines runs it, on this machine.

    python -m tools.rehearsal.kubeflow build/kubeflow/image_pipeline.yaml --output DIR
        --pipeline-root s3://BUCKET/root [--param NAME=VALUE ...] [--secret NAME=KEY=VALUE ...]
        [--kill TASK=BUCKET/GLOB ...] [--delete-pod TASK=BUCKET/GLOB ...]
        [--backend 2.14|2.15|2.16|2.17] [--runtime local|image]
    python -m tools.rehearsal.kubeflow --retry-run --output DIR [--secret ...] [--kill ...]

This is the project's model of KFP's backend (its v2 driver and launcher, read from
kubeflow/pipelines backend/src/v2), not Argo, Kubernetes or its scheduler:
- the DAG, `dsl.If`, `dsl.ParallelFor` (items one at a time; the parallelism limit
  reported) and `dsl.Collected` are read from the YAML; a runtime constant that is exactly
  a `{{$.pipeline_*}}` placeholder is resolved as the driver resolves it;
- `--backend` (default 2.14, the oldest supported): before 2.16 a loop is recorded under
  its display name, so a consumer of a `dsl.ParallelFor(name=...)` loop does not find it
  (kubeflow/pipelines#13239, fixed in 2.16 by #12808);
- outputs are planned at `ROOT/PIPELINE/RUN_ID/TASK/SALT/OUTPUT`, one salt per task, so a
  retry writes where the failed attempt would have;
- each attempt is a new pod (`tools.rehearsal.launcher`), the store s3:// or minio:// at
  `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, or gs://;
- `retryPolicy` (the back-off reported, not waited; `KFP_RETRY_INDEX` set) retries an
  attempt that ended `Failed` (non-zero exit), not `Error` (pod deleted: Argo's default
  OnFailure); `activeDeadlineSeconds`, the environment and `secretAsEnv` (`--secret`) are
  honoured; node selectors, tolerations, resources, GPUs and `/dev/shm` reported only;
- `--kill`, `--delete-pod` and `--retry-run` as their help below says.
No execution cache. Writes `DIR/summary.json` (with a `rehearsal` section),
`DIR/rehearsal.json` (task records), `DIR/run.json` and `DIR/pipeline.yaml` (what
`--retry-run` reads back).
"""
# The docstring above is the command's --help.

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

import tools.rehearsal.spec as ir
from components.common.storage import read_json, write_json_atomically
from tools.rehearsal import launcher
from tools.rehearsal.cli import pairs
from tools.rehearsal.launcher import PARAMETER_OUTPUTS, Kill, ObjectStore, Pods, mount_path
from tools.rehearsal.records import (
    RehearsalError,
    TaskRecord,
    pipeline_summary,
    print_report,
    registration,
    saved_outputs,
    write_report,
)
from tools.rehearsal.walk import DagWalk

_WHOLE_PLACEHOLDER = re.compile(r"^\{\{\$\.(?P<name>pipeline_[a-z_]+)\}\}$")
# The backends modelled, oldest first, and the first whose compiler gives a loop's driver
# its task key (kubeflow/pipelines#12808): before it, the loop is recorded under its
# display name and a consumer that names it by key does not find it (#13239).
BACKENDS = ("2.14", "2.15", "2.16", "2.17")
LOOP_KEYED_FROM = "2.16"
RUN_STATE, MANIFEST = "run.json", "pipeline.yaml"


@dataclasses.dataclass(frozen=True)
class KubeflowJob(ir.PipelineJob):
    """The run as KFP's driver shows it (`root` is the run's: ROOT/PIPELINE/RUN_ID)."""

    def system(self, name: str, task: str = "", task_uuid: str = "") -> str | None:
        """`{{$.NAME}}` as the driver resolves it; None for Vertex's own placeholders."""
        return {"pipeline_job_name": self.name, "pipeline_job_resource_name": self.name,
                "pipeline_job_uuid": self.uuid, "pipeline_task_name": task,
                "pipeline_task_uuid": task_uuid}.get(name)

    def resolve_system(self, value: Any) -> Any:
        """The driver replaces a runtime constant only when it is the placeholder whole."""
        m = _WHOLE_PLACEHOLDER.match(value) if isinstance(value, str) else None
        resolved = self.system(m.group("name")) if m else None
        return value if resolved is None else resolved


def load(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pipeline spec and its Kubernetes settings per executor, from a compiled YAML."""
    import yaml

    with open(path) as f:  # libyaml; tools.kfp_backends reads alike but sits a layer above
        spec, *others = [d for d in yaml.load_all(f, Loader=yaml.CSafeLoader) if d]
    platform = next((d for d in others if "platforms" in d), {})
    return spec, platform.get("platforms", {}).get("kubernetes", {}).get(
        "deploymentSpec", {}).get("executors", {})


def renamed_loops(spec: Mapping[str, Any]) -> dict[str, str]:
    """Each loop whose display name is not its task key (`dsl.ParallelFor(name=...)`):
    key -> display name. Before KFP 2.16 a consumer of such a loop fails (#13239)."""
    dags = [spec["root"], *spec.get("components", {}).values()]
    return {key: task["taskInfo"]["name"] for dag in dags
            for key, task in dag.get("dag", {}).get("tasks", {}).items()
            if ("parameterIterator" in task or "artifactIterator" in task)
            and task.get("taskInfo", {}).get("name", key) != key}


class KubeflowRehearsal(DagWalk):
    """One rehearsal of a compiled Kubeflow pipeline; `run()` executes it.

    Args:
        spec, executors: The YAML's pipeline spec and Kubernetes settings per executor.
        output: Local folder of the rehearsal (pods/, logs/, store/).
        params: Pipeline parameters as strings, typed by the pipeline's definitions.
        pipeline_root: The s3://, minio:// or gs:// pipeline root.
        runtime: "local" (processes of this venv) or "image" (inside the images).
        secrets: The namespace's secrets: name -> key -> value.
        kill: Attempts to end (`Kill`).
        backend: The KFP version modelled (`BACKENDS`).
        earlier: The failed run this one retries (its `run.json`), or None.
    """

    def __init__(self, spec: dict[str, Any], executors: Mapping[str, Any], output: str,
                 params: Mapping[str, str], pipeline_root: str, runtime: str = "local",
                 secrets: Mapping[str, Mapping[str, str]] | None = None,
                 kill: list[Kill] | None = None, backend: str = BACKENDS[0],
                 earlier: Mapping[str, Any] | None = None):
        if backend not in BACKENDS:
            raise RehearsalError(f"--backend must be one of {BACKENDS}, got {backend!r}")
        mount_path(pipeline_root)  # a root the launcher can copy from
        self.spec, self.executors, self.backend = spec, executors, backend
        self.loops_keyed = BACKENDS.index(backend) >= BACKENDS.index(LOOP_KEYED_FROM)
        self.params, self.pipeline_root = dict(params), pipeline_root
        self.output = os.path.abspath(output)
        self.pods = Pods(runtime, self.output)
        self.store = ObjectStore()
        self.store.check_bucket(pipeline_root)
        self.secrets, self.kill = secrets or {}, kill or []
        self.earlier = dict(earlier or {})
        self.tasks: dict[str, dict[str, Any]] = {}  # each container task's state (run.json)
        pipeline = spec["pipelineInfo"]["name"]
        if earlier:  # KFP's retry: the same run, its id and output URIs
            self.job = KubeflowJob(name=earlier["job_name"], uuid=earlier["run_id"],
                                   root=earlier["run_root"])
            self.pods.series = f"retry{earlier['retries'] + 1}-"
        else:
            run_id = str(uuid.uuid4())
            self.job = KubeflowJob(name=f"{pipeline}-{time.strftime('%Y%m%d%H%M%S')}",
                                   uuid=run_id,
                                   root=f"{pipeline_root.rstrip('/')}/{pipeline}/{run_id}")
        self.records: list[TaskRecord] = []
        self.inputs = ir.pipeline_inputs(spec, params)
        if not self.loops_keyed:
            for key, shown in renamed_loops(spec).items():
                print(f"[rehearse] KFP {backend}: loop {key!r} is named {shown!r}; its "
                      "consumers will not find it (kubeflow/pipelines#13239)")

    def run(self) -> dict[str, Any]:
        """Runs the pipeline; returns its outputs (artifacts copied to OUTPUT/store/)."""
        try:
            outputs = self._run_dag(self.spec["root"], self.inputs, {}, prefix="")
        finally:
            self.pods.remove_all()
        for value in outputs["artifacts"].values():
            value.path = os.path.join(self.output, "store", mount_path(value.uri)[1:])
            self.store.download(value.uri, value.path)
        return {**outputs["artifacts"], **outputs["parameters"]}

    def run_state(self, state: str, pipeline: str) -> dict[str, Any]:
        """The run as `--retry-run` reads it back (`run.json`)."""
        return {"pipeline": pipeline, "pipeline_root": self.pipeline_root,
                "params": self.params, "backend": self.backend, "runtime": self.pods.kind,
                "run_id": self.job.uuid, "job_name": self.job.name,
                "run_root": self.job.root, "state": state,
                "retries": self.earlier["retries"] + 1 if self.earlier else 0,
                "tasks": {**self.earlier.get("tasks", {}), **self.tasks}}

    def _run_task(self, record: TaskRecord, task, component, values, inputs) -> dict[str, Any]:
        started = time.monotonic()
        try:
            if "dag" in component and "parameterIterator" in task:
                result = self._run_loop(record, task, component, values, inputs)
                result["recorded_as"] = self._loop_recorded_as(record)
            elif "dag" in component:
                result = self._run_dag(component, values, inputs, prefix=record.name + "/")
            else:
                result = self._run_container(record, task, component, values, inputs)
        finally:
            record.seconds = time.monotonic() - started
        record.state = "succeeded"
        return result

    def _loop_recorded_as(self, record: TaskRecord) -> str:
        """The name the driver records a loop under: its key from 2.16 on, else its display
        name."""
        key = record.name.rsplit("/", 1)[-1]
        if self.loops_keyed or record.display_name == key:
            return key
        record.note += (f"; recorded as {record.display_name!r}, not {key!r}: the "
                        f"{self.backend} compiler gives a loop's driver no task name")
        return record.display_name

    def _unfound(self, key: str, recorded: str) -> str:
        return (f"the KFP {self.backend} driver cannot find producer task {key!r}: the loop "
                f"{key!r} was recorded under its display name {recorded!r} (dsl.ParallelFor("
                f"name=...); kubeflow/pipelines#13239, fixed in {LOOP_KEYED_FROM} by #12808): "
                f"drop the loop's name, or run on KFP >= {LOOP_KEYED_FROM}")

    def _run_loop(self, record, task, component, values, inputs) -> dict[str, Any]:
        """`dsl.ParallelFor`: the loop's DAG once per item; outputs collected as lists."""
        name = record.name
        iterator = task["parameterIterator"]
        items = iterator["items"]
        listed = (json.loads(items["raw"]) if "raw" in items
                  else values[items["inputParameter"]])
        if isinstance(listed, str):
            listed = json.loads(listed)
        limit = task.get("iteratorPolicy", {}).get("parallelismLimit", 0)
        record.replicas = len(listed)
        record.note = (f"{len(listed)} iterations, one at a time here (parallelism "
                       f"{limit or 'unlimited'} on a cluster)")
        collected: dict[str, list] = {}
        for index, item in enumerate(listed):
            outputs = self._run_dag(component, {**values, iterator["itemInput"]: item}, inputs,
                                    prefix=f"{name}/{index}/")
            if outputs["artifacts"]:
                raise RehearsalError(f"{name}: collected artifacts are not rehearsed")
            for key, value in outputs["parameters"].items():
                collected.setdefault(key, []).append(value)
        return {"parameters": collected, "artifacts": {}}

    def _run_container(self, record, task, component, values, inputs) -> dict[str, Any]:
        """One container task: a pod per attempt, as the retry policy allows."""
        earlier = self.earlier.get("tasks", {}).get(record.name, {})
        if earlier.get("phase") == launcher.SUCCEEDED:
            return self._keep(record, earlier)
        label = component["executorLabel"]
        container = self.spec["deploymentSpec"]["executors"][label]["container"]
        settings = self.executors.get(label, {})
        env = launcher.pod_env(container, settings, self.secrets, record.name)
        # its driver's plan: kept by a run retry once the driver had run (a succeeded node)
        task_root = earlier.get("task_root") or (
            f"{self.job.root}/{record.name.rsplit('/', 1)[-1]}/{uuid.uuid4()}")
        state = self.tasks[record.name] = {"phase": "Pending", "task_root": task_root}
        attempts, backoff, factor = launcher.retry_policy(task)
        deadline = float(settings.get("activeDeadlineSeconds", 0) or 0)
        notes = [launcher.scheduling_note(container, settings)]
        print(f"[rehearse] {record.display_name}: running")
        for attempt in range(attempts):
            pod = self.pods.new(record.name, attempt + 1)
            planned = self._executor_input(component, values, inputs, task_root, pod)
            for key, entry in planned["inputs"]["artifacts"].items():  # the launcher's first act
                uri = entry["artifacts"][0]["uri"]
                if not self.store.download(uri, self.pods.host_path(pod, mount_path(uri))):
                    print(f"[rehearse] input {key}: nothing at {uri} (the step wrote no file)")
            self.pods.hand_over(pod)
            record.attempts = attempt + 1
            placeholders = ir.Placeholders(
                planned, component.get("inputDefinitions", {}).get("parameters", {}), record.name,
                "", self.job, lambda uri, pod=pod: self.pods.step_path(pod, mount_path(uri)))
            command = (placeholders.resolve_args(container.get("command", []))
                       + placeholders.resolve_args(container.get("args", [])))
            state["phase"], failure = self.pods.run(  # Argo's phase of the attempt, and why
                pod, command, {**env, "KFP_RETRY_INDEX": str(attempt)}, container["image"],
                self.pods.log_path(record.name, attempt + 1), deadline,
                Kill.pending(self.kill, record), self.store)
            if state["phase"] == launcher.SUCCEEDED:
                try:  # the launcher reads and uploads the outputs in the pod: a failure
                    # there fails the container, which the retry policy retries
                    result = self._collect(component, planned, pod, task_root)
                    break
                except (RehearsalError, OSError, ValueError, KeyError) as err:
                    state["phase"], failure = launcher.FAILED, f"outputs not kept: {err}"
            deleted = state["phase"] == launcher.ERROR
            notes.append(f"attempt {attempt + 1} ended {state['phase']} ({failure})" + (
                ": not retried (KFP sets no retryPolicy; Argo's default OnFailure retries a "
                "Failed container only)" if deleted else ""))
            if deleted or attempt + 1 == attempts:
                record.state, record.note = "failed", "; ".join(n for n in notes if n)
                raise RehearsalError(f"{record.display_name}: {notes[-1]}")
            notes.append(f"retried after a back-off of {backoff * factor ** attempt:.0f}s "
                         "(not waited here)")
        record.replicas = 1
        record.note = "; ".join(n for n in notes if n)
        state["outputs"] = saved_outputs(result)
        return result

    def _keep(self, record: TaskRecord, earlier: dict[str, Any]) -> dict[str, Any]:
        """A task that succeeded before the run was retried: its node and outputs kept."""
        self.tasks[record.name] = earlier
        record.replicas = 1
        record.note = ("kept: it succeeded before the run was retried (its outputs reused, "
                       "no pod)")
        print(f"[rehearse] {record.display_name}: kept from the failed run")
        return saved_outputs(earlier["outputs"], restore=True)

    def _executor_input(self, component, values, inputs, task_root, pod) -> dict[str, Any]:
        """The executor input KFP's driver plans (paths as the step's process sees them)."""
        local = self.pods.step_path
        return ir.planned_executor_input(
            component, values, inputs, task_root, artifact_name=lambda key: key,
            parameter_file=lambda key: local(pod, f"{PARAMETER_OUTPUTS}/{key}"),
            output_file=local(pod, mount_path(f"{task_root}/output_metadata.json")))

    def _collect(self, component, planned, pod, task_root: str) -> dict[str, Any]:
        """The launcher's last act: outputs uploaded (the step succeeded), parameters read."""
        result = ir.read_task_outputs(
            component, planned,
            self.pods.host_path(pod, mount_path(f"{task_root}/output_metadata.json")),
            parameter_file=lambda key: self.pods.host_path(pod, f"{PARAMETER_OUTPUTS}/{key}"),
            artifact_path=lambda uri: "")  # in the store: copied out where it is needed
        for artifact in result["artifacts"].values():
            self.store.upload(self.pods.host_path(pod, mount_path(artifact.uri)), artifact.uri)
        return result


def rehearse_kubeflow(path: str, output: str, params: Mapping[str, str] | None = None,
                      **options: Any) -> dict[str, Any]:
    """Rehearses the compiled Kubeflow pipeline at `path`; writes and returns the summary.

    Args:
        path: The YAML `compile.py --target kubeflow` wrote.
        output, params: As `KubeflowRehearsal` takes them.
        **options: `pipeline_root` (required), `runtime`, `secrets`, `kill`, `backend`.

    Returns:
        The pipeline's own summary (as `run_local` writes it) plus `rehearsal`.
    """
    spec, executors = load(path)
    runner = KubeflowRehearsal(spec, executors, output, params or {}, **options)
    manifest = os.path.join(runner.output, MANIFEST)
    os.makedirs(runner.output, exist_ok=True)
    if os.path.abspath(path) != manifest:
        shutil.copyfile(path, manifest)  # the run's own copy, as KFP keeps its manifest
    return _finish(runner, path)


def retry_kubeflow(output: str, runtime: str | None = None, **options: Any) -> dict[str, Any]:
    """Retries the failed run rehearsed in `output` as KFP's run retry does; the summary.

    Args:
        output: The failed rehearsal's folder (its run.json and pipeline.yaml).
        runtime: "local" or "image"; None: the run's.
        **options: `secrets`, `kill` for this pass.

    Raises:
        RehearsalError: No run there, or a run that did not fail (KFP retries a run whose
            workflow Failed or Errored only), or the retried run failed.
    """
    earlier = read_json(os.path.join(output, RUN_STATE), optional=True)
    if earlier is None:
        raise RehearsalError(f"{output} holds no rehearsed run ({RUN_STATE}) to retry")
    if earlier["state"] != "failed":
        raise RehearsalError(f"the run in {output} {earlier['state']}: KFP retries only a "
                             "failed run")
    spec, executors = load(os.path.join(output, MANIFEST))
    runner = KubeflowRehearsal(spec, executors, output, earlier["params"],
                               earlier["pipeline_root"], runtime or earlier["runtime"],
                               backend=earlier["backend"], earlier=earlier, **options)
    return _finish(runner, earlier["pipeline"])


def _finish(runner: KubeflowRehearsal, path: str) -> dict[str, Any]:
    """Runs the rehearsal; writes its records and run state, and the summary if it succeeded."""
    state = "failed"
    try:
        outputs = runner.run()
        state = "succeeded"
    finally:
        report = write_report(runner.output, runner.records)
        write_json_atomically(os.path.join(runner.output, RUN_STATE),
                              runner.run_state(state, path), sort_keys=False)
    summary = pipeline_summary(runner.spec, outputs)
    if "registration" in summary:
        summary["registration"] = registration(summary["registration"], runner.records)
    summary["rehearsal"] = {"pipeline": path, "target": "kubeflow", "backend": runner.backend,
                            "job_name": runner.job.name, "run_id": runner.job.uuid,
                            "run_root": runner.job.root,
                            "retries": runner.earlier.get("retries", -1) + 1,
                            "tasks": report}
    write_json_atomically(os.path.join(runner.output, "summary.json"), summary, sort_keys=False)
    return summary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.rehearsal.kubeflow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", nargs="?", help="compiled pipeline YAML (build/kubeflow/...)")
    p.add_argument("--output", required=True, help="local folder of the rehearsal")
    p.add_argument("--pipeline-root", help="s3://, minio:// or gs:// folder")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--secret", action="append", default=[], metavar="NAME=KEY=VALUE",
                   help="a key of a secret the namespace holds")
    p.add_argument("--kill", action="append", default=[], metavar="TASK=BUCKET/GLOB",
                   help="stop TASK's first attempt's container (SIGTERM, the kill 1 s later) once "
                        "GLOB matches an object (Failed: retried)")
    p.add_argument("--delete-pod", action="append", default=[], metavar="TASK=BUCKET/GLOB",
                   help="delete TASK's first attempt's pod once GLOB matches an object "
                        "(Error: not retried, the run fails)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help=f"the KFP backend modelled (default {BACKENDS[0]})")
    p.add_argument("--retry-run", action="store_true",
                   help="retry the failed run in --output as KFP's Retry does: succeeded "
                        "tasks kept, the others run again (no pipeline, --param, "
                        "--pipeline-root or --backend: the run's own)")
    p.add_argument("--runtime", choices=("local", "image"), default=None,
                   help="default local (a retried run: its own)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs `python -m tools.rehearsal.kubeflow`; returns the exit status (1: it failed)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.retry_run and (args.pipeline or args.param or args.pipeline_root or args.backend):
        p.error("--retry-run retries the run in --output with its own pipeline, parameters, "
                "root and backend: give none of them")
    if not args.retry_run and not (args.pipeline and args.pipeline_root):
        p.error("give the compiled pipeline and --pipeline-root (or --retry-run)")
    params = dict(pairs(p, args, "--param"))
    secrets: dict[str, dict[str, str]] = {}
    for name, key, value in pairs(p, args, "--secret", parts=3):
        secrets.setdefault(name, {})[key] = value
    kill = [Kill(*pair) for pair in pairs(p, args, "--kill")] + [
        Kill(*pair, deleted=True) for pair in pairs(p, args, "--delete-pod")]
    try:
        if args.retry_run:
            retry_kubeflow(args.output, args.runtime, secrets=secrets, kill=kill)
        else:
            rehearse_kubeflow(args.pipeline, args.output, params,
                              pipeline_root=args.pipeline_root, runtime=args.runtime or "local",
                              secrets=secrets, kill=kill, backend=args.backend or BACKENDS[0])
    except RehearsalError as err:
        print(f"rehearsal failed: {err}", file=sys.stderr)
        return 1
    finally:
        print_report(args.output)
    print(f"summary: {os.path.join(os.path.abspath(args.output), 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
