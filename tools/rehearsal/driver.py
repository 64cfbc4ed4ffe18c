"""The Vertex rehearsal: `Rehearsal` walks a compiled pipeline's DAG task by task, skipping,
reusing from the cache or running each; `rehearse` runs one from a file and writes
`summary.json` and `rehearsal.json`."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

import tools.rehearsal.spec as ir
from components.common.storage import write_json_atomically
from pipelines.compiled import load_pipeline_spec
from tools.rehearsal.cache import TaskCache, cache_key
from tools.rehearsal.jobs import Preemption, VertexService, task_kind
from tools.rehearsal.records import RehearsalError, TaskRecord, pipeline_summary, write_report
from tools.rehearsal.runtimes import Runtime
from tools.rehearsal.walk import DagWalk


class Rehearsal(DagWalk):
    """One rehearsal of a compiled pipeline; `run()` executes it.

    Args:
        spec, params: The compiled pipeline and its parameters as strings (typed by it).
        output: Local folder of the rehearsal (gcs/, logs/, vertex-requests/).
        pipeline_root: The gs:// pipeline root the outputs are planned under.
        cache_index: JSON file of cache entries kept across rehearsals (none: no reuse).
        preempt: Replicas to kill and restart (`--preempt`).
        runtime: "local" (processes of this venv) or "image" (inside the images).
        registry: The stand-in Model Registry: display name -> model resource name.
    """

    def __init__(self, spec: dict[str, Any], output: str, params: Mapping[str, str],
                 pipeline_root: str = "gs://rehearsal-bucket/pipeline-root",
                 cache_index: str | None = None, preempt: list[Preemption] | None = None,
                 runtime: str = "local", registry: Mapping[str, str] | None = None):
        self.output = os.path.abspath(output)
        self.runtime = Runtime(runtime, self.output)
        self.spec = spec
        if not pipeline_root.startswith("gs://"):
            raise RehearsalError(f"--pipeline-root must be a gs:// URI, got {pipeline_root!r}")
        self.job = ir.PipelineJob(
            name=f"{spec['pipelineInfo']['name']}-{time.strftime('%Y%m%d%H%M%S')}",
            uuid=hashlib.sha1(f"{self.output}{time.time()}".encode()).hexdigest()[:16],
            root=pipeline_root.rstrip("/"))
        self.cache = TaskCache(cache_index, self.runtime.local)
        self.vertex = VertexService(self.runtime, self.output, self.job.uuid, preempt or [],
                                    registry)
        self.records: list[TaskRecord] = []
        self.inputs = ir.pipeline_inputs(spec, params)
        self.runtime.check_visible(self.inputs)

    def run(self) -> dict[str, Any]:
        """Runs the pipeline; returns its outputs (artifacts as objects with .path/.metadata)."""
        with self.runtime.session():
            outputs = self._run_dag(self.spec["root"], self.inputs, {}, prefix="")
        self.cache.save()
        return {**outputs["artifacts"], **outputs["parameters"]}

    def _run_task(self, record: TaskRecord, task, component, values, inputs) -> dict[str, Any]:
        if "dag" in component:
            started = time.monotonic()
            outputs = self._run_dag(component, values, inputs, prefix=record.name + "/")
            record.state, record.seconds = "succeeded", time.monotonic() - started
            return outputs
        executor = self.spec["deploymentSpec"]["executors"][component["executorLabel"]]
        if "container" not in executor:
            raise RehearsalError(f"task {record.name!r}: executor {sorted(executor)} is not a "
                                 "container")
        return self._run_container(record, task, component, executor["container"], values,
                                   inputs)

    def _run_container(self, record: TaskRecord, task, component, container, values,
                       inputs) -> dict[str, Any]:
        started = time.monotonic()
        record.cache_key = cache_key(component, container, values, inputs)
        if task.get("cachingOptions", {}).get("enableCache", False):
            hit = self.cache.lookup(record.cache_key)
            record.cache = "hit" if hit else "miss"
            if hit:
                record.state = "cached"
                print(f"[rehearse] {record.display_name}: cache hit, outputs of an earlier run "
                      "reused")
                return hit
        task_uuid = hashlib.sha1(f"{self.job.uuid}/{record.name}".encode()).hexdigest()[:12]
        executor_input = self._executor_input(record, component, values, inputs, task_uuid)
        placeholders = ir.Placeholders(
            executor_input, component.get("inputDefinitions", {}).get("parameters", {}),
            record.name, task_uuid, self.job, self.runtime.step_path)
        command = placeholders.resolve_args(container.get("command", []))
        args = placeholders.resolve_args(container.get("args", []))
        print(f"[rehearse] {record.display_name}: running")
        kind = task_kind(container, command, args)
        # Tasks that call the Vertex API are answered, not run: nothing to read back or cache.
        if kind == "api-call":
            self.vertex.gcpc_call(record, args, executor_input)
            record.seconds = time.monotonic() - started
            return {"parameters": {}, "artifacts": {}}
        if kind == "registry-lookup":
            return self.vertex.registry_lookup(record, executor_input)
        if kind == "best-trial":
            return self.vertex.best_trial(record, args, executor_input)
        if kind == "custom-job":
            self.vertex.custom_job(record, args)
        elif kind == "tuning-job":
            self.vertex.tuning_job(record, args)
        else:
            self.vertex.container_task(record, command + args, container["image"])
        record.state, record.seconds = "succeeded", time.monotonic() - started
        result = self._collect(component, executor_input)
        if record.cache != "disabled":
            self.cache.store(record.cache_key, result)
        return result

    def _executor_input(self, record, component, values, inputs, task_uuid) -> dict[str, Any]:
        """The executor input Vertex plans (outputs under the job's root, seen as /gcs)."""
        task_root = (f"{self.job.root}/{ir.PROJECT_NUMBER}/{self.job.name}/"
                     f"{record.name.replace('/', '-')}_{task_uuid}")
        step_path = self.runtime.step_path
        return ir.planned_executor_input(
            component, values, inputs, task_root,
            artifact_name=lambda key: (f"projects/{ir.PROJECT_NUMBER}/locations/{ir.LOCATION}/"
                                       f"metadataStores/default/artifacts/{task_uuid}-{key}"),
            parameter_file=lambda key: step_path(f"{task_root}/{key}"),
            output_file=step_path(f"{task_root}/executor_output.json"))

    def _collect(self, component, executor_input) -> dict[str, Any]:
        """Reads what the task wrote (executor_output.json, output files)."""
        outputs = executor_input["outputs"]
        return ir.read_task_outputs(
            component, executor_input, self.runtime.host_path(outputs["outputFile"]),
            parameter_file=lambda key: self.runtime.host_path(
                outputs["parameters"][key]["outputFile"]),
            artifact_path=self.runtime.local)


def rehearse(path: str, output: str, params: Mapping[str, str] | None = None,
             **options: Any) -> dict[str, Any]:
    """Rehearses the compiled pipeline at `path`; writes and returns `output/summary.json`.

    Args:
        path: Compiled pipeline JSON (or YAML) as `compile.py` wrote it.
        output, params: As `Rehearsal` takes them.
        **options: `pipeline_root`, `cache_index`, `preempt`, `runtime`, `registry`.

    Returns:
        The pipeline's own summary (as `run_local` writes it) plus `rehearsal`.
    """
    spec = load_pipeline_spec(path)
    runner = Rehearsal(spec, output, params or {}, **options)
    try:
        outputs = runner.run()
    finally:
        report = write_report(runner.output, runner.records)
    summary = pipeline_summary(spec, outputs)
    if "registration" in summary:  # the Model Registry request is never sent
        request_built = any(r.state == "not-executed" and "register-model" in r.name
                            for r in runner.records)
        summary["registration"].update(
            uploaded=False,
            note="rehearsal: the Model Registry request was built and checked, not sent"
            if request_built else "rehearsal: no upload task ran (not compiled in, or gated off)")
    summary["rehearsal"] = {"pipeline": path, "job_name": runner.job.name,
                            "pipeline_root": runner.job.root, "gcs_folder": runner.runtime.gcs,
                            "tasks": report}
    write_json_atomically(os.path.join(runner.output, "summary.json"), summary, sort_keys=False)
    return summary
