"""Compile the pipelines to JSON (and YAML on request) for upload to Vertex AI Pipelines,
or with `--target kubeflow` to KFP IR YAML for open-source Kubeflow Pipelines.

    python compile.py [--target vertex|kubeflow]
                      [--registry us-central1-docker.pkg.dev/PROJECT/REPO] [--tag GIT_SHA]
                      [--output-dir build] [--yaml] [--config settings.json] [machine options]
                      [--tune-trials N] [--tune-parallel-trials N] [--image-search-space FILE]

Images are `<registry>/<runtime>:<tag>` unless given whole with `--image RUNTIME=URI`.
Besides the image, text, transformer and language-model pipelines it writes their tuning
variants (`image_tuning_pipeline.json`, `text_tuning_pipeline.json`,
`transformer_tuning_pipeline.json`): a Vertex hyperparameter tuning job over the trainer,
then training with the best trial's values; the search space and trial counts are
compile-time options, and the cost per trial-hour is printed.
Machine settings are compile-time options: Vertex bakes them into each step's
`worker_pool_specs`, pipeline parameters cannot change them at run time.
`--config FILE` reads a JSON object whose keys are these options' names
(e.g. {"registry": "...", "shard_machine_type": "n1-highcpu-32"}); flags override it.

`--target kubeflow` writes the same pipelines (and tuning variants: random trials in a
ParallelFor) under build/kubeflow/ as YAML, each step a pod sized from the same machine
options (or --<step>-cpu/--<step>-memory), its GPUs on nodes labelled with their type;
Vertex-only options are refused. docs/kubeflow.md says what a cluster needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import warnings
from typing import TYPE_CHECKING

from kfp import compiler

from components.tune.contract import SearchSpaceError, read_space
from pipelines import quota
from pipelines.definitions import image, kubeflow, lm, text, transformer, tuning
from pipelines.definitions.machine import DEFAULT_MACHINES, Machine
from pipelines.definitions.scheduling import scheduling_problems
from pipelines.definitions.steps import STEPS, TUNING_JOBS
from pipelines.images import PLACEHOLDER_REGISTRY, RUNTIMES, image_uris, is_pinned

if TYPE_CHECKING:  # imported when a Vertex compile needs it: a Kubeflow one imports no GCPC
    from pipelines.definitions.vertex import VertexSettings

TARGETS = ("vertex", "kubeflow")
# Each file written, in this order: its definition, the runtime it runs in, whether it is
# the tuning variant.
PIPELINES = {
    "image_pipeline": (image, "tensorflow", False),
    "text_pipeline": (text, "fastai", False),
    "lm_pipeline": (lm, "fastai", False),
    "image_tuning_pipeline": (image, "tensorflow", True),
    "text_tuning_pipeline": (text, "fastai", True),
    "transformer_pipeline": (transformer, "fastai", False),
    "transformer_tuning_pipeline": (transformer, "fastai", True),
}
# Options only one target can honour: refused for the other when set (not dropped).
VERTEX_ONLY = ("restart_job_on_worker_restart", "service_account", "network", "encryption_key",
               "serving_image", "base_output_directory", "tensorboard",
               *(f"{step}_{field}" for step in DEFAULT_MACHINES
                 for field in ("scheduling_strategy", "max_wait", "reservation")))
KUBEFLOW_ONLY = ("gpu_node_label", "gpu_product", "spot_node_selector", "spot_toleration",
                 "image_pull_secret", "checkpoint_root", "storage_secret", "s3_endpoint",
                 "training_retries", "tune_seed", "trainjob_runtime",
                 *(f"{step}_{field}" for step in DEFAULT_MACHINES
                   for field in ("cpu", "memory", "shm_size")))
# Pipeline kinds with a tuning variant, and the machine table's step their trials run on.
TUNED_KINDS = {kind: STEPS[kind]["train"].machine for kind in TUNING_JOBS}
# A Vertex AI TensorBoard instance: project id or number, region, numeric instance id.
TENSORBOARD_NAME = re.compile(r"^projects/[a-z0-9][a-z0-9.:-]*/locations/[a-z]+-[a-z]+[0-9]+/"
                              r"tensorboards/[0-9]+$")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="JSON file of option defaults")
    p.add_argument("--target", choices=TARGETS, default="vertex",
                   help="vertex: JSON for Vertex AI Pipelines (custom jobs); kubeflow: YAML "
                        "for open-source Kubeflow Pipelines on a Kubernetes cluster with GPUs "
                        "(docs/kubeflow.md)")
    p.add_argument("--output-dir", default=None,
                   help="where the JSON is written (default: build/, or build/local/ when the "
                        "images are the placeholder registry's: those files are not for upload)")
    p.add_argument("--yaml", action="store_true", help="also write YAML (KFP's preferred format)")
    p.add_argument("--pipelines", default=",".join(PIPELINES), metavar="NAME[,NAME]",
                   help="the pipelines to write (default: all): " + ", ".join(PIPELINES))
    p.add_argument("--registry", default=PLACEHOLDER_REGISTRY,
                   help="Artifact Registry repository, REGION-docker.pkg.dev/PROJECT/REPO")
    p.add_argument("--tag", default=None,
                   help="image tag: the commit the images were built from (default: this "
                        "checkout's commit, as `make images` tags them; the package version "
                        "for the placeholder registry's local images); never 'latest'")
    p.add_argument("--image", action="append", default=[], metavar="RUNTIME=URI",
                   help=f"full image URI for a runtime ({', '.join(RUNTIMES)}); repeatable")
    g = p.add_argument_group("machines (per step: " + ", ".join(DEFAULT_MACHINES) + ")")
    for step, machine in DEFAULT_MACHINES.items():
        flag = step.replace("_", "-")
        for field in dataclasses.fields(Machine):
            g.add_argument(f"--{flag}-{field.name.replace('_', '-')}", dest=f"{step}_{field.name}",
                           type=type(getattr(machine, field.name)), metavar=field.name.upper(),
                           default=getattr(machine, field.name), help=argparse.SUPPRESS
                           if field.name == "boot_disk_size_gb" else None)
    j = p.add_argument_group("every job")
    j.add_argument("--spot", action="store_true",
                   help="run the jobs on Spot VMs (Kubeflow: on the spot node pool; a spot "
                        "node reclaimed without a graceful shutdown deletes the pod, which "
                        "Argo does not retry: retry the run, docs/kubeflow.md)")
    j.add_argument("--step-timeout", type=int, default=604800, metavar="SECONDS",
                   help="longest a step may run (a custom job's timeout, a pod's deadline)")
    j.add_argument("--restart-job-on-worker-restart", action="store_true")
    j.add_argument("--service-account", default="", help="service account the jobs run as")
    j.add_argument("--network", default="", help="projects/NUMBER/global/networks/NAME")
    j.add_argument("--encryption-key", default="", help="Cloud KMS key name (CMEK)")
    j.add_argument("--serving-image", default="",
                   help="prediction image of registered image models, pinned by digest or "
                        "tag (e.g. Vertex's prebuilt tf2-cpu image @sha256:...); "
                        "without it, models are evaluated but never uploaded")
    j.add_argument("--base-output-directory", default="",
                   help="gs:// folder for job outputs (makes Vertex set AIP_* directories)")
    j.add_argument("--tensorboard", default="",
                   help="Vertex AI TensorBoard the training jobs upload their per-epoch series "
                        "to, projects/PROJECT/locations/REGION/tensorboards/ID (the pipeline's "
                        "region); needs --base-output-directory and --service-account")
    add_kubeflow_options(p)
    add_tuning_options(p)
    return p


def add_tuning_options(parser_: argparse.ArgumentParser) -> None:
    """The tuning variants' options (their defaults are TuningSettings' own)."""
    t = parser_.add_argument_group("tuning variants (Vertex hyperparameter tuning jobs; on "
                             "Kubeflow, random trials in a ParallelFor)")
    # Their defaults are TuningSettings' own: one home for each.
    tune_defaults = tuning.TuningSettings(spaces={})
    t.add_argument("--tune-trials", type=int, default=tune_defaults.max_trials,
                   help="trials per tuning job")
    t.add_argument("--tune-parallel-trials", type=int, default=tune_defaults.parallel_trials,
                   help="trials running at once, each on the training step's machines")
    t.add_argument("--tune-max-failed-trials", type=int,
                   default=tune_defaults.max_failed_trials,
                   help="failed trials that fail the job; 0 lets Vertex decide")
    t.add_argument("--tune-algorithm", default=tune_defaults.algorithm,
                   help=f"one of {', '.join(tuning.ALGORITHMS)} (unspecified: Bayesian; "
                        "Kubeflow: random search only)")
    t.add_argument("--tune-seed", type=int, default=tune_defaults.seed,
                   help="seed of the points the Kubeflow target's trials try (drawn here)")
    for kind in TUNED_KINDS:
        t.add_argument(f"--{kind}-search-space", default="", metavar="FILE",
                       help=f"JSON search space of the {kind} trainer (default: "
                            "components/tune/contract.py DEFAULT_SPACES)")


def add_kubeflow_options(parser_: argparse.ArgumentParser) -> None:
    """The options only --target kubeflow honours (KUBEFLOW_ONLY)."""
    k = parser_.add_argument_group("Kubeflow target (--target kubeflow)")
    for step in DEFAULT_MACHINES:
        flag = step.replace("_", "-")
        k.add_argument(f"--{flag}-cpu", dest=f"{step}_cpu", default="", metavar="QUANTITY",
                       help=argparse.SUPPRESS)
        k.add_argument(f"--{flag}-memory", dest=f"{step}_memory", default="",
                       metavar="QUANTITY", help=argparse.SUPPRESS)
        k.add_argument(f"--{flag}-shm-size", dest=f"{step}_shm_size", default="",
                       metavar="QUANTITY", help=argparse.SUPPRESS)
    k.add_argument("--gpu-node-label", choices=("gfd", "gke", "none"), default="gfd",
                   help="node label that names the GPU type: gfd (NVIDIA GPU Feature "
                        "Discovery's nvidia.com/gpu.product), gke (cloud.google.com/"
                        "gke-accelerator) or none (any GPU node). Per step, "
                        "--<step>-cpu/--<step>-memory/--<step>-shm-size (Kubernetes "
                        "quantities) override what the machine type maps to")
    k.add_argument("--gpu-product", action="append", default=[], metavar="GPU=VALUE",
                   help="the label's value for a Vertex GPU name, e.g. "
                        "NVIDIA_TESLA_V100=Tesla-V100-PCIE-32GB; repeatable")
    k.add_argument("--spot-node-selector", action="append", default=[], metavar="KEY=VALUE",
                   help=f"the spot pool's node label with --spot (default "
                        f"{kubeflow.GKE_SPOT_SELECTOR}; EKS: eks.amazonaws.com/"
                        "capacityType=SPOT); repeatable")
    k.add_argument("--spot-toleration", action="append", default=[],
                   metavar="KEY=VALUE:EFFECT",
                   help=f"the spot pool's taint to tolerate with --spot (default "
                        f"{kubeflow.GKE_SPOT_TOLERATION}); repeatable")
    k.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                   help="Kubernetes secret the pods pull the images with; repeatable")
    k.add_argument("--checkpoint-root", default="", metavar="URI",
                   help="gs:// or s3:// folder for the training steps' checkpoints and "
                        "TensorBoard logs, written there directly so a retried step resumes")
    k.add_argument("--storage-secret", default="", metavar="NAME",
                   help="Kubernetes secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                        "given to every pod for s3:// data and checkpoints")
    k.add_argument("--s3-endpoint", default="", metavar="URL",
                   help="S3 API of MinIO, SeaweedFS or Ceph, e.g. KFP's own store: "
                        "http://minio-service.kubeflow:9000 (2.14, 2.15), "
                        "http://seaweedfs.kubeflow:9000 (2.16 on)")
    k.add_argument("--training-retries", type=int, default=0, metavar="N",
                   help="times a training pod whose container failed (an error, killed "
                        "for memory, a spot node's graceful shutdown) starts again, resuming "
                        "from --checkpoint-root; a pod deleted with its node (a drain, a "
                        "reclaim without graceful shutdown) is not retried by Argo: retry "
                        "the run (pipelines.submit --retry RUN_ID, or the UI). Each retry "
                        "re-bills its GPUs, and bad data fails again")
    k.add_argument("--trainjob-runtime", default=kubeflow.DEFAULT_TRAINJOB_RUNTIME,
                   metavar="NAME", help="ClusterTrainingRuntime of the TrainJob the "
                   "transformer step creates with --train-transformer-replica-count > 1 "
                   "(Kubeflow Trainer 2.3; docs/kubeflow.md)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    first, _ = p.parse_known_args(argv)
    if first.config:
        try:
            with open(first.config) as f:
                defaults = json.load(f)
        except OSError as err:
            p.error(f"--config {first.config}: {err.strerror}")
        except ValueError as err:
            p.error(f"--config {first.config} is not valid JSON: {err}")
        if not isinstance(defaults, dict):
            p.error(f"--config {first.config} must hold a JSON object of option names, e.g. "
                    '{"registry": "REGION-docker.pkg.dev/PROJECT/REPO"}')
        # Keys are the options' destinations, the long flags with underscores
        # (--shard-machine-type -> shard_machine_type); each takes the type of its default.
        own = vars(p.parse_args([]))
        del own["config"]
        unknown = sorted(set(defaults) - set(own))
        if unknown:
            p.error(f"{first.config}: unknown option(s) {unknown}")
        for key, value in defaults.items():
            default = own[key]
            wanted = str if default is None else type(default)
            # JSON true/false only for switches: {"spot": "false"} must not mean SPOT.
            if type(value) is not wanted and not (wanted is float and type(value) is int):
                p.error(f"{first.config}: {key} must be a JSON {wanted.__name__}, got "
                        f"{json.dumps(value)}")
        p.set_defaults(**defaults)
    return p.parse_args(argv)


def tensorboard_problems(args: argparse.Namespace) -> list[str]:
    """What Vertex would reject in a custom job with `--tensorboard`, each naming the option."""
    if not args.tensorboard:
        return []
    problems = []
    if not TENSORBOARD_NAME.match(args.tensorboard):
        problems.append(f"--tensorboard {args.tensorboard!r} is not a TensorBoard resource name; "
                        "give projects/PROJECT/locations/REGION/tensorboards/NUMERIC_ID")
    # Vertex uploads from the job's AIP_TENSORBOARD_LOG_DIR, which only exists under a
    # base output directory, and refuses a TensorBoard without a user-managed account.
    if not args.base_output_directory.startswith("gs://"):
        problems.append("--tensorboard needs --base-output-directory gs://BUCKET/DIR (a "
                        "bucket in the TensorBoard's region) for the jobs' log directory")
    if not args.service_account:
        problems.append("--tensorboard needs --service-account EMAIL (a user-managed service "
                        "account with roles/aiplatform.user and storage access)")
    return problems


def step_machines(args: argparse.Namespace) -> dict[str, Machine]:
    """Each step's machines from its --<step>-* options."""
    values = vars(args)
    return {step: Machine(**{f.name: values[f"{step}_{f.name}"]
                             for f in dataclasses.fields(Machine)}) for step in DEFAULT_MACHINES}


