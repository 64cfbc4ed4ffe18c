"""Where each step runs on Vertex: a custom job whose machines GCPC bakes into
`worker_pool_specs` at compile time (kubeflow/pipelines#10902): compile.py options."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

from google_cloud_pipeline_components.v1.custom_job import create_custom_training_job_from_component
from kfp import dsl

from pipelines.definitions.help_text import VERTEX as VERTEX_WORDS
from pipelines.definitions.machine import (
    DEFAULT_MACHINES,
    GPU_MACHINES,
    TRAINING_STEPS,
    Machine,
    boot_disk_type,
    gpu_environment,
)
from pipelines.definitions.scheduling import job_scheduling

# Steps whose code uses several replicas; in others, they would race on the outputs.
MULTI_REPLICA_STEPS = ("train_image", "train_transformer")
# Vertex custom training's machine table and N1's vCPU limits per GPU count (their docs, read
# 2026-11): a type Vertex adds later is refused until it is added here.
CPU_MACHINE_TYPES = frozenset(
    [f"e2-standard-{n}" for n in (4, 8, 16, 32)] + [f"e2-highmem-{n}" for n in (2, 4, 8, 16)]
    + [f"e2-highcpu-{n}" for n in (16, 32)]
    + [f"n2-standard-{n}" for n in (4, 8, 16, 32, 48, 64, 80)]
    + [f"n2-highmem-{n}" for n in (2, 4, 8, 16, 32, 48, 64, 80)]
    + [f"n2-highcpu-{n}" for n in (16, 32, 48, 64, 80, 96)]
    + [f"n1-standard-{n}" for n in (4, 8, 16, 32, 64, 96)]
    + [f"n1-highmem-{n}" for n in (2, 4, 8, 16, 32, 64, 96)]
    + [f"n1-highcpu-{n}" for n in (16, 32, 64, 96)]
    + [f"c2-standard-{n}" for n in (4, 8, 16, 30, 60)]
    + ["m1-ultramem-40", "m1-ultramem-80", "m1-ultramem-160", "m1-megamem-96"])
# Filled in by Vertex at run time: the project and region the pipeline runs in.
PIPELINE_LOCATION = "{{$.pipeline_google_cloud_location}}"
PIPELINE_PROJECT = "{{$.pipeline_google_cloud_project_id}}"
# Where the fastai image's server (`pipelines.serve`) listens when Vertex serves a text model.
RUNTIME_SERVING = {"subdir": ".", "port": 8080, "health_route": "/health",
                   "predict_route": "/predict"}
# GPUs attached to N1 machines: GPU count -> the most vCPUs an N1 machine may have with them.
N1_GPU_VCPUS: Mapping[str, Mapping[int, int]] = {
    "NVIDIA_TESLA_T4": {1: 48, 2: 48, 4: 96},
    "NVIDIA_TESLA_V100": {1: 12, 2: 24, 4: 48, 8: 96},
    "NVIDIA_TESLA_P100": {1: 16, 2: 32, 4: 64},
    "NVIDIA_TESLA_P4": {1: 24, 2: 48, 4: 96},
    "NVIDIA_TESLA_K80": {1: 8, 2: 16, 4: 32, 8: 64},
}


def machine_problems(step: str, machine: Machine) -> list[str]:
    """What Vertex (its machine table, its `AcceleratorType` names) or this step would
    reject in `machine`, one message per problem naming the `--<step>-...` option."""
    flag = "--" + step.replace("_", "-")
    problems = _gpu_problems(flag, machine)
    if machine.replica_count < 1:
        problems.append(f"{flag}-replica-count must be >= 1, got {machine.replica_count}")
    elif machine.replica_count > 1 and step not in MULTI_REPLICA_STEPS:
        problems.append(f"{flag}-replica-count must be 1: only {MULTI_REPLICA_STEPS} train on "
                        "several machines")
    if not 100 <= machine.boot_disk_size_gb <= 64000:
        problems.append(f"{flag}-boot-disk-size-gb must be in 100..64000, got "
                        f"{machine.boot_disk_size_gb}")
    return problems


def _gpu_problems(flag: str, machine: Machine) -> list[str]:
    from google.cloud.aiplatform_v1 import AcceleratorType

    name, gpu = machine.machine_type or "", machine.accelerator_type
    count = machine.accelerator_count
    gpus = sorted(n for n in AcceleratorType.__members__ if n.startswith("NVIDIA_"))
    if gpu and gpu not in gpus:
        return [f"{flag}-accelerator-type {gpu!r} is not a Vertex GPU type; one of {gpus}"]
    if not gpu and count != 0:
        return [f"{flag}-accelerator-count {count} needs {flag}-accelerator-type (or set the "
                "count to 0)"]
    if name in GPU_MACHINES:
        fixed, fixed_count = GPU_MACHINES[name]
        if (gpu, count) != (fixed, fixed_count):
            return [f"{flag}-machine-type {name!r} cannot carry "
                    f"{f'{count} x {gpu}' if gpu else 'no GPU'}: it comes with {fixed_count} x "
                    f"{fixed} (set {flag}-accelerator-type {fixed} {flag}-accelerator-count "
                    f"{fixed_count})"]
        return []
    if name not in CPU_MACHINE_TYPES:
        near = difflib.get_close_matches(name, sorted(CPU_MACHINE_TYPES | set(GPU_MACHINES)), 3)
        return [f"{flag}-machine-type {name!r} is not a machine type Vertex custom training "
                f"offers{f'; did you mean {near}?' if near else ' (e.g. n1-standard-8)'}"]
    if not gpu:
        return []
    if gpu not in N1_GPU_VCPUS:
        carriers = sorted(m for m, (g, _) in GPU_MACHINES.items() if g == gpu)
        return [f"{flag}-machine-type {name!r} cannot carry {gpu}: it comes on "
                f"{', '.join(carriers[:4]) or 'no machine Vertex trains on'}"]
    if not name.startswith("n1-"):
        return [f"{flag}-machine-type {name!r} cannot carry {gpu}: it needs an n1 machine"]
    limits = N1_GPU_VCPUS[gpu]
    if count not in limits:
        return [f"{flag}-accelerator-count must be one of {sorted(limits)} with {gpu}, "
                f"got {count}"]
    vcpus = int(name.rsplit("-", 1)[1])
    if vcpus > limits[count]:
        fewer = sorted(c for c, most in limits.items() if most >= vcpus)
        return [f"{flag}-machine-type {name!r} has {vcpus} vCPUs; {count} x {gpu} allows at "
                f"most {limits[count]} (use a smaller machine"
                f"{f' or {fewer[0]} GPUs' if fewer else ''})"]
    return []


def persistent_resource_problems(path: str, steps: Mapping[str, Machine | None], network: str,
                                 key: str) -> tuple[str, list[str]]:
    """The persistent resource's ID ("" without `path`), and what Vertex would reject in
    running `steps` on it: another network or CMEK key, or a worker pool no resource pool
    fits (machine, GPUs, disk type, replicas).

    Args:
        path: `--persistent-resource`: gcloud's `describe --format json` of it; empty: none.
        steps: Each step to run there (`--persistent-resource-steps`), None if unknown.
        network: `--network` of the jobs.
        key: `--encryption-key` of the jobs.
    """
    from google.cloud.aiplatform_v1 import PersistentResource, PersistentResourceServiceClient

    if not path:
        return "", []
    try:
        with open(path) as f:
            resource = PersistentResource.from_json(f.read())
    except (OSError, ValueError) as err:  # json_format.ParseError is a ValueError
        return "", [f"--persistent-resource {path!r}: not a persistent resource's JSON ({err})"]
    ids = PersistentResourceServiceClient.parse_persistent_resource_path(resource.name)
    problems = [] if ids else [f"--persistent-resource {path!r} has no resource name"]
    if resource.network != network:
        problems.append(f"--network {network or '(none)'!r} differs from the persistent "
                        f"resource's network {resource.network or '(none)'!r}: compile with "
                        "its network")
    if resource.encryption_spec.kms_key_name != key:
        problems.append(f"--encryption-key {key or '(none)'!r} differs from the persistent "
                        f"resource's key {resource.encryption_spec.kms_key_name or '(none)'!r}: "
                        "compile with its key")
    for step, machine in sorted(steps.items()):
        if machine is None:
            problems.append(f"--persistent-resource-steps: no step {step!r}; steps: "
                            f"{sorted(DEFAULT_MACHINES)}")
            continue
        flag = "--" + step.replace("_", "-")
        pools = [p for p in resource.resource_pools
                 if p.machine_spec.machine_type == machine.machine_type
                 and p.machine_spec.accelerator_type.name == (machine.accelerator_type
                                                              or "ACCELERATOR_TYPE_UNSPECIFIED")
                 and p.machine_spec.accelerator_count == (machine.accelerator_count
                                                          if machine.accelerator_type else 0)
                 and p.disk_spec.boot_disk_type in ("", boot_disk_type(machine.machine_type))]
        most = max((max(p.replica_count, p.autoscaling_spec.max_replica_count) for p in pools),
                   default=0)
        if most < machine.replica_count:
            problems.append(f"{flag}-machine-type {machine.machine_type} with "
                            f"{machine.accelerator_count} x {machine.accelerator_type or 'no GPU'}"
                            f" and {machine.replica_count} replica(s) fits no pool of the "
                            "persistent resource (same machine, GPUs and disk type, enough "
                            "replicas): change the step's machines or the resource")
    return (ids or {}).get("persistent_resource", ""), problems


@dataclasses.dataclass(frozen=True)
class VertexSettings:
    """Settings of every custom job the pipeline starts; the fields not listed are
    compile.py's Vertex options of the same names (`vertex_options`).

    Attributes:
        machines: Step name (a key of DEFAULT_MACHINES) to its machines.
        encryption_spec_key_name: `--encryption-key`, the Cloud KMS key (CMEK).
        timeout: Longest a job may run, e.g. "86400s".
        persistent_resource_id: Persistent resource the jobs of `persistent_resource_steps`
            run on; empty: GCPC's default (the run's own, if any).
    """

    machines: Mapping[str, Machine] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_MACHINES))
    spot: bool = False
    restart_job_on_worker_restart: bool = False
    service_account: str = ""
    network: str = ""
    encryption_spec_key_name: str = ""
    base_output_directory: str = ""
    timeout: str = "604800s"
    serving_image: str = ""
    tensorboard: str = ""
    persistent_resource_id: str = ""
    persistent_resource_steps: frozenset = frozenset()
    tune_early_stopping: str = "none"
    # Each step's custom-job component, made once (GCPC's wrapper takes ~0.1 s each).
    wrapped: dict = dataclasses.field(default_factory=dict, init=False, repr=False,
                                      compare=False)

    words = VERTEX_WORDS  # steps.Target

    @property
    def default_job_account(self) -> str:
        """The pipeline's `job_service_account` default: the compile-time service account."""
        return self.service_account

    def wrap(self, component: Callable, step: str, display_name: str) -> Callable:
        """`component` (never a task: kubeflow/pipelines#10418) as a custom job on `step`'s
        machines, made once per key."""
        key = (component, step, display_name)
        if key in self.wrapped:
            return self.wrapped[key]
        machine = self.machines[step]
        # Each job's own folder: one for all would mix their TensorBoard logs.
        base = self.base_output_directory.rstrip("/")
        output = (f"{base}/{dsl.PIPELINE_JOB_NAME_PLACEHOLDER}/{display_name}"
                  if self.base_output_directory else "")
        resource = self.persistent_resource_id if step in self.persistent_resource_steps else ""
        self.wrapped[key] = create_custom_training_job_from_component(
            component,
            display_name=display_name,
            machine_type=machine.machine_type,
            accelerator_type=machine.accelerator_type,
            accelerator_count=machine.accelerator_count,
            replica_count=machine.replica_count,
            boot_disk_type=boot_disk_type(machine.machine_type),
            boot_disk_size_gb=machine.boot_disk_size_gb,
            **job_scheduling(machine, self.spot),
            # all-reduce cannot go on without a lost worker: all restart from the checkpoints
            restart_job_on_worker_restart=(self.restart_job_on_worker_restart
                                           or machine.replica_count > 1),
            service_account=self.service_account,
            network=self.network,
            encryption_spec_key_name=self.encryption_spec_key_name,
            base_output_directory=output,
            tensorboard=self.tensorboard if step in TRAINING_STEPS else "",
            timeout=self.timeout,
            env=[{"name": k, "value": v} for k, v in gpu_environment(machine).items()] or None,
            # none given keeps GCPC's default, so the JSON is unchanged
            **({"persistent_resource_id": resource} if resource else {}),
        )
        return self.wrapped[key]

    def place(self, task, step: str):
        """`task` as it is: a custom job's machines are in its wrapper (`wrap`)."""
        return task

    def job(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """What every custom job of the run takes: the run's `job_service_account`."""
        return {"service_account": params["job_service_account"]}

    def preflight_inputs(self) -> dict[str, str]:
        """The TensorBoard, if any: Vertex refuses it for a job without a user-managed
        account, and `job_service_account` is a run-time parameter."""
        return {"tensorboard": self.tensorboard} if self.tensorboard else {}

    def registration(self, kind: str, image: str) -> Callable | None:
        """The Model Registry upload of `kind`'s models that clear the gate (`add` runs
        under its condition): a new version of the model of the run's `model_display_name`
        when one exists, else a new model; None for image models without `serving_image`."""
        from google_cloud_pipeline_components.v1.model import ModelUploadOp

        from components.register import vertex_upload as register
        from pipelines.definitions.steps import SERVED_BY_THE_RUNTIME, component

        by_the_runtime = kind in SERVED_BY_THE_RUNTIME
        if not (by_the_runtime or self.serving_image):
            return None
        serving_op = component(register.serving_model, image)
        find_op = component(register.find_registered_model, image)
        serving_image = image if by_the_runtime else self.serving_image
        serving = RUNTIME_SERVING if by_the_runtime else {}  # the text server's port, routes

        def add(params: Mapping[str, Any], model) -> None:
            display_name = params["model_display_name"]
            served = serving_op(model=model, serving_image=serving_image,
                                run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER, **serving,
                                ).set_display_name("serving-model")
            found = find_op(display_name=display_name, location=PIPELINE_LOCATION,
                            project=PIPELINE_PROJECT).set_display_name("find-registered-model")
            found.set_caching_options(False)  # the registry changes between runs
            upload = {"display_name": display_name, "location": PIPELINE_LOCATION,
                      "unmanaged_container_model": served.outputs["unmanaged_model"],
                      "labels": served.outputs["labels"],
                      "encryption_spec_key_name": self.encryption_spec_key_name}
            with dsl.If(found.outputs["exists"] == True, name="model-exists"):  # noqa: E712
                ModelUploadOp(parent_model=found.outputs["parent"], **upload,
                              ).set_display_name("register-model-version")
            with dsl.Else(name="new-model"):
                ModelUploadOp(**upload).set_display_name("register-model")

        return add

    def search(self, trainer: Callable, kind: str, tune, step: str, display_name: str,
               image: str) -> Callable:
        """The tuning variant's search: a Vertex tuning job over `trainer`
        (`tuning.as_tuning_job`), then the best trial's values over the training's own."""
        from components.tune.component import BEST_TRIAL
        from components.tune.contract import TUNABLE
        from pipelines.definitions import tuning
        from pipelines.definitions.steps import component

        tune_op = tuning.as_tuning_job(trainer, kind, tune, self, self.machines[step],
                                       display_name)
        best_op = component(BEST_TRIAL[kind], image)

        def search(training: dict, job: dict) -> dict:
            searched = tune_op(**training, **job).set_display_name(display_name)
            best = best_op(gcp_resources=searched.outputs["gcp_resources"],
                           **{name: training[name] for name in TUNABLE[kind]},
                           ).set_display_name("best-trial")
            return {**training, **{name: best.outputs[name] for name in TUNABLE[kind]}}

        return search
