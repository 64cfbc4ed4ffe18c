"""The Vertex target's command-line options, its settings from them and its compile notes;
GCPC and the Vertex SDK are imported only when a Vertex compile makes its settings."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipelines import quota
from pipelines.definitions import tuning
from pipelines.definitions.machine import DEFAULT_MACHINES
from pipelines.definitions.scheduling import scheduling_problems
from pipelines.images import PLACEHOLDER_REGISTRY, is_pinned
from pipelines.target_options import REFUSED, fail, refused, step_machines

if TYPE_CHECKING:
    from pipelines.definitions.vertex import VertexSettings

# A Vertex AI TensorBoard instance: project id or number, region, numeric instance id.
TENSORBOARD_NAME = re.compile(r"^projects/[a-z0-9][a-z0-9.:-]*/locations/[a-z]+-[a-z]+[0-9]+/"
                              r"tensorboards/[0-9]+$")
# The files written: JSON, what the Vertex console upload takes (and YAML with `--yaml`).
FORMATS = ("json",)


def add_options(parser: argparse.ArgumentParser) -> None:
    """Declares the options only `--target vertex` honours, in a group of their own."""
    v = parser.add_argument_group("Vertex target (--target vertex, the default)")
    v.add_argument("--restart-job-on-worker-restart", action="store_true")
    v.add_argument("--service-account", default="", help="service account the jobs run as")
    v.add_argument("--network", default="", help="projects/NUMBER/global/networks/NAME")
    v.add_argument("--encryption-key", default="", help="Cloud KMS key name (CMEK)")
    v.add_argument("--serving-image", default="",
                   help="prediction image of registered image models, pinned by digest or "
                        "tag (e.g. Vertex's prebuilt tf2-cpu image @sha256:...); "
                        "without it, models are evaluated but never uploaded")
    v.add_argument("--base-output-directory", default="",
                   help="gs:// folder for job outputs (makes Vertex set AIP_* directories)")
    v.add_argument("--tensorboard", default="",
                   help="Vertex AI TensorBoard the training jobs upload their per-epoch series "
                        "to, projects/PROJECT/locations/REGION/tensorboards/ID (the pipeline's "
                        "region); needs --base-output-directory and --service-account")
    v.add_argument("--tune-early-stopping", choices=tuning.STOPPING_RULES, default="none",
                   help="the tuning study stops trials unlikely to beat the best: median (a "
                        "trial below the median of the finished ones at the same point), "
                        "decay-curve (a curve fit predicts it cannot win), none (every trial "
                        "runs to the end)")
    v.add_argument("--persistent-resource", default="", metavar="FILE.json",
                   help="run GPU steps on a Vertex persistent resource's warm machines, "
                        "described as `gcloud ai persistent-resources describe ID --region R "
                        "--format json` writes it (checked against it: network, key, machines)")
    v.add_argument("--persistent-resource-steps", default="", metavar="STEP[,STEP...]",
                   help="the steps that run there (default: every step with a GPU)")
    # How each step gets its machines (`scheduling`).
    for step in DEFAULT_MACHINES:
        for field in ("scheduling_strategy", "max_wait", "reservation"):
            v.add_argument(f"--{step}_{field}".replace("_", "-"), dest=f"{step}_{field}",
                           default="", metavar=field.upper())


def tensorboard_problems(args: argparse.Namespace) -> list[str]:
    """What Vertex would reject in a custom job with `--tensorboard`, each naming the option."""
    if not args.tensorboard:
        return []
    problems = []
    if not TENSORBOARD_NAME.match(args.tensorboard):
        problems.append(f"--tensorboard {args.tensorboard!r} is not a TensorBoard resource name; "
                        "give projects/PROJECT/locations/REGION/tensorboards/NUMERIC_ID")
    # AIP_TENSORBOARD_LOG_DIR exists under a base output directory only.
    if not args.base_output_directory.startswith("gs://"):
        problems.append("--tensorboard needs --base-output-directory gs://BUCKET/DIR (a "
                        "bucket in the TensorBoard's region) for the jobs' log directory")
    if not args.service_account:
        problems.append("--tensorboard needs --service-account EMAIL (a user-managed service "
                        "account with roles/aiplatform.user and storage access)")
    return problems


def settings(args: argparse.Namespace, tuned: Mapping[str, str],
             others: Mapping[str, Mapping[str, Any]]) -> VertexSettings:
    """The Vertex target's settings from the parsed flags.

    Args:
        args: The parsed flags.
        tuned: Kinds whose tuning variant is compiled -> their trials' step (unused here).
        others: The other targets' options (`target_options.declared`), refused when set.

    Raises:
        SystemExit: Naming every option at fault.
    """
    from pipelines.definitions import vertex

    problems = refused(args, others)
    if args.tune_seed != tuning.TuningSettings.seed:  # Vertex's tuning service draws its own
        problems.append(REFUSED.format(option="tune-seed", owner="Kubeflow", target="vertex"))
    if args.serving_image and not is_pinned(args.serving_image):
        problems.append(f"--serving-image {args.serving_image!r} must carry a digest or a tag "
                        "other than latest")
    machines = step_machines(args)
    problems += [problem for step, machine in machines.items()
                 for problem in vertex.machine_problems(step, machine)
                 + scheduling_problems(step, machine, args.spot, args.step_timeout)]
    on_resource = ({s for s in args.persistent_resource_steps.split(",") if s}
                   or {step for step, m in machines.items() if m.accelerator_count > 0})
    resource_id, resource_problems = vertex.persistent_resource_problems(
        args.persistent_resource, {s: machines.get(s) for s in on_resource}, args.network,
        args.encryption_key)
    if args.persistent_resource_steps and not args.persistent_resource:
        resource_problems.append("--persistent-resource-steps needs --persistent-resource")
    fail(problems + tensorboard_problems(args) + resource_problems)
    return vertex.VertexSettings(
        machines=machines, spot=args.spot,
        restart_job_on_worker_restart=args.restart_job_on_worker_restart,
        service_account=args.service_account, network=args.network,
        encryption_spec_key_name=args.encryption_key,
        base_output_directory=args.base_output_directory, timeout=f"{args.step_timeout}s",
        serving_image=args.serving_image, tensorboard=args.tensorboard,
        persistent_resource_id=resource_id, tune_early_stopping=args.tune_early_stopping,
        persistent_resource_steps=frozenset(on_resource if resource_id else ()))


def output_dir(placeholder: bool) -> str:
    """Where the files go unless `--output-dir` says: placeholder images' apart."""
    return os.path.join("build", "local") if placeholder else "build"