def vertex_settings(args: argparse.Namespace) -> VertexSettings:
    from pipelines.definitions.vertex import VertexSettings, machine_problems

    if args.serving_image and not is_pinned(args.serving_image):
        raise SystemExit(f"error: --serving-image {args.serving_image!r} must carry a digest "
                         "or a tag other than latest")
    machines = step_machines(args)
    problems = [problem for step, machine in machines.items()
                for problem in machine_problems(step, machine)
                + scheduling_problems(step, machine, args.spot, args.step_timeout)]
    problems += tensorboard_problems(args)
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems))
    return VertexSettings(
        machines=machines,
        spot=args.spot,
        restart_job_on_worker_restart=args.restart_job_on_worker_restart,
        service_account=args.service_account,
        network=args.network,
        encryption_spec_key_name=args.encryption_key,
        base_output_directory=args.base_output_directory,
        timeout=f"{args.step_timeout}s",
        serving_image=args.serving_image,
        tensorboard=args.tensorboard,
    )


def other_target_options(args: argparse.Namespace) -> list[str]:
    """The options set that the chosen target cannot honour, each named with its target."""
    own = vars(parser().parse_args([]))
    other, name = (VERTEX_ONLY, "Vertex") if args.target == "kubeflow" else (
        KUBEFLOW_ONLY, "Kubeflow")
    problems = [f"--{option.replace('_', '-')} is a {name} option; --target {args.target} "
                "cannot honour it (docs/kubeflow.md: what differs)"
                for option in other if getattr(args, option) != own[option]]
    if args.target == "kubeflow" and args.tune_algorithm not in (
            "ALGORITHM_UNSPECIFIED", "RANDOM_SEARCH"):
        problems.append(f"--tune-algorithm {args.tune_algorithm}: the Kubeflow target's trials "
                        "are a random search drawn at compile time (RANDOM_SEARCH)")
    return problems


