"""Compile the pipelines for Vertex AI Pipelines (JSON; `--yaml` adds YAML) or, with
`--target kubeflow`, for open-source Kubeflow Pipelines (YAML, under build/kubeflow/).

    python compile.py [--target vertex|kubeflow]
                      [--registry us-central1-docker.pkg.dev/PROJECT/REPO] [--tag GIT_SHA]
                      [--output-dir build] [--yaml] [--config settings.json] [machine options]
                      [--tune-trials N] [--tune-parallel-trials N] [--image-search-space FILE]

Images are `<registry>/<runtime>:<tag>` unless given whole with `--image RUNTIME=URI`.
Each tuning variant (`*_tuning_pipeline`) tunes its trainer (a Vertex tuning job; on
Kubeflow, random trials in a ParallelFor), then trains with the best trial's values.
Machine settings are compile-time options baked into each step (a custom job's
`worker_pool_specs`, a pod's resources). `--config FILE` reads a JSON object of these
options' names (e.g. {"registry": "...", "shard_machine_type": "n1-highcpu-32"}); flags
override it. Each target refuses the other's options; docs/kubeflow.md: what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from kfp import compiler

from components.tune.contract import SearchSpaceError, read_space
from pipelines import kubeflow_options, vertex_options
from pipelines.definitions import image, lm, text, transformer, tuning
from pipelines.definitions.machine import DEFAULT_MACHINES
from pipelines.definitions.steps import STEPS, TUNING_JOBS
from pipelines.images import PLACEHOLDER_REGISTRY, RUNTIMES, image_uris
from pipelines.target_options import declared, fail

# Each target's options module (flags, settings, notes); neither imports GCPC at import.
TARGETS = {"vertex": vertex_options, "kubeflow": kubeflow_options}
# Each file written, in order: its definition, its runtime, whether it is a tuning variant.
PIPELINES = {
    "image_pipeline": (image, "tensorflow", False),
    "text_pipeline": (text, "fastai", False),
    "lm_pipeline": (lm, "fastai", False),
    "image_tuning_pipeline": (image, "tensorflow", True),
    "text_tuning_pipeline": (text, "fastai", True),
    "transformer_pipeline": (transformer, "fastai", False),
    "transformer_tuning_pipeline": (transformer, "fastai", True),
}
# The machine options every target honours (the others of Machine are a target's own).
MACHINE_FIELDS = ("machine_type", "accelerator_type", "accelerator_count", "replica_count",
                  "boot_disk_size_gb")


def parser() -> argparse.ArgumentParser:
    """Every option: those of every target here, then each target's own."""
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
        for field in MACHINE_FIELDS:
            g.add_argument(f"--{step}_{field}".replace("_", "-"), dest=f"{step}_{field}",
                           type=type(getattr(machine, field)), metavar=field.upper(),
                           default=getattr(machine, field),
                           help=argparse.SUPPRESS if field == "boot_disk_size_gb" else None)
    j = p.add_argument_group("every job")
    j.add_argument("--spot", action="store_true",
                   help="run the jobs on Spot VMs (Kubeflow: on the spot node pool; a spot "
                        "node reclaimed without a graceful shutdown deletes the pod, which "
                        "Argo does not retry: retry the run, docs/kubeflow.md)")
    j.add_argument("--step-timeout", type=int, default=604800, metavar="SECONDS",
                   help="longest a step may run (a custom job's timeout, a pod's deadline)")
    t = p.add_argument_group("tuning variants (Vertex hyperparameter tuning jobs; on "
                             "Kubeflow, random trials in a ParallelFor)")
    tune_defaults = tuning.TuningSettings(spaces={})  # the options' defaults are its own
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
    for kind in TUNING_JOBS:
        t.add_argument(f"--{kind}-search-space", default="", metavar="FILE",
                       help=f"JSON search space of the {kind} trainer (default: "
                            "components/tune/contract.py DEFAULT_SPACES)")
    for target in TARGETS.values():
        target.add_options(p)
    return p


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
        # Keys are the options' destinations (shard_machine_type), typed as their defaults.
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


def tuning_settings(args: argparse.Namespace) -> tuning.TuningSettings:
    """The tuning variants' settings; exits naming the option or file at fault."""
    try:
        spaces = {kind: read_space(kind, getattr(args, f"{kind}_search_space") or None)
                  for kind in TUNING_JOBS}
    except (SearchSpaceError, OSError) as err:
        raise SystemExit(f"error: {err}") from err
    settings = tuning.TuningSettings(
        spaces=spaces, max_trials=args.tune_trials, parallel_trials=args.tune_parallel_trials,
        max_failed_trials=args.tune_max_failed_trials, algorithm=args.tune_algorithm,
        seed=args.tune_seed)
    fail(settings.problems())
    return settings


def chosen_pipelines(args: argparse.Namespace) -> list[str]:
    """The names --pipelines asks for, in PIPELINES' order; exits naming an unknown one."""
    names = {name.strip() for name in args.pipelines.split(",") if name.strip()}
    unknown = sorted(names - set(PIPELINES))
    if unknown or not names:
        raise SystemExit(f"error: --pipelines {args.pipelines!r}: {unknown or 'none'} is not "
                         f"among {', '.join(PIPELINES)}")
    return [name for name in PIPELINES if name in names]


def tuned_kinds(args: argparse.Namespace) -> dict[str, str]:
    """The kinds whose tuning variant --pipelines asks for -> the step their trials run on."""
    chosen = chosen_pipelines(args)
    return {kind: STEPS[kind]["train"].machine for kind in TUNING_JOBS
            if f"{kind}_tuning_pipeline" in chosen}


def target_settings(args: argparse.Namespace):
    """The chosen target's settings; exits naming the options at fault."""
    others = {name: declared(target.add_options) for name, target in TARGETS.items()
              if name != args.target}
    return TARGETS[args.target].settings(args, tuned_kinds(args), others)


def compile_all(args: argparse.Namespace, uris: dict[str, str], settings,
                tune: tuning.TuningSettings) -> list[str]:
    """Compiles the pipelines --pipelines names; returns the paths written."""
    os.makedirs(args.output_dir, exist_ok=True)
    # --yaml adds YAML to the target's own formats (a Kubeflow compile writes it alone)
    formats = dict.fromkeys(TARGETS[args.target].FORMATS + (("yaml",) if args.yaml else ()))
    written = []
    for name in chosen_pipelines(args):  # built only when chosen: each takes a second or two
        definition, runtime, tuned = PIPELINES[name]
        pipeline = definition.build(uris[runtime], settings, *([tune] if tuned else []))
        for ext in formats:
            path = os.path.join(args.output_dir, f"{name}.{ext}")
            with warnings.catch_warnings():
                # kfp 2.17 prefers YAML; JSON is what the Vertex console upload takes here.
                warnings.filterwarnings("ignore", "Compiling to JSON is deprecated")
                compiler.Compiler().compile(pipeline, path)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Compiles what the flags ask for with the chosen target; returns the exit status."""
    args = parse_args(argv)
    target = TARGETS[args.target]
    placeholder = args.registry == PLACEHOLDER_REGISTRY and not args.image
    if args.output_dir is None:
        args.output_dir = target.output_dir(placeholder)
    target.notes(args, placeholder)
    uris, settings, tune = image_uris(args), target_settings(args), tuning_settings(args)
    written = compile_all(args, uris, settings, tune)
    for path in written:
        print(path)
    target.report(settings, tune, tuned_kinds(args), written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
