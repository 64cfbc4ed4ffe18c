"""What both rehearsals (Vertex's `driver`, open-source KFP's `kubeflow`) do alike: walk a
DAG in dependency order, record each task, and skip one whose upstream did not run or
whose `dsl.If` condition is false."""

from __future__ import annotations

from typing import Any

import tools.rehearsal.spec as ir
from tools.rehearsal.records import TaskRecord

SKIPPED = {"skipped": True, "parameters": {}, "artifacts": {}}


class DagWalk:
    """A rehearsal's DAG walk; subclasses set `spec`, `job` and `records` and define
    `_run_task(name, task, parameters, artifacts, results)`."""

    spec: dict[str, Any]
    job: ir.PipelineJob
    records: list[TaskRecord]

    def _run_dag(self, component: dict[str, Any], parameters: dict[str, Any],
                 artifacts: dict[str, Any], prefix: str) -> dict[str, Any]:
        tasks = component["dag"]["tasks"]
        results: dict[str, dict[str, Any]] = {}
        for name in ir.topological_order(tasks):
            results[name] = self._run_task(prefix + name, tasks[name], parameters, artifacts,
                                           results)
        return ir.dag_outputs(component, results)

    def _run_task(self, name: str, task: dict[str, Any], parameters: dict[str, Any],
                  artifacts: dict[str, Any], results: dict[str, dict]) -> dict[str, Any]:
        raise NotImplementedError

    def _open_task(self, name: str, task: dict[str, Any], parameters: dict[str, Any],
                   artifacts: dict[str, Any], results: dict[str, dict]):
        """`(record, component, values, inputs)` of a task that runs; values and inputs are
        None when it is skipped (its record says why)."""
        component = self.spec["components"][task["componentRef"]["name"]]
        record = TaskRecord(name, task.get("taskInfo", {}).get("name", name))
        self.records.append(record)
        if any(results.get(d, {}).get("skipped") for d in task.get("dependentTasks", [])):
            record.state, record.note = "skipped", "an upstream task did not run"
            return record, component, None, None
        values, inputs = ir.task_inputs(task, component, parameters, artifacts, results,
                                        self.job)
        condition = task.get("triggerPolicy", {}).get("condition")
        if condition and not ir.evaluate_condition(condition, values):
            record.state, record.note = "skipped", f"condition false: {condition}"
            print(f"[rehearse] {record.display_name}: skipped ({condition} is false)")
            return record, component, None, None
        return record, component, values, inputs