def kubeflow_settings(args: argparse.Namespace) -> kubeflow.KubeflowSettings:
    """The Kubeflow target's settings; exits naming every option at fault."""
    values, machines = vars(args), step_machines(args)
    tuned = tuple(TUNED_KINDS[name[:-len("_tuning_pipeline")]]
                  for name in chosen_pipelines(args) if PIPELINES[name][2])
    problems = other_target_options(args) + kubeflow.replica_problems(
        machines, args.checkpoint_root, tuned)
    if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", args.trainjob_runtime):
        problems.append(f"--trainjob-runtime {args.trainjob_runtime!r} is not a runtime name "
                        "(lowercase letters, digits, - and .)")
    pods, spot = {}, {}
    for step, machine in machines.items():
        try:
            pods[step] = kubeflow.pod_resources(step, machine, kubeflow.PodOverrides(
                values[f"{step}_cpu"], values[f"{step}_memory"], values[f"{step}_shm_size"]))
        except ValueError as err:
            problems.append(str(err))
    label, known = ("", {}) if args.gpu_node_label == "none" else kubeflow.GPU_LABELS[
        args.gpu_node_label]
    products = dict(known)
    try:
        for item in args.gpu_product:
            gpu, value = kubeflow.parse_label(item, "--gpu-product")
            products[gpu] = value
        spot = {"spot_selectors": tuple(kubeflow.parse_label(item, "--spot-node-selector")
                                        for item in args.spot_node_selector or
                                        [kubeflow.GKE_SPOT_SELECTOR]),
                "spot_tolerations": tuple(kubeflow.parse_toleration(item, "--spot-toleration")
                                          for item in args.spot_toleration or
                                          [kubeflow.GKE_SPOT_TOLERATION])}
    except ValueError as err:
        problems.append(str(err))
    problems += [problem for step, pod in pods.items()
                 for problem in kubeflow.gpu_problems(step, machines[step], pod, label, products)]
    if not args.spot and (args.spot_node_selector or args.spot_toleration):
        problems.append("--spot-node-selector and --spot-toleration describe the spot pool "
                        "--spot runs on: add --spot, or leave them out")
    if args.training_retries < 0:
        problems.append(f"--training-retries must be >= 0, got {args.training_retries}")
    if args.step_timeout < 1:
        problems.append(f"--step-timeout must be >= 1 second, got {args.step_timeout}")
    if args.checkpoint_root and not args.checkpoint_root.startswith(("gs://", "s3://")):
        problems.append(f"--checkpoint-root {args.checkpoint_root!r} must be a gs:// or s3:// "
                        "folder: a folder in the pod dies with it")
    if args.s3_endpoint and not args.s3_endpoint.startswith(("http://", "https://")):
        problems.append(f"--s3-endpoint {args.s3_endpoint!r} must be an http(s):// URL")
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems))
    return kubeflow.KubeflowSettings(
        pods=pods, gpu_label=label, gpu_products=products, spot=args.spot, **spot,
        image_pull_secrets=tuple(args.image_pull_secret), timeout_seconds=args.step_timeout,
        checkpoint_root=args.checkpoint_root, storage_secret=args.storage_secret,
        s3_endpoint=args.s3_endpoint, training_retries=args.training_retries,
        nodes={step: machine.replica_count for step, machine in machines.items()
               if machine.replica_count > 1}, trainjob_runtime=args.trainjob_runtime)