def notes(args: argparse.Namespace, placeholder: bool) -> None:
    """What the files written will lack, printed before they are compiled."""
    if placeholder:
        print(f"note: images point at the placeholder registry {PLACEHOLDER_REGISTRY}, so "
              f"the files in {args.output_dir} are for local checks, not for upload; pass "
              "--registry (and --tag) to compile what Vertex runs", file=sys.stderr)
    if not args.serving_image:
        print("note: no --serving-image: the image pipeline evaluates models but does not "
              "upload them to the Model Registry", file=sys.stderr)


def report(settings_: VertexSettings, tune: tuning.TuningSettings, tuned: Mapping[str, str],
           written: list[str]) -> None:
    """The GPUs each pipeline written holds at once (for the region's quota), and what each
    tuning variant's trials cost."""
    for path in (p for p in written if p.endswith(".json")):
        with open(path) as f:
            spec = json.load(f)
        name = os.path.basename(path)[:-len(".json")]
        print(f"quota: {name} holds {quota.describe(quota.gpus_at_once(spec))} at once "
              f"({quota.quota_note(quota.quotas(spec)) or 'no GPU quota'})", file=sys.stderr)
    for kind, step in tuned.items():
        print(tuning.cost_warning(kind, tune, settings_.machines[step]), file=sys.stderr)
