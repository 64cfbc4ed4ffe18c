"""What the parts of a rehearsal hand each other: its error, task records and artifacts.

Kept apart from the logic so that every module of `rehearsal` can use them
without importing another's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any


class RehearsalError(RuntimeError):
    """The compiled pipeline cannot run as Vertex would run it; the message says where."""


def secret_value(secrets: Mapping[str, Mapping[str, str]], name: str, key: str,
                 optional: bool, reader: str) -> str | None:
    """Key `key` of secret `name` in the namespace's `secrets`; None if optional and missing.

    Raises:
        RehearsalError: A required secret or key is missing (the pod would not start).
    """
    value = secrets.get(name, {}).get(key)
    if value is None and not optional:
        raise RehearsalError(f"{reader} reads key {key!r} of secret {name!r}, which the "
                             "namespace does not hold: its pod would not start "
                             f"(CreateContainerConfigError): pass --secret {name}={key}=VALUE")
    return value


@dataclasses.dataclass
class TaskRecord:
    """What the rehearsal reports of one task (`summary.json`'s `rehearsal.tasks`)."""

    name: str
    display_name: str
    state: str = "pending"  # succeeded, cached, skipped, not-executed, failed
    cache: str = "disabled"  # disabled, miss, hit
    cache_key: str = ""
    replicas: int = 0
    attempts: int = 0
    seconds: float = 0.0
    note: str = ""


@dataclasses.dataclass
class ArtifactRef:
    """An artifact as the rehearsal passes it on: its gs:// URI and the local folder."""

    name: str
    uri: str
    schema_title: str
    metadata: dict[str, Any]
    path: str

    @classmethod
    def of(cls, artifact: dict[str, Any], path: str, uri: str | None = None,
           metadata: dict[str, Any] | None = None) -> ArtifactRef:
        """The artifact an executor input lists (`{"name", "type", "uri", ...}`) at local
        `path`; `uri` and `metadata` as the task updated them (default: planned, none)."""
        return cls(name=artifact["name"], uri=artifact["uri"] if uri is None else uri,
                   schema_title=artifact["type"]["schemaTitle"],
                   metadata={} if metadata is None else metadata, path=path)


@dataclasses.dataclass
class Preemption:
    """Kill the first replica (or attempt) of `task` once a file matching `pattern` exists."""

    task: str
    pattern: str
    done: bool = False

    @classmethod
    def pending(cls, rules: list[Preemption], record: TaskRecord) -> Preemption | None:
        """The first rule not yet applied that names `record`'s task (key or display name)."""
        return next((r for r in rules if not r.done and r.task in
                     (record.name, record.display_name)), None)


def write_report(output: str, records: list[TaskRecord]) -> list[dict[str, Any]]:
    """Writes each task's record to `output/rehearsal.json`; returns them as dicts."""
    from components.common.storage import write_json_atomically

    report = [dataclasses.asdict(r) for r in records]
    os.makedirs(output, exist_ok=True)
    write_json_atomically(os.path.join(output, "rehearsal.json"), report, sort_keys=False)
    return report


def print_report(output: str) -> None:
    """Prints each task's line of `output/rehearsal.json`, if the rehearsal wrote it."""
    from components.common.storage import read_json

    for task in read_json(os.path.join(output, "rehearsal.json"), optional=True) or []:
        print(f"  {task['display_name']:<28} {task['state']:<10} attempts "
              f"{task['attempts']} {task['seconds']:.1f}s {task['note']}")


def saved_outputs(outputs: Mapping[str, Any], restore: bool = False) -> dict[str, Any]:
    """A task's `{"parameters", "artifacts"}` as JSON keeps them (artifacts as dicts), or,
    `restore`, back from there (artifacts as `ArtifactRef`)."""
    artifacts = {k: ArtifactRef(**v) if restore else dataclasses.asdict(v)
                 for k, v in outputs["artifacts"].items()}
    return {"parameters": dict(outputs["parameters"]), "artifacts": artifacts}


def pipeline_summary(spec: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's own summary of its outputs (as `run_local` writes it)."""
    from pipelines.catalogue import SUMMARIES_BY_NAME

    summarize = SUMMARIES_BY_NAME.get(spec["pipelineInfo"]["name"])
    return summarize(outputs) if summarize else {
        "outputs": {k: getattr(v, "path", v) for k, v in outputs.items()}}


def registration(decided: Mapping[str, Any], records: list[TaskRecord]) -> dict[str, Any]:
    """The Kubeflow summary's `registration`: the gate's decision, what the run registered."""
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
