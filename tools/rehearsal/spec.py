"""Reading a compiled pipeline (KFP's IR) as the Vertex backend reads it: parameters,
typed values, trigger conditions, task order, executor inputs and placeholders. Nothing here
runs or writes anything."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from components.common.storage import read_json
from pipelines.compiled import SubmitError, declared_parameters, parse_params
from tools.rehearsal.records import ArtifactRef, RehearsalError

# The project and region a rehearsal pretends to run in (placeholders and names show them).
PROJECT = "rehearsal-project"
PROJECT_NUMBER = "123456789012"
LOCATION = "us-central1"

_PLACEHOLDER = re.compile(r"\{\{\$(?P<body>[^{}]*)\}\}")
_INPUT_PARAM = re.compile(
    r"^\.inputs\.parameters\['(?P<name>[^']+)'\](?P<escape>\.json_escape\[0\])?$")
_ITEM_FIELD = re.compile(r'^parseJson\(string_value\)\["(?P<field>[^"]+)"\]$')
_OUTPUT_PARAM_FILE = re.compile(r"^\.outputs\.parameters\['(?P<name>[^']+)'\]\.output_file$")
_ARTIFACT = re.compile(
    r"^\.(?P<io>inputs|outputs)\.artifacts\['(?P<name>[^']+)'\]\.(?P<field>uri|path|metadata)"
    r"(?:\['(?P<key>[^']+)'\])?$")


def typed_value(value: Any, parameter_type: str) -> Any:
    """A value of the spec (JSON already: numbers are floats) as Vertex hands it to a task;
    command-line text goes through `pipelines.compiled.parse_params` instead."""
    if value is None:
        return None
    if parameter_type == "NUMBER_INTEGER":
        if isinstance(value, float) and not value.is_integer():
            raise RehearsalError(f"{value!r} is not an integer")
        return int(value)
    if parameter_type == "NUMBER_DOUBLE":
        return float(value)
    return value


def render(value: Any) -> str:
    """A parameter value in a command line as the backend writes it: strings raw, the rest
    JSON with whole numbers without a fraction (Go's formatting of the double 100.0)."""
    return value if isinstance(value, str) else json.dumps(_map_leaves(
        value, lambda v: int(v) if isinstance(v, float) and v.is_integer() else v))


def _map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` with `leaf` applied to each value inside its lists and dicts."""
    if isinstance(value, list):
        return [_map_leaves(v, leaf) for v in value]
    if isinstance(value, dict):
        return {k: _map_leaves(v, leaf) for k, v in value.items()}
    return leaf(value)


def pipeline_inputs(spec: Mapping[str, Any], params: Mapping[str, str]) -> dict[str, Any]:
    """The pipeline's parameter values: `params` (text of the command line) typed and
    checked as `pipelines.submit` does (`parse_params`), else the defaults.

    Raises:
        RehearsalError: An unknown parameter, a value not of its type, or a required
            parameter without a value.
    """
    definitions = declared_parameters(spec)
    try:
        given = parse_params([f"{name}={text}" for name, text in params.items()], definitions)
    except SubmitError as err:
        raise RehearsalError(str(err)) from err
    return {**{name: typed_value(definition["defaultValue"], definition["parameterType"])
               for name, definition in definitions.items() if "defaultValue" in definition},
            **given}


def evaluate_condition(condition: str, values: Mapping[str, Any]) -> bool:
    """Evaluates a KFP trigger condition (the CEL subset KFP compiles) over a task's inputs.

    Supports `inputs.parameter_values['NAME']`, comparisons, `&&`, `||`, `!`, `int(...)`,
    `double(...)` and string, number and boolean literals; anything else is refused.
    """
    def value_of(match: re.Match) -> str:
        if match.group(1) not in values:
            raise RehearsalError(f"condition {condition!r} reads unknown input {match.group(1)!r}")
        return repr(values[match.group(1)])

    expression = re.sub(r"inputs\.parameter_values\['([^']+)'\]", value_of, condition)
    expression = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", expression))
    expression = re.sub(r"!(?!=)", " not ", expression.replace("&&", " and ")
                        .replace("||", " or "))
    tree = ast.parse(expression.strip(), mode="eval")
    allowed = (ast.Expression, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Not, ast.And, ast.Or,
               ast.Constant, ast.Call, ast.Name, ast.Load, ast.Eq, ast.NotEq, ast.Lt, ast.LtE,
               ast.Gt, ast.GtE, ast.USub)
    for node in ast.walk(tree):
        if not isinstance(node, allowed) or (isinstance(node, ast.Name)
                                             and node.id not in ("int", "double")):
            raise RehearsalError(f"condition {condition!r} uses something this rehearsal "
                                 "cannot evaluate")
    return bool(eval(compile(tree, "<condition>", "eval"), {"__builtins__": {}},
                     {"int": int, "double": float}))


def topological_order(tasks: Mapping[str, dict[str, Any]]) -> list[str]:
    """Task names so that each comes after the tasks it depends on (ties by name)."""
    order: list[str] = []
    pending = dict(tasks)
    while pending:
        ready = sorted(n for n, t in pending.items()
                       if all(d in order for d in t.get("dependentTasks", [])))
        if not ready:
            raise RehearsalError(f"tasks {sorted(pending)} depend on each other in a cycle")
        order.append(ready[0])
        del pending[ready[0]]
    return order


def dag_outputs(component: Mapping[str, Any],
                results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """A DAG component's outputs (`{"parameters", "artifacts"}`), picked from its tasks'
    `results` (a skipped task's are empty) as its spec selects them."""
    outputs: dict[str, dict[str, Any]] = {"parameters": {}, "artifacts": {}}
    selected = component["dag"].get("outputs", {})
    for kind, pick, output_key in (
            ("artifacts", lambda s: s["artifactSelectors"][0], "outputArtifactKey"),
            ("parameters", lambda s: s["valueFromParameter"], "outputParameterKey")):
        for key, selector in selected.get(kind, {}).items():
            chosen = pick(selector)
            produced = results.get(chosen["producerSubtask"], {}).get(kind, {})
            if chosen[output_key] in produced:
                outputs[kind][key] = produced[chosen[output_key]]
    return outputs


@dataclasses.dataclass(frozen=True)
class PipelineJob:
    """The pipeline job as its `{{$.pipeline_*}}` placeholders and output URIs show it."""

    name: str
    uuid: str
    root: str  # the pipeline root, gs://, without a trailing slash

    def system(self, name: str, task: str = "", task_uuid: str = "") -> str | None:
        """The value of the system placeholder `{{$.NAME}}`, None if there is no such one."""
        return {
            "pipeline_google_cloud_project_id": PROJECT,
            "pipeline_google_cloud_location": LOCATION,
            "pipeline_persistent_resource_id": "",
            "pipeline_job_name": self.name,
            "pipeline_job_uuid": self.uuid,
            "pipeline_job_resource_name":
                f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/pipelineJobs/{self.name}",
            "pipeline_root": self.root,
            "pipeline_task_name": task,
            "pipeline_task_uuid": task_uuid,
        }.get(name)

    def resolve_system(self, value: Any) -> Any:
        """Resolves `{{$.pipeline_*}}` inside parameter values, as Vertex does at run time."""
        def sub(match: re.Match) -> str:
            body = match.group("body")
            resolved = self.system(body[1:]) if body.startswith(".pipeline_") else None
            return match.group(0) if resolved is None else resolved

        return _map_leaves(value, lambda v: _PLACEHOLDER.sub(sub, v) if isinstance(v, str) else v)


def task_inputs(task: Mapping[str, Any], component: Mapping[str, Any],
                parameters: Mapping[str, Any], artifacts: Mapping[str, Any],
                results: Mapping[str, dict[str, Any]],
                job: PipelineJob) -> tuple[dict[str, Any], dict[str, Any]]:
    """A task's input parameter values and artifacts, as Vertex hands them to it.

    Args:
        task, component: The task in its DAG and the component it runs.
        parameters, artifacts: The enclosing DAG's parameter values and input artifacts.
        results: The outputs of the tasks that ran before it in that DAG.
        job: The pipeline job (system placeholders in values are resolved).

    Returns:
        (parameter name -> typed value, artifact name -> artifact).
    """
    values: dict[str, Any] = {}
    for key, source in task.get("inputs", {}).get("parameters", {}).items():
        if "componentInputParameter" in source:
            if source["componentInputParameter"] in parameters:
                values[key] = select(parameters[source["componentInputParameter"]],
                                     source.get("parameterExpressionSelector", ""), key)
        elif "taskOutputParameter" in source:
            ref = source["taskOutputParameter"]
            values[key] = results[ref["producerTask"]]["parameters"][ref["outputParameterKey"]]
        elif "runtimeValue" in source:
            values[key] = source["runtimeValue"]["constant"]
        else:
            raise RehearsalError(f"input {key!r}: unsupported source {sorted(source)}")
    for key, definition in component.get("inputDefinitions", {}).get("parameters", {}).items():
        if key not in values and "defaultValue" in definition:
            values[key] = definition["defaultValue"]
        if key in values:
            values[key] = job.resolve_system(typed_value(values[key],
                                                         definition["parameterType"]))
    found: dict[str, Any] = {}
    for key, source in task.get("inputs", {}).get("artifacts", {}).items():
        if "componentInputArtifact" in source:
            found[key] = artifacts[source["componentInputArtifact"]]
        else:
            ref = source["taskOutputArtifact"]
            found[key] = results[ref["producerTask"]]["artifacts"][ref["outputArtifactKey"]]
    return values, found


def select(value: Any, selector: str, key: str) -> Any:
    """A field of a loop item, as `parameterExpressionSelector` picks it (`item.field`
    compiles to `parseJson(string_value)["field"]`); the whole value without one."""
    if not selector:
        return value
    m = _ITEM_FIELD.match(selector)
    if not m:
        raise RehearsalError(f"input {key!r}: selector {selector!r} is not one this "
                             "rehearsal evaluates")
    item = json.loads(value) if isinstance(value, str) else value
    return item[m.group("field")]


def planned_executor_input(component: Mapping[str, Any], values: Mapping[str, Any],
                           inputs: Mapping[str, Any], task_root: str,
                           artifact_name: Callable[[str], str],
                           parameter_file: Callable[[str], str],
                           output_file: str) -> dict[str, Any]:
    """The executor input (`{{$}}`) a backend gives a container task, its outputs planned.

    Args:
        component: The component the task runs.
        values, inputs: Its input parameter values and artifacts (`ArtifactRef`s).
        task_root: The remote folder its output artifacts go to (`<root>/<output>`).
        artifact_name, parameter_file: An output's resource name, and an output parameter's
            file, from its key.
        output_file: The executor output file (as the step sees it).
    """
    outputs = component.get("outputDefinitions", {})
    return {
        "inputs": {
            "parameterValues": values,
            "artifacts": {key: {"artifacts": [{
                "name": artifact.name, "type": {"schemaTitle": artifact.schema_title,
                                                "schemaVersion": "0.0.1"},
                "uri": artifact.uri, "metadata": artifact.metadata}]}
                for key, artifact in inputs.items()},
        },
        "outputs": {
            "parameters": {key: {"outputFile": parameter_file(key)}
                           for key in outputs.get("parameters", {})},
            "artifacts": {key: {"artifacts": [{
                "name": artifact_name(key), "type": definition["artifactType"],
                "uri": f"{task_root}/{key}", "metadata": {}}]}
                for key, definition in outputs.get("artifacts", {}).items()},
            "outputFile": output_file,
        },
    }


@dataclasses.dataclass
class Placeholders:
    """Resolves the placeholders of one task's command line, as the Vertex backend does."""

    executor_input: dict[str, Any]
    definitions: dict[str, Any]  # the component's input parameter definitions
    task_name: str
    task_uuid: str
    job: PipelineJob
    step_path: Callable[[str], str]  # a gs:// URI as the step sees it

    def resolve(self, text_value: str) -> str:
        """Resolves every placeholder of one command-line item; those a parameter value
        carries (GCPC's payload: `{{$.json_escape[1]}}`) once; one left over is an error."""
        executor_json = json.dumps(self.executor_input)

        def one(match: re.Match, nested: bool = False) -> str:
            body = match.group("body")
            if body == "":
                return executor_json
            if body == ".json_escape[1]":
                return json.dumps(executor_json)[1:-1]
            if body.startswith(".pipeline_"):
                value = self.job.system(body[1:], self.task_name, self.task_uuid)
                if value is not None:
                    return value
            m = _INPUT_PARAM.match(body)
            if m and not nested:
                value = _PLACEHOLDER.sub(lambda n: one(n, nested=True),
                                         self._input_value(m.group("name")))
                return json.dumps(value)[1:-1] if m.group("escape") else value
            m = _OUTPUT_PARAM_FILE.match(body)
            if m:
                return self.executor_input["outputs"]["parameters"][m.group("name")][
                    "outputFile"]
            m = _ARTIFACT.match(body)
            if m:
                return self._artifact_field(m)
            raise RehearsalError(f"{self.task_name}: placeholder {match.group(0)!r} is not one "
                                 "Vertex resolves")

        return _PLACEHOLDER.sub(one, text_value)

    def _input_value(self, name: str) -> str:
        """An input parameter as the command line shows it (an optional one unset: empty)."""
        values = self.executor_input["inputs"]["parameterValues"]
        definition = self.definitions.get(name, {})
        if name in values:
            return render(values[name])
        if definition.get("isOptional"):
            return "" if definition["parameterType"] == "STRING" else "null"
        raise RehearsalError(f"{self.task_name}: no value for input {name!r}")

    def _artifact_field(self, m: re.Match) -> str:
        artifact = self.executor_input[m.group("io")]["artifacts"][m.group("name")][
            "artifacts"][0]
        if m.group("field") == "uri":
            return artifact["uri"]
        if m.group("field") == "path":
            return self.step_path(artifact["uri"])
        metadata = artifact["metadata"]
        return render(metadata[m.group("key")] if m.group("key") else metadata)

    def resolve_args(self, items: list[str]) -> list[str]:
        """A container's command or args resolved, `Concat` and `IfPresent` structures too."""
        resolved: list[str] = []
        for item in items:
            structure = _structured(item)
            if structure is None:
                resolved.append(self.resolve(item))
            elif "Concat" in structure:
                resolved.append("".join(self.resolve_args(structure["Concat"])))
            elif "IfPresent" in structure:
                branch = structure["IfPresent"]
                present = self.executor_input["inputs"]
                chosen = branch.get("Then" if branch["InputName"] in present["artifacts"]
                                    or branch["InputName"] in present["parameterValues"]
                                    else "Else", [])
                resolved += self.resolve_args(chosen if isinstance(chosen, list) else [chosen])
            else:
                raise RehearsalError(f"{self.task_name}: unknown argument structure "
                                     f"{sorted(structure)}")
        return resolved


def _structured(item: str) -> dict | None:
    if not item.startswith("{\""):
        return None
    try:
        value = json.loads(item)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and set(value) & {"Concat", "IfPresent"} else None


def read_task_outputs(component: Mapping[str, Any], executor_input: Mapping[str, Any],
                      output_file: str, parameter_file: Callable[[str], str],
                      artifact_path: Callable[[str], str]) -> dict[str, Any]:
    """What a finished task wrote, read as the backend reads it.

    Args:
        component, executor_input: The component it ran and its executor input.
        output_file: The local executor output file (none written: nothing updated).
        parameter_file: The local file of an output parameter, from its key.
        artifact_path: The local file or folder behind an output artifact's URI.

    Returns:
        `{"parameters", "artifacts"}`: the executor output's values, else each output
        file's text (typed unless a string); artifacts as the executor output updates them.
    """
    written = read_json(output_file, optional=True) or {}
    artifacts = {}
    for key, entry in executor_input["outputs"]["artifacts"].items():
        artifact = entry["artifacts"][0]
        updated = (written.get("artifacts", {}).get(key, {}).get("artifacts") or [{}])[0]
        uri = updated.get("uri", artifact["uri"])
        artifacts[key] = ArtifactRef.of(artifact, path=artifact_path(uri), uri=uri,
                                        metadata=updated.get("metadata", {}))
    parameters = dict(written.get("parameterValues", {}))
    definitions = component.get("outputDefinitions", {}).get("parameters", {})
    for key in executor_input["outputs"]["parameters"]:
        path = parameter_file(key)
        if key not in parameters and os.path.exists(path):
            with open(path) as f:
                raw = f.read()
            # The backend reads an output file as JSON unless the output is a string.
            kind = definitions.get(key, {}).get("parameterType", "STRING")
            parameters[key] = raw if kind == "STRING" else json.loads(raw)
    return {"parameters": parameters, "artifacts": artifacts}