def target_settings(args: argparse.Namespace):
    """The chosen target's settings (`--target`); exits naming the options at fault."""
    if args.target == "kubeflow":
        return kubeflow_settings(args)
    problems = other_target_options(args)
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems))
    return vertex_settings(args)


def tuning_settings(args: argparse.Namespace) -> tuning.TuningSettings:
    """The tuning variants' settings; exits naming the option or file at fault."""
    try:
        spaces = {kind: read_space(kind, getattr(args, f"{kind}_search_space") or None)
                  for kind in TUNED_KINDS}
    except (SearchSpaceError, OSError) as err:
        raise SystemExit(f"error: {err}") from err
    settings = tuning.TuningSettings(
        spaces=spaces, max_trials=args.tune_trials, parallel_trials=args.tune_parallel_trials,
        max_failed_trials=args.tune_max_failed_trials, algorithm=args.tune_algorithm,
        seed=args.tune_seed)
    problems = settings.problems()
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems))
    return settings


def chosen_pipelines(args: argparse.Namespace) -> list[str]:
    """The names --pipelines asks for, in PIPELINES' order; exits naming an unknown one."""
    names = {name.strip() for name in args.pipelines.split(",") if name.strip()}
    unknown = sorted(names - set(PIPELINES))
    if unknown or not names:
        raise SystemExit(f"error: --pipelines {args.pipelines!r}: {unknown or 'none'} is not "
                         f"among {', '.join(PIPELINES)}")
    return [name for name in PIPELINES if name in names]


