"""Rehearse a compiled Vertex pipeline (the JSON users upload) on this machine.

    python -m pipelines.rehearse build/image_pipeline.json --output DIR [--param NAME=VALUE ...]
        [--pipeline-root gs://BUCKET/root] [--cache-index FILE] [--preempt TASK=GLOB ...]
        [--runtime local|image]

The file runs as Vertex Pipelines would run it, not as the Python pipeline function:
the DAG, `dsl.If` conditions, pipeline parameter defaults and each task's inputs are read
from the JSON; placeholders are resolved as the Vertex backend resolves them; each GCPC
custom-job task is unwrapped from its launcher payload (the payload is parsed into
Vertex's own `CustomJob` message, so a field or enum Vertex would reject fails here), and
every replica of every worker pool runs as its own process with the environment Vertex
sets (`CLUSTER_SPEC` and `TF_CONFIG` for multi-replica jobs, `AIP_MODEL_DIR`,
`AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR` when the job has a base output
directory). `gs://BUCKET/...` is the folder `DIR/gcs/BUCKET/...`, which stands in for
Vertex's `/gcs/` Cloud Storage FUSE mount. With `--runtime local` (the default) steps run
in this Python environment (`python3` on the PATH is this interpreter) and KFP's mount
prefix is pointed at that folder in each step process (`rehearsal_site/sitecustomize.py`).
With `--runtime image` each step runs inside the image the JSON names, built here by
`make images-local`, as the image's user, with the folder mounted at `/gcs`.

A hyperparameter tuning job (the tuning variants) is parsed into Vertex's
`HyperparameterTuningJob` and its trials run one by one, values drawn at random (seeded)
from the study spec and appended as `--name=value`, each with its own `AIP_*` folders; the
metric a trial reports through hypertune is its measurement, and the best-trial step's
selection runs on that job instead of reading it from the Vertex API.

Every CustomJob request is written to `DIR/vertex-requests/<task>.json` as the launcher
would send it. Not executed: tasks that call the Vertex API themselves (the Model
Registry upload): their request is built with GCPC's own code, checked against Vertex's
`Model` message and written there too. Cache decisions are reported per task; with
`--cache-index FILE` a task whose cache key was seen in an earlier rehearsal is reused as
Vertex reuses it. `--preempt TASK=GLOB` kills the first replica of TASK once a file
matching GLOB exists under `DIR/gcs/`, and restarts it as Vertex restarts a preempted
worker (the whole job when it was compiled with `restart_job_on_worker_restart`).

Writes `DIR/summary.json` in the shape of `pipelines.run_local`, with a `rehearsal`
section (each task's state, cache decision, replicas, attempts and seconds).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from components.common.storage import write_json_atomically
from pipelines import gcs_api
from pipelines.catalogue import SUMMARIES_BY_NAME
from pipelines.params import parse_value

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rehearsal_site")
MOUNT_ENV = "REHEARSAL_GCS_MOUNT"
# Where Vertex has a trial write its metrics (CLOUD_ML_HP_METRIC_FILE), as its users report
# it (GoogleCloudPlatform/cloudml-hypertune#6: writable only by root unless the image makes
# /var/hypertune its user's).
VERTEX_METRIC_FILE = "/var/hypertune/output.metrics"
PROJECT = "rehearsal-project"
PROJECT_NUMBER = "123456789012"
LOCATION = "us-central1"
CUSTOM_JOB_LAUNCHER = "google_cloud_pipeline_components.container.v1.custom_job.launcher"
TUNING_JOB_LAUNCHER = ("google_cloud_pipeline_components.container.v1."
                       "hyperparameter_tuning_job.launcher")
GCPC_LAUNCHER_PREFIX = "google_cloud_pipeline_components.container."
# Our Model Registry lookup (components.register.component.find_registered_model): a
# Vertex API call like GCPC's, so it is stood in for, from the `registry` given.
REGISTRY_LOOKUP = "find_registered_model"
# Our best-trial steps (components.tune.component) read the tuning job from Vertex: the
# rehearsal runs their selection code on the job it rehearsed instead.
BEST_TRIAL_STEPS = {"best_image_trial": "image", "best_text_trial": "text",
                    "best_transformer_trial": "transformer"}
RUNTIMES = ("local", "image")
GCS_MOUNT = "/gcs"
BUILDAH = ("buildah", "--storage-driver", "vfs")

_PLACEHOLDER = re.compile(r"\{\{\$(?P<body>[^{}]*)\}\}")
_INPUT_PARAM = re.compile(
    r"^\.inputs\.parameters\['(?P<name>[^']+)'\](?P<escape>\.json_escape\[0\])?$")
_OUTPUT_PARAM_FILE = re.compile(r"^\.outputs\.parameters\['(?P<name>[^']+)'\]\.output_file$")
_ARTIFACT = re.compile(
    r"^\.(?P<io>inputs|outputs)\.artifacts\['(?P<name>[^']+)'\]\.(?P<field>uri|path|metadata)"
    r"(?:\['(?P<key>[^']+)'\])?$")


class RehearsalError(RuntimeError):
    """The compiled pipeline cannot run as Vertex would run it; the message says where."""


# --------------------------------------------------------------------------- values


def typed_value(value: Any, parameter_type: str) -> Any:
    """A parameter value as Vertex hands it to a task (JSON numbers are floats in the spec)."""
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
    """A parameter value inside a command line, as the backend writes it: strings raw,
    everything else as JSON with whole numbers written without a fraction (protobuf
    numbers are doubles; Go's formatting of 100.0 is `100`)."""
    def whole(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [whole(x) for x in v]
        if isinstance(v, dict):
            return {k: whole(x) for k, x in v.items()}
        return v

    return value if isinstance(value, str) else json.dumps(whole(value))


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


# --------------------------------------------------------------------------- the job env


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


# --------------------------------------------------------------------------- the images


def open_mount(folder: str) -> None:
    """Gives every file under the stand-in for /gcs the modes of a shared FUSE mount.

    gcsfuse shows all objects with its mount's one directory mode and file mode (chmod and
    chown are ignored), whoever wrote them. Vertex does not document the modes it mounts
    /gcs with; its own KFP executor writes outputs there from the image's user, so the
    rehearsal mounts it writable to all users (0777 folders, 0666 files), and files written
    here by root (staged data, earlier outputs) look the same as the ones a step wrote.
    """
    for root, _, files in os.walk(folder):
        os.chmod(root, 0o777)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666)


class ImageContainers:
    """Runs steps inside locally built images (`make images-local`) with buildah.

    One working container per image per rehearsal (vfs storage copies a whole image per
    container, minutes for the fastai one), so steps of one image share its filesystem
    outside /gcs; on Vertex each job starts from the image afresh. Steps run as the image's
    user (USER in its Dockerfile), in its working folder, with its environment plus the
    job's, and chroot isolation on the host's network (loopback TF_CONFIG addresses work).
    The Cloud Storage API the steps read raw inputs through is an emulator on loopback
    (`STORAGE_EMULATOR_HOST`), seeded with the rehearsal's gcs/ folder.
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.env: dict[str, str] = {}  # for every step: where the Cloud Storage API is

    def container(self, image: str) -> str:
        if image not in self.names:
            if not shutil.which(BUILDAH[0]):
                raise RehearsalError("--runtime image runs steps with buildah, which is not "
                                     "installed here: `make images-local` installs it and "
                                     "builds the images")
            name = "rehearse-" + hashlib.sha1(f"{image}{time.time()}".encode()).hexdigest()[:12]
            result = subprocess.run([*BUILDAH, "from", "--pull=never", "--name", name, image],
                                    capture_output=True, text=True)
            if result.returncode:
                raise RehearsalError(f"image {image} is not in this machine's buildah storage "
                                     f"({result.stderr.strip()}): build it with "
                                     "`make images-local`")
            self.names[image] = name
        return self.names[image]

    def run_command(self, image: str, command: list[str], gcs_folder: str,
                    env: Mapping[str, str]) -> list[str]:
        """The command line that runs `command` in `image` with `gcs_folder` at /gcs."""
        return [*BUILDAH, "run", "--isolation", "chroot",
                "--volume", f"{gcs_folder}:{GCS_MOUNT}",
                *[f"--env={key}={value}" for key, value in {**self.env, **env}.items()],
                self.container(image), "--", *command]

    def take_file(self, image: str, path: str) -> str:
        """The text of `path` inside `image`'s container (empty if none), then removes it,
        as the next job would start from the image afresh on Vertex."""
        result = subprocess.run([*BUILDAH, "run", "--isolation", "chroot",
                                 self.container(image), "--", "sh", "-c",
                                 f"cat {path} 2>/dev/null; rm -f {path}"],
                                capture_output=True, text=True)
        return result.stdout

    def remove_all(self) -> None:
        for name in self.names.values():
            subprocess.run([*BUILDAH, "rm", name], capture_output=True)
        self.names.clear()


# --------------------------------------------------------------------------- the runner


@dataclasses.dataclass
class Preemption:
    """Kill the first replica of `task` once a file matching `pattern` exists, once."""

    task: str
    pattern: str
    done: bool = False


@dataclasses.dataclass
class TaskRecord:
    name: str
    display_name: str
    state: str = "pending"  # succeeded, cached, skipped, not-executed, failed
    cache: str = "disabled"  # disabled, miss, hit
    cache_key: str = ""
    replicas: int = 0
    attempts: int = 0
    seconds: float = 0.0
    note: str = ""


class Rehearsal:
    """One rehearsal of a compiled pipeline; `run()` executes it."""

    def __init__(self, spec: dict[str, Any], output: str, params: Mapping[str, str],
                 pipeline_root: str = "gs://rehearsal-bucket/pipeline-root",
                 cache_index: str | None = None, preempt: list[Preemption] | None = None,
                 runtime: str = "local", registry: Mapping[str, str] | None = None):
        if runtime not in RUNTIMES:
            raise RehearsalError(f"--runtime must be one of {RUNTIMES}, got {runtime!r}")
        self.spec = spec
        self.runtime = runtime
        self.output = os.path.abspath(output)
        self.gcs = os.path.join(self.output, "gcs")
        if not pipeline_root.startswith("gs://"):
            raise RehearsalError(f"--pipeline-root must be a gs:// URI, got {pipeline_root!r}")
        self.pipeline_root = pipeline_root.rstrip("/")
        self.job_name = f"{spec['pipelineInfo']['name']}-{time.strftime('%Y%m%d%H%M%S')}"
        self.job_uuid = hashlib.sha1(f"{self.output}{time.time()}".encode()).hexdigest()[:16]
        self.cache_index = cache_index
        self.cache = self._load_cache()
        self.preempt = preempt or []
        self.registry = dict(registry or {})
        self.tuning_jobs: dict[str, Any] = {}  # rehearsed tuning jobs by resource name
        self.records: list[TaskRecord] = []
        self.inputs = self._pipeline_inputs(params)
        self.containers = ImageContainers() if runtime == "image" else None
        if runtime == "image":
            self._check_no_host_paths()

    # -- inputs -------------------------------------------------------------------------

    def _pipeline_inputs(self, params: Mapping[str, str]) -> dict[str, Any]:
        definitions = self.spec["root"].get("inputDefinitions", {}).get("parameters", {})
        unknown = sorted(set(params) - set(definitions))
        if unknown:
            raise RehearsalError(f"unknown pipeline parameter(s) {unknown}; the pipeline "
                                 f"takes {sorted(definitions)}")
        values = {}
        for name, definition in definitions.items():
            kind = definition["parameterType"]
            if name in params:
                try:
                    values[name] = parse_value(params[name], kind)
                except ValueError as err:
                    raise RehearsalError(f"--param {name}: {err}") from err
            elif "defaultValue" in definition:
                values[name] = typed_value(definition["defaultValue"], kind)
            elif not definition.get("isOptional"):
                raise RehearsalError(f"pipeline parameter {name!r} has no default: pass "
                                     f"--param {name}=VALUE")
        return values

    def _system(self, name: str, task: str = "", task_uuid: str = "") -> str | None:
        return {
            "pipeline_google_cloud_project_id": PROJECT,
            "pipeline_google_cloud_location": LOCATION,
            "pipeline_persistent_resource_id": "",
            "pipeline_job_name": self.job_name,
            "pipeline_job_uuid": self.job_uuid,
            "pipeline_job_resource_name":
                f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/pipelineJobs/{self.job_name}",
            "pipeline_root": self.pipeline_root,
            "pipeline_task_name": task,
            "pipeline_task_uuid": task_uuid,
        }.get(name)

    def _resolve_system(self, value: Any) -> Any:
        """Resolves `{{$.pipeline_*}}` inside parameter values, as Vertex does at run time."""
        if isinstance(value, str):
            def sub(match: re.Match) -> str:
                body = match.group("body")
                resolved = self._system(body[1:]) if body.startswith(".pipeline_") else None
                return match.group(0) if resolved is None else resolved
            return _PLACEHOLDER.sub(sub, value)
        if isinstance(value, list):
            return [self._resolve_system(v) for v in value]
        if isinstance(value, dict):
            return {k: self._resolve_system(v) for k, v in value.items()}
        return value

    def local(self, uri: str) -> str:
        """The rehearsal's file for a gs:// URI (what /gcs/ would show on Vertex)."""
        if uri.startswith("gs://"):
            return os.path.join(self.gcs, uri[len("gs://"):])
        return uri

    def step_path(self, uri: str) -> str:
        """A gs:// URI as a step sees it: `/gcs/...` inside an image, else the local file."""
        if self.runtime == "image" and uri.startswith("gs://"):
            return GCS_MOUNT + "/" + uri[len("gs://"):]
        return self.local(uri)

    def host_path(self, step_path: str) -> str:
        """The local file behind a path a step was given (see `step_path`)."""
        if self.runtime == "image" and step_path.startswith(GCS_MOUNT + "/"):
            return os.path.join(self.gcs, step_path[len(GCS_MOUNT) + 1:])
        return step_path

    def _check_no_host_paths(self) -> None:
        """Inside an image a step sees only /gcs: a local path parameter would not exist."""
        for name, value in self.inputs.items():
            if isinstance(value, str) and value and not value.startswith("gs://") and \
                    os.path.exists(value):
                raise RehearsalError(
                    f"--param {name}={value} is a local path, which a step inside the image "
                    f"cannot see: copy it under {self.gcs}/BUCKET/... and pass gs://BUCKET/...")

    # -- cache --------------------------------------------------------------------------

    def _load_cache(self) -> dict[str, Any]:
        if self.cache_index and os.path.exists(self.cache_index):
            with open(self.cache_index) as f:
                return json.load(f)
        return {}

    def _save_cache(self) -> None:
        if self.cache_index:
            os.makedirs(os.path.dirname(os.path.abspath(self.cache_index)), exist_ok=True)
            write_json_atomically(self.cache_index, self.cache)

    # -- DAG ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Runs the pipeline; returns its outputs (artifacts as objects with .path/.metadata)."""
        os.makedirs(self.gcs, exist_ok=True)
        api = None
        if self.containers:
            # Raw inputs are read through the Cloud Storage API: an emulator holding what
            # gcs/ holds now (later outputs are read back through /gcs, as on Vertex).
            api, url = gcs_api.start_emulator(os.path.join(self.output, "logs"))
            count = gcs_api.seed(url, self.gcs)
            self.containers.env = {"STORAGE_EMULATOR_HOST": url}
            print(f"[rehearse] Cloud Storage API: {count} files of {self.gcs} on {url}")
        try:
            outputs = self._run_dag(self.spec["root"], self.inputs, {}, prefix="")
        finally:
            if self.containers:
                self.containers.remove_all()
            if api:
                gcs_api.stop(api)
        self._save_cache()
        return outputs

    def _run_dag(self, component: dict[str, Any], parameters: dict[str, Any],
                 artifacts: dict[str, Any], prefix: str) -> dict[str, Any]:
        tasks = component["dag"]["tasks"]
        results: dict[str, dict[str, Any]] = {}
        for name in topological_order(tasks):
            task = tasks[name]
            results[name] = self._run_task(prefix + name, task, parameters, artifacts, results)
        outputs: dict[str, Any] = {}
        dag_outputs = component["dag"].get("outputs", {})
        for key, selector in dag_outputs.get("artifacts", {}).items():
            chosen = selector["artifactSelectors"][0]
            produced = results.get(chosen["producerSubtask"], {}).get("artifacts", {})
            if chosen["outputArtifactKey"] in produced:
                outputs[key] = produced[chosen["outputArtifactKey"]]
        for key, selector in dag_outputs.get("parameters", {}).items():
            chosen = selector["valueFromParameter"]
            produced = results.get(chosen["producerSubtask"], {}).get("parameters", {})
            if chosen["outputParameterKey"] in produced:
                outputs[key] = produced[chosen["outputParameterKey"]]
        return outputs

    def _task_inputs(self, task: dict[str, Any], component: dict[str, Any],
                     parameters: dict[str, Any], artifacts: dict[str, Any],
                     results: dict[str, dict[str, Any]]) -> tuple[dict, dict]:
        values: dict[str, Any] = {}
        for key, source in task.get("inputs", {}).get("parameters", {}).items():
            if "componentInputParameter" in source:
                if source["componentInputParameter"] in parameters:
                    values[key] = parameters[source["componentInputParameter"]]
            elif "taskOutputParameter" in source:
                ref = source["taskOutputParameter"]
                values[key] = results[ref["producerTask"]]["parameters"][ref["outputParameterKey"]]
            elif "runtimeValue" in source:
                values[key] = source["runtimeValue"]["constant"]
            else:
                raise RehearsalError(f"input {key!r}: unsupported source {sorted(source)}")
        inputs = component.get("inputDefinitions", {})
        for key, definition in inputs.get("parameters", {}).items():
            if key not in values and "defaultValue" in definition:
                values[key] = definition["defaultValue"]
            if key in values:
                values[key] = self._resolve_system(typed_value(values[key],
                                                               definition["parameterType"]))
        found: dict[str, Any] = {}
        for key, source in task.get("inputs", {}).get("artifacts", {}).items():
            if "componentInputArtifact" in source:
                found[key] = artifacts[source["componentInputArtifact"]]
            else:
                ref = source["taskOutputArtifact"]
                found[key] = results[ref["producerTask"]]["artifacts"][ref["outputArtifactKey"]]
        return values, found

    def _run_task(self, name: str, task: dict[str, Any], parameters: dict[str, Any],
                  artifacts: dict[str, Any], results: dict[str, dict]) -> dict[str, Any]:
        component = self.spec["components"][task["componentRef"]["name"]]
        record = TaskRecord(name, task.get("taskInfo", {}).get("name", name))
        self.records.append(record)
        if any(results.get(d, {}).get("skipped") for d in task.get("dependentTasks", [])):
            record.state, record.note = "skipped", "an upstream task did not run"
            return {"skipped": True, "parameters": {}, "artifacts": {}}
        values, inputs = self._task_inputs(task, component, parameters, artifacts, results)
        condition = task.get("triggerPolicy", {}).get("condition")
        if condition and not evaluate_condition(condition, values):
            record.state, record.note = "skipped", f"condition false: {condition}"
            print(f"[rehearse] {record.display_name}: skipped ({condition} is false)")
            return {"skipped": True, "parameters": {}, "artifacts": {}}
        if "dag" in component:
            started = time.monotonic()
            outputs = self._run_dag(component, values, inputs, prefix=name + "/")
            record.state, record.seconds = "succeeded", time.monotonic() - started
            return {"parameters": {k: v for k, v in outputs.items() if not hasattr(v, "uri")},
                    "artifacts": {k: v for k, v in outputs.items() if hasattr(v, "uri")}}
        executor = self.spec["deploymentSpec"]["executors"][component["executorLabel"]]
        if "container" not in executor:
            raise RehearsalError(f"task {name!r}: executor {sorted(executor)} is not a container")
        return self._run_container(record, task, component, executor["container"], values,
                                   inputs)

    # -- one container task -------------------------------------------------------------

    def _executor_input(self, record: TaskRecord, component: dict[str, Any],
                        values: dict[str, Any], inputs: dict[str, Any],
                        task_uuid: str) -> dict[str, Any]:
        task_root = (f"{self.pipeline_root}/{PROJECT_NUMBER}/{self.job_name}/"
                     f"{record.name.replace('/', '-')}_{task_uuid}")
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
                "parameters": {key: {"outputFile": self.step_path(f"{task_root}/{key}")}
                               for key in outputs.get("parameters", {})},
                "artifacts": {key: {"artifacts": [{
                    "name": f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/metadataStores/"
                            f"default/artifacts/{task_uuid}-{key}",
                    "type": definition["artifactType"],
                    "uri": f"{task_root}/{key}", "metadata": {}}]}
                    for key, definition in outputs.get("artifacts", {}).items()},
                # The executor writes this file itself; on Vertex it is under /gcs/.
                "outputFile": self.step_path(f"{task_root}/executor_output.json"),
            },
        }

    def resolve(self, text_value: str, executor_input: dict[str, Any],
                definitions: dict[str, Any], task_name: str, task_uuid: str) -> str:
        """Resolves every placeholder of one command-line item, as the Vertex backend does.

        Parameter values are inserted verbatim and the executor placeholders they carry
        (GCPC's payload holds the wrapped component's `{{$.json_escape[1]}}`) are
        resolved in them once; a placeholder left over is an error.
        """
        executor_json = json.dumps(executor_input)

        def one(match: re.Match, nested: bool = False) -> str:
            body = match.group("body")
            if body == "":
                return executor_json
            if body == ".json_escape[1]":
                return json.dumps(executor_json)[1:-1]
            if body.startswith(".pipeline_"):
                value = self._system(body[1:], task_name, task_uuid)
                if value is not None:
                    return value
            m = _INPUT_PARAM.match(body)
            if m and not nested:
                values = executor_input["inputs"]["parameterValues"]
                definition = definitions.get(m.group("name"), {})
                if m.group("name") in values:
                    value = render(values[m.group("name")])
                elif definition.get("isOptional"):
                    value = "" if definition["parameterType"] == "STRING" else "null"
                else:
                    raise RehearsalError(f"{task_name}: no value for input "
                                         f"{m.group('name')!r}")
                value = _PLACEHOLDER.sub(lambda n: one(n, nested=True), value)
                return json.dumps(value)[1:-1] if m.group("escape") else value
            m = _OUTPUT_PARAM_FILE.match(body)
            if m:
                return executor_input["outputs"]["parameters"][m.group("name")]["outputFile"]
            m = _ARTIFACT.match(body)
            if m:
                artifact = executor_input[m.group("io")]["artifacts"][m.group("name")][
                    "artifacts"][0]
                if m.group("field") == "uri":
                    return artifact["uri"]
                if m.group("field") == "path":
                    return self.step_path(artifact["uri"])
                metadata = artifact["metadata"]
                return render(metadata[m.group("key")] if m.group("key") else metadata)
            raise RehearsalError(f"{task_name}: placeholder {match.group(0)!r} is not one "
                                 "Vertex resolves")

        return _PLACEHOLDER.sub(one, text_value)

    def _resolve_args(self, items: list[str], executor_input, definitions, task_name,
                      task_uuid) -> list[str]:
        resolved: list[str] = []
        for item in items:
            structure = _structured(item)
            if structure is None:
                resolved.append(self.resolve(item, executor_input, definitions, task_name,
                                             task_uuid))
            elif "Concat" in structure:
                resolved.append("".join(self._resolve_args(
                    structure["Concat"], executor_input, definitions, task_name, task_uuid)))
            elif "IfPresent" in structure:
                branch = structure["IfPresent"]
                present = executor_input["inputs"]
                chosen = branch.get("Then" if branch["InputName"] in present["artifacts"]
                                    or branch["InputName"] in present["parameterValues"]
                                    else "Else", [])
                resolved += self._resolve_args(chosen if isinstance(chosen, list) else [chosen],
                                               executor_input, definitions, task_name, task_uuid)
            else:
                raise RehearsalError(f"{task_name}: unknown argument structure {sorted(structure)}")
        return resolved

    def _cache_key(self, component, container, values, inputs) -> str:
        payload = {"component": {k: component.get(k) for k in ("inputDefinitions",
                                                                "outputDefinitions")},
                   "container": container, "parameters": values,
                   "artifacts": {k: a.name for k, a in inputs.items()}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]

    def _run_container(self, record: TaskRecord, task, component, container, values,
                       inputs) -> dict[str, Any]:
        started = time.monotonic()
        record.cache_key = self._cache_key(component, container, values, inputs)
        if task.get("cachingOptions", {}).get("enableCache", False):
            hit = self.cache.get(record.cache_key)
            record.cache = "hit" if hit else "miss"
            if hit:
                self._bring_cached_outputs(hit)
                record.state = "cached"
                print(f"[rehearse] {record.display_name}: cache hit, outputs of an earlier run "
                      "reused")
                return {"parameters": hit["parameters"],
                        "artifacts": {k: ArtifactRef(**{**a, "path": self.local(a["uri"])})
                                      for k, a in hit["artifacts"].items()}}
        task_uuid = hashlib.sha1(f"{self.job_uuid}/{record.name}".encode()).hexdigest()[:12]
        executor_input = self._executor_input(record, component, values, inputs, task_uuid)
        definitions = component.get("inputDefinitions", {}).get("parameters", {})
        command = self._resolve_args(container.get("command", []), executor_input, definitions,
                                     record.name, task_uuid)
        args = self._resolve_args(container.get("args", []), executor_input, definitions,
                                  record.name, task_uuid)
        print(f"[rehearse] {record.display_name}: running")
        if container.get("command", [])[-1:] == [CUSTOM_JOB_LAUNCHER]:
            self._custom_job(record, args)
        elif TUNING_JOB_LAUNCHER in command:
            self._tuning_job(record, args)
        elif any(part.startswith(GCPC_LAUNCHER_PREFIX) for part in command):
            self._vertex_api_call(record, args, executor_input)
            record.seconds = time.monotonic() - started
            return {"parameters": {}, "artifacts": {}}
        elif REGISTRY_LOOKUP in args:
            return self._registry_lookup(record, executor_input)
        elif set(BEST_TRIAL_STEPS) & set(args):
            (step,) = set(BEST_TRIAL_STEPS) & set(args)
            return self._best_trial(record, BEST_TRIAL_STEPS[step], executor_input)
        else:
            record.replicas = 1
            self._run_replicas(record, [[command + args]], [[{}]], restart_all=False,
                               images=[container["image"]])
        record.state, record.seconds = "succeeded", time.monotonic() - started
        result = self._collect(component, executor_input)
        if record.cache != "disabled":
            self.cache[record.cache_key] = {
                "parameters": result["parameters"],
                "artifacts": {k: dataclasses.asdict(a) for k, a in result["artifacts"].items()}}
        return result

    def _bring_cached_outputs(self, hit: Mapping[str, Any]) -> None:
        """Copies a cache hit's artifact files from the rehearsal that wrote them into this
        one's bucket folder, at the same gs:// URIs: on Vertex every run reads one bucket,
        so a later step can read a cached step's outputs. (An artifact may have no file,
        e.g. a `Metrics` output holds only metadata.)"""
        for artifact in hit["artifacts"].values():
            source, target = artifact["path"], self.local(artifact["uri"])
            if not os.path.exists(source) or os.path.exists(target):
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.isdir(source):
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)

    def _custom_job(self, record: TaskRecord, args: list[str]) -> None:
        from google.cloud import aiplatform_v1
        from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util

        payload = _flag(args, "--payload")
        try:
            job = json_util.recursive_remove_empty(json.loads(payload, strict=False))
        except json.JSONDecodeError as err:
            raise RehearsalError(f"{record.name}: the resolved CustomJob payload is not JSON "
                                 f"({err})") from err
        try:
            aiplatform_v1.CustomJob(job)  # what the launcher sends: Vertex's own message
        except (KeyError, ValueError, TypeError) as err:
            raise RehearsalError(f"{record.name}: Vertex would reject the CustomJob: "
                                 f"{type(err).__name__}: {err}") from err
        self._write_request(record, "CustomJob", job)
        spec = job["job_spec"]
        pools = spec["worker_pool_specs"]
        if pools[0].get("replica_count", 1) != 1:
            raise RehearsalError(f"{record.name}: Vertex requires workerpool0 to have exactly "
                                 "one replica")
        sizes = [int(p.get("replica_count", 0)) if p else 0 for p in pools]
        commands = [[p["container_spec"].get("command", []) + p["container_spec"].get("args", [])
                     ] * size for p, size in zip(pools, sizes)]
        env = {e["name"]: e["value"] for p in pools if p
               for e in p["container_spec"].get("env", [])}
        env.update(aip_env(spec.get("base_output_directory", {}).get("output_uri_prefix", "")))
        restart_all = bool(spec.get("scheduling", {}).get("restart_job_on_worker_restart"))
        record.replicas = sum(sizes)

        def environments():
            ports = [[gcs_api.free_port() for _ in range(size)] for size in sizes]
            return [[{**env, **cluster_env(sizes, p, i, job, ports)} for i in range(size)]
                    for p, size in enumerate(sizes)]

        self._run_replicas(record, commands, environments, restart_all,
                           images=[p["container_spec"]["image_uri"] if p else "" for p in pools])

    def _tuning_job(self, record: TaskRecord, args: list[str]) -> None:
        """Runs a hyperparameter tuning job as Vertex would: each trial is a process of the
        trial pool's container with the trial's `--name=value` arguments appended and the
        `AIP_*` folders of `<base>/<trial id>`; the metric it reports through hypertune
        becomes its final measurement. Values are drawn at random (seeded) from the study
        spec (Vertex's own search is not reproduced), one trial at a time."""
        import random

        from google.cloud import aiplatform_v1
        from google_cloud_pipeline_components.container.v1.gcp_launcher.utils import json_util

        payload = _flag(args, "--payload")
        try:
            request = json_util.recursive_remove_empty(json.loads(payload, strict=False))
            job = aiplatform_v1.HyperparameterTuningJob(request)
        except (json.JSONDecodeError, KeyError, ValueError, TypeError) as err:
            raise RehearsalError(f"{record.name}: Vertex would reject the tuning job: "
                                 f"{type(err).__name__}: {err}") from err
        self._write_request(record, "HyperparameterTuningJob", request)
        spec = job.trial_job_spec
        if len(spec.worker_pool_specs) != 1 or spec.worker_pool_specs[0].replica_count != 1:
            raise RehearsalError(f"{record.name}: trials run one pool of one replica here")
        base = spec.base_output_directory.output_uri_prefix.rstrip("/")
        if not base.startswith("gs://"):
            raise RehearsalError(f"{record.name}: the tuning job has no gs:// base output "
                                 "directory; trials would get no AIP_MODEL_DIR")
        pool = spec.worker_pool_specs[0].container_spec
        metric = job.study_spec.metrics[0]
        maximize = metric.goal.name == "MAXIMIZE"
        draw = random.Random(job.display_name)
        trials = []
        for number in range(1, job.max_trial_count + 1):
            trial_id = str(number)
            values = {p.parameter_id: _draw(p, draw) for p in job.study_spec.parameters}
            reports = self.local(f"{base}/{trial_id}/hypertune.metrics")
            # Inside the image, the metric file is where Vertex puts it, written as the
            # image's user; in-process, a file of the rehearsal's.
            metric_file = VERTEX_METRIC_FILE if self.containers else self.step_path(
                f"{base}/{trial_id}/hypertune.metrics")
            env = {**aip_env(f"{base}/{trial_id}"), "CLOUD_ML_TRIAL_ID": trial_id,
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
                if len([t for t in trials if t.state.name != "SUCCEEDED"]) + 1 > max(
                        job.max_failed_trial_count, 1):
                    raise
            if self.containers:
                os.makedirs(os.path.dirname(reports), exist_ok=True)
                with open(reports, "w") as f:
                    f.write(self.containers.take_file(pool.image_uri, VERTEX_METRIC_FILE))
            measured = [float(r[metric.metric_id]) for r in _read_reports(reports)
                        if metric.metric_id in r]
            if trial.state.name == "SUCCEEDED" and measured:
                trial.final_measurement = aiplatform_v1.Measurement(metrics=[
                    aiplatform_v1.Measurement.Metric(
                        metric_id=metric.metric_id,
                        value=(max if maximize else min)(measured))])
            trials.append(trial)
            print(f"[rehearse] {record.display_name}: trial {trial_id} {values} -> "
                  f"{metric.metric_id} {measured[-1:] or 'none reported'}")
        job_id = int(hashlib.sha1(f"{self.job_uuid}/{record.name}".encode()).hexdigest()[:9], 16)
        job.name = (f"projects/{PROJECT_NUMBER}/locations/{LOCATION}/hyperparameterTuningJobs/"
                    f"{job_id}")
        job.trials = trials
        job.state = "JOB_STATE_SUCCEEDED"
        self.tuning_jobs[job.name] = job
        record.replicas = len(trials)
        resources = self.host_path(_flag(args, "--gcp_resources"))
        os.makedirs(os.path.dirname(resources), exist_ok=True)
        with open(resources, "w") as f:
            json.dump({"resources": [{
                "resourceType": "HyperparameterTuningJob",
                "resourceUri": f"https://{LOCATION}-aiplatform.googleapis.com/v1/{job.name}"}]}, f)

    def _best_trial(self, record: TaskRecord, kind: str, executor_input) -> dict[str, Any]:
        """Runs the best-trial step's selection on the rehearsed tuning job (the step
        itself would read it from the Vertex API)."""
        from components.tune.contract import TUNABLE
        from components.tune.selection import choose

        values = executor_input["inputs"]["parameterValues"]
        artifact = executor_input["outputs"]["artifacts"]["trials"]["artifacts"][0]
        trials = ArtifactRef(name=artifact["name"], uri=artifact["uri"],
                             schema_title=artifact["type"]["schemaTitle"], metadata={},
                             path=self.local(artifact["uri"]))
        best = choose(kind, values["gcp_resources"], {k: values[k] for k in TUNABLE[kind]},
                      trials, fetch=self.tuning_jobs.__getitem__)
        record.state = "succeeded"
        record.note = ("GetHyperparameterTuningJob calls the Vertex API; the rehearsed job "
                       f"was read instead: best values {best}")
        print(f"[rehearse] {record.display_name}: {record.note}")
        return {"parameters": best, "artifacts": {"trials": trials}}

    def _vertex_api_call(self, record: TaskRecord, args: list[str],
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
        self._write_request(record, kind, request)
        record.state = "not-executed"
        record.note = f"{kind} calls the Vertex API; the request was checked and written"
        print(f"[rehearse] {record.display_name}: {record.note}")

    def _registry_lookup(self, record: TaskRecord, executor_input) -> dict[str, Any]:
        """Answers the Model Registry lookup from `self.registry` (display name -> model
        resource name) and writes down the ListModels request it stands for."""
        values = executor_input["inputs"]["parameterValues"]
        name = values["display_name"]
        found = self.registry.get(name)
        self._write_request(record, "ListModels", {
            "parent": f"projects/{values['project']}/locations/{values['location']}",
            "filter": f'display_name="{name}"'})
        record.state = "not-executed"
        record.note = (f"ListModels calls the Vertex API; answered {found or 'none'} from the "
                       "rehearsal's registry")
        print(f"[rehearse] {record.display_name}: {record.note}")
        artifact = executor_input["outputs"]["artifacts"]["parent"]["artifacts"][0]
        parent = ArtifactRef(name=artifact["name"], uri=artifact["uri"],
                             schema_title=artifact["type"]["schemaTitle"],
                             metadata={"resourceName": found} if found else {},
                             path=self.local(artifact["uri"]))
        return {"parameters": {"exists": found is not None}, "artifacts": {"parent": parent}}

    def _write_request(self, record: TaskRecord, kind: str, request: dict[str, Any]) -> None:
        """Keeps what would be sent to Vertex in `vertex-requests/<task>.json`, to read."""
        folder = os.path.join(self.output, "vertex-requests")
        os.makedirs(folder, exist_ok=True)
        write_json_atomically(os.path.join(folder, record.name.replace("/", "-") + ".json"),
                              {"type": kind, "request": request}, sort_keys=False)

    def _run_replicas(self, record: TaskRecord, commands: list[list[list[str]]],
                      environments, restart_all: bool, images: list[str]) -> None:
        """Runs every replica as a process; applies a pending preemption; fails on errors.

        With `runtime="image"` each replica runs in its pool's image (`images`), as the
        image's user, with the rehearsal's gcs/ folder at /gcs; else here, in this venv.
        """
        logs = os.path.join(self.output, "logs", record.name.replace("/", "-"))
        os.makedirs(logs, exist_ok=True)
        base = {**os.environ,
                "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                "PYTHONPATH": os.pathsep.join(
                    [SITE_DIR, os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "")
                                               .split(os.pathsep) if p]),
                MOUNT_ENV: self.gcs, "PYTHONUNBUFFERED": "1"}
        rule = next((p for p in self.preempt if not p.done and p.task in
                     (record.name, record.display_name)), None)
        if self.containers:
            open_mount(self.gcs)

        def start(pool: int, index: int, attempt: int, envs) -> subprocess.Popen:
            log_path = os.path.join(logs, f"workerpool{pool}-{index}.attempt{attempt}.log")
            command, env = commands[pool][index], {**base, **envs[pool][index]}
            if self.containers:
                command = self.containers.run_command(images[pool], command, self.gcs,
                                                      envs[pool][index])
                env = dict(os.environ)
            return subprocess.Popen(command, env=env,
                                    stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)  # in the caller's folder

        envs = environments() if callable(environments) else environments
        attempt = 1
        procs = {(p, i): start(p, i, attempt, envs)
                 for p in range(len(commands)) for i in range(len(commands[p]))}
        record.attempts = 1
        while any(proc.poll() is None for proc in procs.values()):
            if rule and not rule.done and glob.glob(os.path.join(self.gcs, rule.pattern),
                                                    recursive=True):
                rule.done = True
                victims = list(procs) if restart_all else [(0, 0)]
                print(f"[rehearse] {record.display_name}: preempting "
                      f"{'the whole job' if restart_all else 'workerpool0 replica 0'} "
                      f"({rule.pattern} exists), then restarting")
                for key in victims:
                    _kill(procs[key])
                attempt += 1
                record.attempts = attempt
                if restart_all:
                    envs = environments() if callable(environments) else environments
                for key in victims:
                    procs[key] = start(*key, attempt, envs)
            time.sleep(0.2)
        failed = {key: proc.returncode for key, proc in procs.items() if proc.returncode}
        if failed:
            (pool, index), code = next(iter(failed.items()))
            log_path = os.path.join(logs, f"workerpool{pool}-{index}.attempt{attempt}.log")
            with open(log_path) as f:
                tail = f.read()[-3000:]
            record.state = "failed"
            raise RehearsalError(f"{record.display_name}: workerpool{pool} replica {index} "
                                 f"exited with {code}; log {log_path}:\n{tail}")

    def _collect(self, component, executor_input) -> dict[str, Any]:
        """Reads what the task wrote (executor_output.json, output files)."""
        path = self.host_path(executor_input["outputs"]["outputFile"])
        written = {}
        if os.path.exists(path):
            with open(path) as f:
                written = json.load(f)
        artifacts = {}
        for key, entry in executor_input["outputs"]["artifacts"].items():
            artifact = entry["artifacts"][0]
            updated = (written.get("artifacts", {}).get(key, {}).get("artifacts") or [{}])[0]
            artifacts[key] = ArtifactRef(
                name=artifact["name"], uri=updated.get("uri", artifact["uri"]),
                schema_title=artifact["type"]["schemaTitle"],
                metadata=updated.get("metadata", {}), path=self.local(
                    updated.get("uri", artifact["uri"])))
        parameters = dict(written.get("parameterValues", {}))
        definitions = component.get("outputDefinitions", {}).get("parameters", {})
        for key, entry in executor_input["outputs"]["parameters"].items():
            output_file = self.host_path(entry["outputFile"])
            if key not in parameters and os.path.exists(output_file):
                with open(output_file) as f:
                    raw = f.read()
                kind = definitions.get(key, {}).get("parameterType", "STRING")
                parameters[key] = raw if kind == "STRING" else json.loads(raw)
        return {"parameters": parameters, "artifacts": artifacts}


