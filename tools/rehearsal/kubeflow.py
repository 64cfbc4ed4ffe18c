"""Rehearse a compiled Kubeflow pipeline (the YAML `compile.py --target kubeflow` writes) as
open-source Kubeflow Pipelines runs it, on this machine.

    python -m tools.rehearsal.kubeflow build/kubeflow/image_pipeline.yaml --output DIR
        --pipeline-root s3://BUCKET/root [--param NAME=VALUE ...] [--secret NAME=KEY=VALUE ...]
        [--kill TASK=BUCKET/GLOB ...] [--runtime local|image]

This is the project's model of KFP's backend (its v2 driver and launcher, read from
kubeflow/pipelines backend/src/v2), not Argo, Kubernetes or its scheduler:
- the DAG, `dsl.If` conditions, `dsl.ParallelFor` (its items one at a time; the
  parallelism limit is reported) and `dsl.Collected` (each output as the list of the
  iterations' values) are read from the YAML; a runtime constant that is exactly a
  `{{$.pipeline_*}}` placeholder is resolved as the driver resolves it;
- output artifacts are planned at `ROOT/PIPELINE/RUN_ID/TASK/SALT/OUTPUT`, the salt drawn
  once per task, so a retry writes where the failed attempt would have;
- each attempt of a task is a new pod (`launcher.Pods`): inputs copied in, outputs
  uploaded only if the step succeeds (`launcher.ObjectStore`, the pipeline root's store:
  s3:// or minio:// at `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, or gs://);
- the task's `retryPolicy` (attempts; the back-off is reported, not waited, and
  `KFP_RETRY_INDEX` is set), the step timeout (`activeDeadlineSeconds`), the container's
  environment and `secretAsEnv` (from `--secret`; a missing secret stops the pod, as
  Kubernetes does) are honoured; node selectors, tolerations, resource requests, GPUs and
  `/dev/shm` are reported, not enforced (one machine, no GPU);
- `--kill TASK=BUCKET/GLOB` ends TASK's first attempt once an object matching the glob is in
  the store: a pod lost after its first checkpoint, to show that a retry resumes.
No execution cache: every task runs. Writes `DIR/summary.json` (the pipeline's own summary
and a `rehearsal` section) and `DIR/rehearsal.json`.
"""
# The docstring above is the command's --help.

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any

import tools.rehearsal.spec as ir
from components.common.storage import write_json_atomically
from tools.rehearsal.launcher import PARAMETER_OUTPUTS, ObjectStore, Pods, mount_path
from tools.rehearsal.records import (
    ArtifactRef,
    RehearsalError,
    TaskRecord,
    pipeline_summary,
    write_report,
)
from tools.rehearsal.runtimes import without_gpus
from tools.rehearsal.walk import SKIPPED, DagWalk

_WHOLE_PLACEHOLDER = re.compile(r"^\{\{\$\.(?P<name>pipeline_[a-z_]+)\}\}$")


@dataclasses.dataclass
class Kill:
    """End the first attempt of `task` once an object matching `pattern` exists, once."""

    task: str
    pattern: str
    done: bool = False


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

    with open(path) as f:
        documents = [d for d in yaml.load_all(f, Loader=yaml.CSafeLoader) if d]  # libyaml
    spec = documents[0]
    platform = next((d for d in documents[1:] if "platforms" in d), {})
    return spec, platform.get("platforms", {}).get("kubernetes", {}).get(
        "deploymentSpec", {}).get("executors", {})


def pod_env(container: Mapping[str, Any], settings: Mapping[str, Any],
            secrets: Mapping[str, Mapping[str, str]], task: str) -> dict[str, str]:
    """The step's environment: the container's own, then its secrets' keys.

    Raises:
        RehearsalError: A secret (or key) the pod needs is not given: on a cluster the
            pod would not start (CreateContainerConfigError).
    """
    env = without_gpus({e["name"]: e["value"] for e in container.get("env", [])})
    for mount in settings.get("secretAsEnv", []):
        name = mount["secretName"]
        for pair in mount["keyToEnv"]:
            value = secrets.get(name, {}).get(pair["secretKey"])
            if value is None and not mount.get("optional"):
                raise RehearsalError(
                    f"{task}: the pod reads key {pair['secretKey']!r} of secret {name!r}, "
                    f"which the namespace does not hold: pass --secret "
                    f"{name}={pair['secretKey']}=VALUE")
            if value is not None:
                env[pair["envVar"]] = value
    return env


