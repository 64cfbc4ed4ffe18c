"""What both rehearsals (Vertex's `driver`, open-source KFP's `kubeflow`) do alike: walk a
DAG in dependency order, record each task, find its producers by task key among the
tasks recorded before it, and skip one whose upstream did not run or whose `dsl.If`
condition is false."""

from __future__ import annotations

from typing import Any

import tools.rehearsal.spec as ir
from tools.rehearsal.records import RehearsalError, TaskRecord

SKIPPED = {"skipped": True, "parameters": {}, "artifacts": {}}


class DagWalk:
    """A rehearsal's DAG walk; subclasses set `spec`, `job` and `records` and define
    `_run_task(record, task, component, values, inputs)` for a task that runs."""

    spec: dict[str, Any]
    job: ir.PipelineJob
    records: list[TaskRecord]

    def _run_dag(self, dag: dict[str, Any], parameters: dict[str, Any],
                 artifacts: dict[str, Any], prefix: str) -> dict[str, Any]:
        """Runs a DAG component's tasks in order, each recorded, one skipped with the reason
        in its record; returns the DAG's `{"parameters", "artifacts"}`."""
        tasks = dag["dag"]["tasks"]
        results: dict[str, dict[str, Any]] = {}
        for key in ir.topological_order(tasks):
            task = tasks[key]
            component = self.spec["components"][task["componentRef"]["name"]]
            record = TaskRecord(prefix + key, task.get("taskInfo", {}).get("name", prefix + key))
            self.records.append(record)
            results[key] = dict(SKIPPED)  # until it runs
            if any(results.get(d, {}).get("skipped") for d in task.get("dependentTasks", [])):
                record.state, record.note = "skipped", "an upstream task did not run"
                continue
            self._find_producers(record, task, results)
            values, inputs = ir.task_inputs(task, component, parameters, artifacts, results,
                                            self.job)
            condition = task.get("triggerPolicy", {}).get("condition")
            if condition and not ir.evaluate_condition(condition, values):
                record.state, record.note = "skipped", f"condition false: {condition}"
                print(f"[rehearse] {record.display_name}: skipped ({condition} is false)")
                continue
            results[key] = self._run_task(record, task, component, values, inputs)
        return ir.dag_outputs(dag, results)

    def _run_task(self, record: TaskRecord, task: dict[str, Any], component: dict[str, Any],
                  values: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _find_producers(self, record: TaskRecord, task: dict[str, Any],
                        results: dict[str, dict]) -> None:
        """Fails the task if a producer was recorded under another name than its task key
        (`recorded_as`): the driver looks producers up by key."""
        inputs = task.get("inputs", {})
        for source in (*inputs.get("parameters", {}).values(),
                       *inputs.get("artifacts", {}).values()):
            ref = source.get("taskOutputParameter") or source.get("taskOutputArtifact")
            key = ref["producerTask"] if ref else ""
            recorded = results.get(key, {}).get("recorded_as", key)
            if recorded != key:
                record.state, record.note = "failed", self._unfound(key, recorded)
                raise RehearsalError(f"{record.display_name}: {record.note}")

    def _unfound(self, key: str, recorded: str) -> str:
        """Why producer `key`, recorded as `recorded`, was not found."""
        return f"cannot find producer task {key!r} (recorded as {recorded!r})"