@dataclasses.dataclass
class ArtifactRef:
    """An artifact as the rehearsal passes it on: its gs:// URI and the local folder."""

    name: str
    uri: str
    schema_title: str
    metadata: dict[str, Any]
    path: str


def _structured(item: str) -> dict | None:
    if not item.startswith("{\""):
        return None
    try:
        value = json.loads(item)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and set(value) & {"Concat", "IfPresent"} else None


def _draw(parameter, rng) -> Any:
    """A random value of one study-spec parameter (as Vertex passes it: numbers as floats)."""
    import math

    if parameter.double_value_spec:
        low, high = parameter.double_value_spec.min_value, parameter.double_value_spec.max_value
        if parameter.scale_type.name == "UNIT_LOG_SCALE":
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        return rng.uniform(low, high)
    if parameter.integer_value_spec:
        spec = parameter.integer_value_spec
        return float(rng.randint(spec.min_value, spec.max_value))
    if parameter.discrete_value_spec:
        return float(rng.choice(list(parameter.discrete_value_spec.values)))
    return rng.choice(list(parameter.categorical_value_spec.values))


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


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


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


def rehearse(path: str, output: str, params: Mapping[str, str] | None = None,
             **options: Any) -> dict[str, Any]:
    """Rehearses the compiled pipeline at `path`; writes and returns `output/summary.json`.

    Args:
        path: Compiled pipeline JSON (or YAML) as `compile.py` wrote it.
        output: Local folder of the rehearsal (gcs/, logs/, summary.json).
        params: Pipeline parameters as strings, typed by the pipeline's definitions.
        **options: `pipeline_root`, `cache_index`, `preempt`, `runtime`, `registry` (see
            `Rehearsal`).

    Returns:
        The summary: the pipeline's own (as `run_local` writes it) plus `rehearsal`.
    """
    with open(path) as f:
        spec = json.load(f) if path.endswith(".json") else _yaml(f)
    runner = Rehearsal(spec, output, params or {}, **options)
    try:
        outputs = runner.run()
    finally:
        report = [dataclasses.asdict(r) for r in runner.records]
        os.makedirs(runner.output, exist_ok=True)
        write_json_atomically(os.path.join(runner.output, "rehearsal.json"), report,
                              sort_keys=False)
    summarize = SUMMARIES_BY_NAME.get(spec["pipelineInfo"]["name"])
    summary = summarize(outputs) if summarize else {
        "outputs": {k: getattr(v, "path", v) for k, v in outputs.items()}}
    if "registration" in summary:
        request_built = any(r.state == "not-executed" and "register-model" in r.name
                            for r in runner.records)
        summary["registration"].update(
            uploaded=False,
            note="rehearsal: the Model Registry request was built and checked, not sent"
            if request_built else "rehearsal: no upload task ran (not compiled in, or gated off)")
    summary["rehearsal"] = {"pipeline": path, "job_name": runner.job_name,
                            "pipeline_root": runner.pipeline_root, "gcs_folder": runner.gcs,
                            "tasks": report}
    write_json_atomically(os.path.join(runner.output, "summary.json"), summary, sort_keys=False)
    return summary