def scheduling_note(container: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """What the pod asks of a node, which one machine cannot honour: reported."""
    resources = container.get("resources", {})
    parts = [f"{name} {resources[key]}" for name, key in (
        ("cpu", "resourceCpuLimit"), ("memory", "resourceMemoryLimit")) if key in resources]
    accelerator = resources.get("accelerator", {})
    if accelerator:
        parts.append(f"{accelerator.get('resourceCount')} x {accelerator.get('resourceType')}")
    labels = settings.get("nodeSelector", {}).get("labels", {})
    parts += [f"node {k}={v}" for k, v in sorted(labels.items())]
    parts += [f"tolerates {t['key']}" for t in settings.get("tolerations", [])]
    parts += [f"{m['mountPath']} {m.get('sizeLimit', '')}".strip()
              for m in settings.get("emptyDirMounts", [])]
    return "; ".join(parts)


def retry_policy(task: Mapping[str, Any]) -> tuple[int, float, float]:
    """(attempts, first back-off in seconds, factor) of a task's `retryPolicy`."""
    policy = task.get("retryPolicy", {})
    backoff = float(str(policy.get("backoffDuration", "0s")).rstrip("s") or 0)
    return 1 + int(policy.get("maxRetryCount", 0)), backoff, float(
        policy.get("backoffFactor", 2.0))


class KubeflowRehearsal(DagWalk):
    """One rehearsal of a compiled Kubeflow pipeline; `run()` executes it.

    Args:
        spec: The pipeline spec (the YAML's first document).
        executors: Its Kubernetes settings per executor (the platform document's).
        output: Local folder of the rehearsal (pods/, logs/, store/).
        params: Pipeline parameters as strings, typed by the pipeline's definitions.
        pipeline_root: The s3://, minio:// or gs:// pipeline root.
        runtime: "local" (processes of this venv) or "image" (inside the images).
        secrets: The namespace's secrets: name -> key -> value.
        kill: Attempts to end (`Kill`).
    """

    def __init__(self, spec: dict[str, Any], executors: Mapping[str, Any], output: str,
                 params: Mapping[str, str], pipeline_root: str, runtime: str = "local",
                 secrets: Mapping[str, Mapping[str, str]] | None = None,
                 kill: list[Kill] | None = None):
        mount_path(pipeline_root)  # a root the launcher can copy from
        self.spec, self.executors = spec, executors
        self.output = os.path.abspath(output)
        self.pods = Pods(runtime, self.output)
        self.store = ObjectStore()
        self.store.check_bucket(pipeline_root)
        self.secrets, self.kill = secrets or {}, kill or []
        pipeline = spec["pipelineInfo"]["name"]
        run_id = str(uuid.uuid4())
        self.job = KubeflowJob(name=f"{pipeline}-{time.strftime('%Y%m%d%H%M%S')}",
                               uuid=run_id,
                               root=f"{pipeline_root.rstrip('/')}/{pipeline}/{run_id}")
        self.records: list[TaskRecord] = []
        self.inputs = ir.pipeline_inputs(spec, params)

    def run(self) -> dict[str, Any]:
        """Runs the pipeline; returns its outputs (artifacts copied to OUTPUT/store/)."""
        try:
            outputs = self._run_dag(self.spec["root"], self.inputs, {}, prefix="")
        finally:
            self.pods.remove_all()
        for value in outputs.values():
            if isinstance(value, ArtifactRef):
                value.path = os.path.join(self.output, "store", mount_path(value.uri)[1:])
                self.store.download(value.uri, value.path)
        return outputs

    def _run_task(self, name: str, task, parameters, artifacts, results) -> dict[str, Any]:
        record, component, values, inputs = self._open_task(name, task, parameters, artifacts,
                                                            results)
        if values is None:
            return dict(SKIPPED)
        started = time.monotonic()
        if "dag" in component and "parameterIterator" in task:
            result = self._run_loop(name, task, component, values, inputs, record)
        elif "dag" in component:
            outputs = self._run_dag(component, values, inputs, prefix=name + "/")
            result = {"parameters": {k: v for k, v in outputs.items()
                                     if not isinstance(v, ArtifactRef)},
                      "artifacts": {k: v for k, v in outputs.items()
                                    if isinstance(v, ArtifactRef)}}
        else:
            result = self._run_container(record, task, component, values, inputs)
        record.state, record.seconds = "succeeded", time.monotonic() - started
        return result

    def _run_loop(self, name, task, component, values, inputs, record) -> dict[str, Any]:
        """`dsl.ParallelFor`: the loop's DAG once per item; outputs collected as lists."""
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
            for key, value in outputs.items():
                if isinstance(value, ArtifactRef):
                    raise RehearsalError(f"{name}: collected artifacts are not rehearsed")
                collected.setdefault(key, []).append(value)
        return {"parameters": collected, "artifacts": {}}

    def _run_container(self, record, task, component, values, inputs) -> dict[str, Any]:
        """One container task: its pods, attempt after attempt, as the retry policy allows."""
        label = component["executorLabel"]
        container = self.spec["deploymentSpec"]["executors"][label]["container"]
        settings = self.executors.get(label, {})
        env = pod_env(container, settings, self.secrets, record.name)
        task_root = f"{self.job.root}/{record.name.rsplit('/', 1)[-1]}/{uuid.uuid4()}"
        attempts, backoff, factor = retry_policy(task)
        deadline = float(settings.get("activeDeadlineSeconds", 0) or 0)
        notes = [scheduling_note(container, settings)]
        print(f"[rehearse] {record.display_name}: running")
        for attempt in range(attempts):
            pod = self.pods.new(record.name, attempt + 1)
            planned = self._executor_input(component, values, inputs, task_root, pod)
            self._copy_inputs(planned, pod)
            self.pods.hand_over(pod)
            record.attempts = attempt + 1
            failure = self._run_pod(record, pod, planned, container, component,
                                    {**env, "KFP_RETRY_INDEX": str(attempt)}, deadline)
            if not failure:
                break
            notes.append(f"attempt {attempt + 1} failed ({failure})")
            if attempt + 1 == attempts:
                record.state, record.note = "failed", "; ".join(n for n in notes if n)
                raise RehearsalError(f"{record.display_name}: {failure}")
            notes.append(f"retried after a back-off of {backoff * factor ** attempt:.0f}s "
                         "(not waited here)")
        record.replicas = 1
        record.note = "; ".join(n for n in notes if n)
        return self._collect(component, planned, pod, task_root)

    def _executor_input(self, component, values, inputs, task_root, pod) -> dict[str, Any]:
        """The executor input KFP's driver plans (paths as the step's process sees them)."""
        local = self.pods.step_path
        return ir.planned_executor_input(
            component, values, inputs, task_root, artifact_name=lambda key: key,
            parameter_file=lambda key: local(pod, f"{PARAMETER_OUTPUTS}/{key}"),
            output_file=local(pod, mount_path(f"{task_root}/output_metadata.json")))

    def _copy_inputs(self, planned: dict[str, Any], pod: str) -> None:
        """The launcher's first act: every input artifact copied into the pod."""
        for key, entry in planned["inputs"]["artifacts"].items():
            uri = entry["artifacts"][0]["uri"]
            if not self.store.download(uri, self.pods.host_path(pod, mount_path(uri))):
                print(f"[rehearse] input {key}: nothing at {uri} (the step wrote no file)")

    def _run_pod(self, record, pod, planned, container, component, env,
                 deadline: float) -> str:
        """Runs the step's command in `pod`; returns why it failed, empty if it succeeded."""
        placeholders = ir.Placeholders(
            planned, component.get("inputDefinitions", {}).get("parameters", {}),
            record.name, "", self.job, lambda uri: self.pods.step_path(pod, mount_path(uri)))
        command = (placeholders.resolve_args(container.get("command", []))
                   + placeholders.resolve_args(container.get("args", [])))
        log_path = os.path.join(self.pods.logs, record.name.replace("/", "-"),
                                f"attempt{record.attempts}.log")
        proc = self.pods.start(pod, command, env, container["image"], log_path)
        rule = next((k for k in self.kill if not k.done and k.task in
                     (record.name, record.display_name)), None)
        started, checked = time.monotonic(), 0.0
        while proc.poll() is None:
            time.sleep(0.2)
            if deadline and time.monotonic() - started > deadline:
                _stop(proc)
                return f"activeDeadlineSeconds {deadline:.0f} passed"
            if rule and time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                if self.store.matches(rule.pattern):
                    rule.done = True
                    _stop(proc)
                    return f"pod lost: killed once {rule.pattern} was in the store"
        if proc.returncode:
            with open(log_path) as f:
                lines = f.read().strip().splitlines() or [""]
            return f"exited with {proc.returncode}: {lines[-1][-300:]} (log {log_path})"
        return ""

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


def _stop(proc) -> None:
    """Kills a step's process group, as a pod's containers end with it."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def registration(decided: Mapping[str, Any], records: list[TaskRecord]) -> dict[str, Any]:
    """The summary's `registration`: the gate's decision, and what the run registered."""
    states = {r.display_name: r for r in records}
    registered = getattr(states.get("register-model"), "state", "") == "succeeded"
    skipped = states.get("no-registry")
    note = ("registered in MLflow's Model Registry at tracking_uri (alias challenger), "
            "with its KServe InferenceService manifest beside the model" if registered else
            "nothing registered: " + ("no tracking_uri was given" if skipped and
                                      skipped.state == "succeeded" else
                                      "the model did not clear the gate"))
    return {"would_register": bool(decided.get("would_register")), "uploaded": False,
            "registered_in_mlflow": registered, "note": note}


def rehearse_kubeflow(path: str, output: str, params: Mapping[str, str] | None = None,
                      **options: Any) -> dict[str, Any]:
    """Rehearses the compiled Kubeflow pipeline at `path`; writes and returns the summary.

    Args:
        path: The YAML `compile.py --target kubeflow` wrote.
        output: Local folder of the rehearsal (summary.json, rehearsal.json, pods/, logs/).
        params: Pipeline parameters as strings, typed by the pipeline's definitions.
        **options: `pipeline_root` (required), `runtime`, `secrets`, `kill` (see
            `KubeflowRehearsal`).

    Returns:
        The pipeline's own summary (as `run_local` writes it) plus `rehearsal`.
    """
    spec, executors = load(path)
    runner = KubeflowRehearsal(spec, executors, output, params or {}, **options)
    try:
        outputs = runner.run()
    finally:
        report = write_report(runner.output, runner.records)
    summary = pipeline_summary(spec, outputs)
    if "registration" in summary:
        summary["registration"] = registration(summary["registration"], runner.records)
    summary["rehearsal"] = {"pipeline": path, "target": "kubeflow",
                            "job_name": runner.job.name, "run_root": runner.job.root,
                            "tasks": report}
    write_json_atomically(os.path.join(runner.output, "summary.json"), summary, sort_keys=False)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Runs `python -m tools.rehearsal.kubeflow`; returns the exit status (1: it failed)."""
    p = argparse.ArgumentParser(prog="python -m tools.rehearsal.kubeflow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", help="compiled pipeline YAML (build/kubeflow/...)")
    p.add_argument("--output", required=True, help="local folder of the rehearsal")
    p.add_argument("--pipeline-root", required=True, help="s3://, minio:// or gs:// folder")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--secret", action="append", default=[], metavar="NAME=KEY=VALUE",
                   help="a key of a secret the namespace holds")
    p.add_argument("--kill", action="append", default=[], metavar="TASK=BUCKET/GLOB",
                   help="end TASK's first attempt once GLOB matches an object")
    p.add_argument("--runtime", choices=("local", "image"), default="local")
    args = p.parse_args(argv)
    for flag, items, parts in (("--param", args.param, 2), ("--secret", args.secret, 3),
                               ("--kill", args.kill, 2)):
        for item in items:
            if len(item.split("=", parts - 1)) != parts:
                p.error(f"{flag} takes {p._option_string_actions[flag].metavar}, got {item!r}")
    secrets: dict[str, dict[str, str]] = {}
    for item in args.secret:
        name, key, value = item.split("=", 2)
        secrets.setdefault(name, {})[key] = value
    try:
        summary = rehearse_kubeflow(
            args.pipeline, args.output, dict(i.split("=", 1) for i in args.param),
            pipeline_root=args.pipeline_root, runtime=args.runtime, secrets=secrets,
            kill=[Kill(*i.split("=", 1)) for i in args.kill])
    except RehearsalError as err:
        print(f"rehearsal failed: {err}", file=sys.stderr)
        return 1
    for task in summary["rehearsal"]["tasks"]:
        print(f"  {task['display_name']:<28} {task['state']:<10} attempts {task['attempts']} "
              f"{task['seconds']:.1f}s {task['note']}")
    print(f"summary: {os.path.join(os.path.abspath(args.output), 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
