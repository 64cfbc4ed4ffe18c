"""Vertex hyperparameter tuning of a trainer component: the tuning step and its cost.

Trials write under the step's `trials` artifact (`<trials>/<trial id>/model`), so runs never
share a folder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from components.tune.contract import SearchSpace
from components.tune.launch import STOPPING_RULES as STOPPING_RULES  # vertex_options
from pipelines.definitions.machine import Machine, boot_disk_type, gpu_environment
from pipelines.definitions.scheduling import trial_scheduling

ALGORITHMS = ("ALGORITHM_UNSPECIFIED", "GRID_SEARCH", "RANDOM_SEARCH")
TRIALS_OUTPUT = "trials"
# Vertex AI custom training, on demand, us-central1, USD per hour, as we last read the
# pricing page (2025): machines and each GPU are billed separately. Check
# https://cloud.google.com/vertex-ai/pricing before relying on them.
HOURLY_PRICE_USD = {
    "n1-standard-4": 0.2185, "n1-standard-8": 0.4370, "n1-standard-16": 0.8740,
    "n1-highmem-8": 0.5442, "n1-highcpu-16": 0.6522,
    "NVIDIA_TESLA_T4": 0.4025, "NVIDIA_TESLA_V100": 2.8520, "NVIDIA_TESLA_P100": 1.6790,
}
PRICES_READ = "2025, us-central1, on-demand list prices"


@dataclasses.dataclass(frozen=True)
class TuningSettings:
    """How the tuning variants search.

    Attributes:
        spaces: Search space per pipeline kind ("image", "text", "transformer").
        max_trials: Trials per tuning job.
        parallel_trials: Trials running at once (each on the training step's machines).
        max_failed_trials: Failed trials that fail the job; 0 lets Vertex decide.
        algorithm: ALGORITHM_UNSPECIFIED (Bayesian), GRID_SEARCH or RANDOM_SEARCH.
        seed: Seed of the points drawn at compile time where no tuning service is (Kubeflow).
    """

    spaces: Mapping[str, SearchSpace]
    max_trials: int = 12
    parallel_trials: int = 3
    max_failed_trials: int = 0
    algorithm: str = "ALGORITHM_UNSPECIFIED"
    seed: int = 0

    def problems(self) -> list[str]:
        """What Vertex would refuse in these settings, each naming the compile option."""
        problems = []
        if self.max_trials < 1:
            problems.append(f"--tune-trials must be >= 1, got {self.max_trials}")
        if not 1 <= self.parallel_trials <= max(self.max_trials, 1):
            problems.append(f"--tune-parallel-trials must be in 1..--tune-trials "
                            f"({self.max_trials}), got {self.parallel_trials}")
        if self.max_failed_trials < 0:
            problems.append(f"--tune-max-failed-trials must be >= 0, got "
                            f"{self.max_failed_trials}")
        if self.algorithm not in ALGORITHMS:
            problems.append(f"--tune-algorithm must be one of {ALGORITHMS}, got "
                            f"{self.algorithm!r}")
        if self.algorithm == "GRID_SEARCH":
            for kind, space in self.spaces.items():
                ranges = [p.name for p in space.parameters if p.type == "double"]
                if ranges:
                    problems.append(f"GRID_SEARCH cannot search the double range(s) {ranges} "
                                    f"of the {kind} space; give them discrete values")
        return problems


def study_parameters(space: SearchSpace) -> list[dict]:
    """The space as the tuning job's `study_spec.parameters` (Vertex SDK classes)."""
    from google.cloud.aiplatform import hyperparameter_tuning as hpt
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import (
        serialize_parameters,
    )

    ranges = {"double": hpt.DoubleParameterSpec, "integer": hpt.IntegerParameterSpec}
    return serialize_parameters({
        p.name: ranges[p.type](min=p.min, max=p.max, scale=p.scale) if p.type in ranges
        else hpt.DiscreteParameterSpec(values=list(p.values), scale="linear")
        for p in space.parameters})


def trial_worker_pool(image: str, kind: str, metric: str, machine: Machine,
                      spot: bool = False) -> dict:
    """The trials' one worker pool: the trainer's image and machines, one replica.

    The executor input (`{{$.json_escape[1]}}`) is resolved by the backend inside the
    launcher's argument, as in GCPC's custom-job wrapper; Vertex appends `--name=value`s.
    """
    machine_spec = {"machine_type": machine.machine_type}
    if machine.accelerator_type:
        machine_spec.update(accelerator_type=machine.accelerator_type,
                            accelerator_count=machine.accelerator_count)
    _, affinity = trial_scheduling(machine, spot)
    if affinity:
        machine_spec["reservation_affinity"] = affinity
    return {
        "machine_spec": machine_spec,
        "replica_count": 1,
        "disk_spec": {"boot_disk_type": boot_disk_type(machine.machine_type),
                      "boot_disk_size_gb": machine.boot_disk_size_gb},
        "container_spec": {
            "image_uri": image,
            "command": ["python3", "-m", "components.tune.trial"],
            "args": ["--kind", kind, "--metric", metric, "--executor_input",
                     "{{$.json_escape[1]}}"],
            **({"env": [{"name": k, "value": v} for k, v in gpu_environment(machine).items()]}
               if gpu_environment(machine) else {}),
        },
    }


def as_tuning_job(trainer: Callable, kind: str, settings: TuningSettings, vertex: Any,
                  machine: Machine, display_name: str) -> Callable:
    """A component that tunes `trainer` in a Vertex hyperparameter tuning job: the step
    `components.tune.launch` in the trainer's image; each trial runs `components.tune.trial`.

    Args:
        trainer: The (unwrapped) trainer component the trials run.
        kind: "image", "text" or "transformer" (which trial runner).
        settings: What the study searches (`spaces[kind]`, its metric), trial counts and
            algorithm.
        vertex: Job-wide settings (network, encryption key, spot, TensorBoard, stopping).
        machine: Each trial's machines (the training step's).
        display_name: Name of the tuning job in the console.

    Returns:
        A component with the trainer's inputs, the job's (GCPC's tuning component's, with
        their defaults), and outputs `gcp_resources` (the job) and `trials` (the folder
        every trial writes under).

    Raises:
        ValueError: The trainer's inputs clash with the job's.
    """
    from google_cloud_pipeline_components.v1.hyperparameter_tuning_job import serialize_metrics
    from kfp.dsl import placeholders, structures
    from kfp.dsl.container_component_class import ContainerComponent

    space = settings.spaces[kind]
    trainer_spec = trainer.component_spec
    image = trainer_spec.implementation.container.image
    scheduling, _ = trial_scheduling(machine, vertex.spot)
    job = {
        "project": "{{$.pipeline_google_cloud_project_id}}",
        "location": "{{$.pipeline_google_cloud_location}}",
        "display_name": display_name,
        "worker_pool_specs": [trial_worker_pool(image, kind, space.metric, machine,
                                                vertex.spot)],
        "study_spec_metrics": serialize_metrics({space.metric: space.goal}),
        "study_spec_parameters": study_parameters(space),
        "max_trial_count": settings.max_trials,
        "parallel_trial_count": settings.parallel_trials,
        "max_failed_trial_count": settings.max_failed_trials,
        "study_spec_algorithm": settings.algorithm,
        # The epoch that ranked best, so an overfitting trial keeps its best epoch's
        # value (the trainers keep their best weights too).
        "study_spec_measurement_selection_type": "BEST_MEASUREMENT",
        "network": vertex.network,
        "encryption_spec_key_name": vertex.encryption_spec_key_name,
        "service_account": vertex.service_account,
    }
    # What GCPC's component has no input for is written in the command line, as its payload
    # held them (`pipelines.quota` reads the trials' strategy there).
    fixed = {"study_spec_stopping": vertex.tune_early_stopping,
             "scheduling_strategy": scheduling.get("strategy", ""),
             "max_wait_duration": scheduling.get("max_wait_duration", ""),
             "tensorboard": vertex.tensorboard}
    # the trainer's inputs (their help is the pipeline's) but the one the trial runner sets
    inputs = {name: dataclasses.replace(spec, description=None)
              for name, spec in trainer_spec.inputs.items() if name != "hypertune_metric"}
    clash = sorted(set(inputs) & set(job))
    if clash:
        raise ValueError(f"trainer inputs {clash} clash with the tuning job's own inputs")
    types = {str: "String", int: "Integer", list: "List"}
    inputs.update({name: structures.InputSpec(types[type(value)], default=value, optional=True)
                   for name, value in job.items()})
    args = [part for name in job for part in (f"--{name}",
                                              placeholders.InputValuePlaceholder(name))]
    args += [f"--{name}={value}" for name, value in fixed.items()]  # "" given, never dropped
    args += ["--trials", placeholders.OutputUriPlaceholder(TRIALS_OUTPUT),
             "--gcp_resources", placeholders.OutputParameterPlaceholder("gcp_resources")]
    return ContainerComponent(structures.ComponentSpec(
        name=f"tune-{trainer_spec.name}",
        description=(f"Vertex hyperparameter tuning of {trainer_spec.name}: "
                     f"{settings.max_trials} trials, {space.goal} {space.metric}."),
        inputs=inputs,
        outputs={"gcp_resources": structures.OutputSpec("String"),
                 TRIALS_OUTPUT: structures.OutputSpec("system.Artifact@0.0.1")},
        implementation=structures.Implementation(container=structures.ContainerSpecImplementation(
            image=image, command=["python3", "-m", "components.tune.launch"], args=args))),
        pipeline_func=None)


def machine_price(machine: Machine) -> float | None:
    """USD per hour of one replica of `machine` (machine + GPUs), None if a price is unknown."""
    base = HOURLY_PRICE_USD.get(machine.machine_type)
    gpu = HOURLY_PRICE_USD.get(machine.accelerator_type) if machine.accelerator_type else 0.0
    if base is None or gpu is None:
        return None
    return base + gpu * machine.accelerator_count


def cost_warning(kind: str, settings: TuningSettings, machine: Machine) -> str:
    """What a tuning job of `kind` costs per hour of trial time, for the compile output."""
    gpus = (f" + {machine.accelerator_count} x {machine.accelerator_type}"
            if machine.accelerator_type else "")
    head = (f"warning: the {kind} tuning pipeline runs up to {settings.max_trials} trials, "
            f"{settings.parallel_trials} at a time, each on {machine.machine_type}{gpus}")
    price = machine_price(machine)
    if price is None:
        return head + "; no list price known here for those machines: check the pricing page"
    return (f"{head} at ${price:.2f}/h ({PRICES_READ}): ${price * settings.max_trials:.2f} "
            f"for every hour one trial takes (e.g. ${price * settings.max_trials / 2:.2f} at "
            f"30 minutes a trial), then one more training run with the best values")