def _yaml(f) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.rehearse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", help="compiled pipeline JSON")
    p.add_argument("--output", required=True, help="local folder of the rehearsal")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--pipeline-root", default="gs://rehearsal-bucket/pipeline-root")
    p.add_argument("--cache-index", help="JSON file of cache entries kept across rehearsals")
    p.add_argument("--preempt", action="append", default=[], metavar="TASK=GLOB",
                   help="kill TASK's first replica once GLOB matches under OUTPUT/gcs/")
    p.add_argument("--runtime", choices=RUNTIMES, default="local",
                   help="local: steps run in this venv; image: each step runs in the image "
                        "the JSON names, built here by `make images-local` (data must be "
                        "under OUTPUT/gcs/ and passed as gs:// URIs)")
    p.add_argument("--registered-model", action="append", default=[],
                   metavar="DISPLAY_NAME=RESOURCE_NAME",
                   help="a model the stand-in Model Registry holds (the upload then adds a "
                        "version to it); none by default")
    args = p.parse_args(argv)
    def pairs(items: list[str], flag: str, form: str) -> list[tuple[str, str]]:
        found = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                p.error(f"{flag} takes {form}, got {item!r}")
            found.append((key, value))
        return found

    params = dict(pairs(args.param, "--param", "NAME=VALUE"))
    preempt = [Preemption(task, pattern)
               for task, pattern in pairs(args.preempt, "--preempt", "TASK=GLOB")]
    registry = dict(pairs(args.registered_model, "--registered-model",
                          "DISPLAY_NAME=RESOURCE_NAME"))
    try:
        summary = rehearse(args.pipeline, args.output, params, pipeline_root=args.pipeline_root,
                           cache_index=args.cache_index, preempt=preempt,
                           runtime=args.runtime, registry=registry)
    except RehearsalError as err:
        print(f"rehearsal failed: {err}", file=sys.stderr)
        return 1
    for task in summary["rehearsal"]["tasks"]:
        print(f"  {task['display_name']:<28} {task['state']:<13} cache {task['cache']:<8} "
              f"replicas {task['replicas']} attempts {task['attempts']} "
              f"{task['seconds']:.1f}s {task['note']}")
    print(f"summary: {os.path.join(os.path.abspath(args.output), 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