def compile_all(args: argparse.Namespace) -> list[str]:
    """Compiles the pipelines --pipelines names; returns the paths written."""
    uris = image_uris(args)
    settings = target_settings(args)
    tune = tuning_settings(args)
    os.makedirs(args.output_dir, exist_ok=True)
    # Kubeflow's platform settings live in the YAML's second document: YAML only.
    extensions = ("yaml",) if args.target == "kubeflow" else (
        ("json", "yaml") if args.yaml else ("json",))
    written = []
    for name in chosen_pipelines(args):  # built only when chosen: each takes a second or two
        definition, runtime, tuned = PIPELINES[name]
        pipeline = definition.build(uris[runtime], settings, *([tune] if tuned else []))
        for ext in extensions:
            path = os.path.join(args.output_dir, f"{name}.{ext}")
            with warnings.catch_warnings():
                # kfp 2.17 prefers YAML; JSON is what the Vertex console upload takes here.
                warnings.filterwarnings("ignore", "Compiling to JSON is deprecated")
                compiler.Compiler().compile(pipeline, path)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    placeholder = args.registry == PLACEHOLDER_REGISTRY and not args.image
    if args.target == "kubeflow":
        return main_kubeflow(args, placeholder)
    if args.output_dir is None:
        args.output_dir = os.path.join("build", "local") if placeholder else "build"
    if placeholder:
        print(f"note: images point at the placeholder registry {PLACEHOLDER_REGISTRY}, so "
              f"the files in {args.output_dir} are for local checks, not for upload; pass "
              "--registry (and --tag) to compile what Vertex runs", file=sys.stderr)
    if not args.serving_image:
        print("note: no --serving-image: the image pipeline evaluates models but does not "
              "upload them to the Model Registry", file=sys.stderr)
    written = compile_all(args)
    for path in written:
        print(path)
    # What each run holds at once, for a check of the region's GPU quota before a run.
    for path in (p for p in written if p.endswith(".json")):
        with open(path) as f:
            spec = json.load(f)
        name = os.path.basename(path)[:-len(".json")]
        print(f"quota: {name} holds {quota.describe(quota.gpus_at_once(spec))} at once "
              f"({quota.quota_note(quota.quotas(spec)) or 'no GPU quota'})", file=sys.stderr)
    tune, chosen = tuning_settings(args), chosen_pipelines(args)
    for kind, step in TUNED_KINDS.items():
        if f"{kind}_tuning_pipeline" in chosen:
            print(tuning.cost_warning(kind, tune, vertex_settings(args).machines[step]),
                  file=sys.stderr)
    return 0


def main_kubeflow(args: argparse.Namespace, placeholder: bool) -> int:
    """`main` for --target kubeflow: the YAML under build/kubeflow/ and each pod's size."""
    if args.output_dir is None:
        args.output_dir = os.path.join("build", "kubeflow")
    if placeholder:
        print(f"note: images point at the placeholder registry {PLACEHOLDER_REGISTRY}; pass "
              "--registry (and --tag) or --image for images your cluster can pull",
              file=sys.stderr)
    written = compile_all(args)
    for path in written:
        print(path)
    settings = kubeflow_settings(args)
    for step, pod in settings.pods.items():
        print(f"pod: {kubeflow.describe(step, pod, settings)}", file=sys.stderr)
    tune = tuning_settings(args)
    if any(PIPELINES[name][2] for name in chosen_pipelines(args)):
        print(f"note: the tuning pipelines run {tune.max_trials} trials, "
              f"{tune.parallel_trials} at a time, each a pod of its training step; then one "
              "more training with the best values", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
