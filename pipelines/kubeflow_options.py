"""The Kubeflow target's command-line options, its settings from them and its compile notes."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from components.trainjob.launcher import Timing
from components.trainjob.spec import S3_SECRET_KEYS, secret_key_problems
from pipelines.definitions import kubeflow, tuning
from pipelines.definitions.kubeflow import GKE_SPOT_SELECTOR, GKE_SPOT_TOLERATION
from pipelines.definitions.machine import DEFAULT_MACHINES
from pipelines.images import PLACEHOLDER_REGISTRY
from pipelines.target_options import fail, refused, step_machines

# The searches the Kubeflow target's trials can run: random points drawn at compile time.
RANDOM = ("ALGORITHM_UNSPECIFIED", "RANDOM_SEARCH")
# The files written (`--yaml` or not): the pods' platform settings are YAML's second document.
FORMATS = ("yaml",)
# A runtime, a service account or a LocalQueue: a DNS subdomain.
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def add_options(parser: argparse.ArgumentParser) -> None:
    """Declares the options only `--target kubeflow` honours, in a group of their own."""
    k = parser.add_argument_group("Kubeflow target (--target kubeflow)")
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
                   help=f"the spot pool's node label with --spot (default {GKE_SPOT_SELECTOR}; "
                        "EKS: eks.amazonaws.com/capacityType=SPOT); repeatable")
    k.add_argument("--spot-toleration", action="append", default=[],
                   metavar="KEY=VALUE:EFFECT",
                   help=f"the spot pool's taint to tolerate with --spot (default "
                        f"{GKE_SPOT_TOLERATION}); repeatable")
    k.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                   help="Kubernetes secret the pods pull the images with; repeatable")
    k.add_argument("--checkpoint-root", default="", metavar="URI",
                   help="gs:// or s3:// folder for the training steps' checkpoints and "
                        "TensorBoard logs, written there directly so a retried step resumes")
    k.add_argument("--storage-secret", default="", metavar="NAME",
                   help="Kubernetes secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                        "given to every pod for s3:// data and checkpoints")
    k.add_argument("--storage-secret-keys", default="", metavar="ACCESS,SECRET",
                   help="the --storage-secret keys holding the access key id and the secret "
                        "key, if not named as those variables; KFP's own MinIO secret "
                        "mlpipeline-minio-artifact: accesskey,secretkey")
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
                   "(Kubeflow Trainer 2.2 or 2.3; docs/kubeflow.md)")
    k.add_argument("--trainjob-service-account", default="", metavar="NAME",
                   help="service account of the TrainJob's nodes (default: the launcher "
                        "step's, the run's)")
    k.add_argument("--trainjob-pending-minutes", type=float,
                   default=Timing.pending_seconds / 60, metavar="N",
                   help="minutes a TrainJob node may wait to be scheduled before the step "
                        "fails (default %(default)g)")
    k.add_argument("--kueue-queue", default="", metavar="NAME",
                   help="Kueue LocalQueue of every step pod and TrainJob "
                        "(kueue.x-k8s.io/queue-name)")
    for step in DEFAULT_MACHINES:  # described in --gpu-node-label's help
        for field in ("cpu", "memory", "shm_size"):
            k.add_argument(f"--{step}_{field}".replace("_", "-"), dest=f"{step}_{field}",
                           default="", metavar="QUANTITY", help=argparse.SUPPRESS)


def _platform_problems(args: argparse.Namespace, keys: Sequence[str]) -> list[str]:
    """What is wrong in the options naming the cluster's own objects."""
    values = vars(args)
    problems = [f"--{flag.replace('_', '-')} {values[flag]!r} is not a name (lowercase "
                "letters, digits, - and .)" for flag in (
                    "trainjob_runtime", "trainjob_service_account", "kueue_queue")
                if (values[flag] or flag == "trainjob_runtime") and not NAME.match(values[flag])]
    if len(args.kueue_queue) > 63:
        problems.append(f"--kueue-queue {args.kueue_queue!r}: a label value has at most 63 "
                        "characters")
    problems += [f"--storage-secret-keys {problem}" for problem in secret_key_problems(keys)]
    if args.storage_secret_keys and not args.storage_secret:
        problems.append("--storage-secret-keys names keys of --storage-secret: give it")
    if args.trainjob_pending_minutes <= 0:
        problems.append(f"--trainjob-pending-minutes must be > 0, got "
                        f"{args.trainjob_pending_minutes:g}")
    return problems


def settings(args: argparse.Namespace, tuned: Mapping[str, str],
             others: Mapping[str, Mapping[str, Any]]) -> kubeflow.KubeflowSettings:
    """The Kubeflow target's settings from the parsed flags, as `vertex_options.settings`."""
    values, machines = vars(args), step_machines(args)
    problems = refused(args, others)
    if args.tune_algorithm not in RANDOM:
        problems.append(f"--tune-algorithm {args.tune_algorithm}: the Kubeflow target's trials "
                        "are a random search drawn at compile time (RANDOM_SEARCH)")
    problems += kubeflow.replica_problems(machines, args.checkpoint_root, tuple(tuned.values()))
    keys = args.storage_secret_keys.split(",") if args.storage_secret_keys else S3_SECRET_KEYS
    problems += _platform_problems(args, keys)
    pods, spot = {}, {}
    for step, machine in machines.items():
        try:
            pods[step] = kubeflow.pod_resources(step, machine, *(
                values[f"{step}_{field}"] for field in ("cpu", "memory", "shm_size")))
        except ValueError as err:
            problems.append(str(err))
    label, known = ("", {}) if args.gpu_node_label == "none" else kubeflow.GPU_LABELS[
        args.gpu_node_label]
    products = dict(known)
    try:
        products.update(parse_label(item, "--gpu-product") for item in args.gpu_product)
        spot = {"spot_selectors": tuple(parse_label(item, "--spot-node-selector") for item in
                                        args.spot_node_selector or [GKE_SPOT_SELECTOR]),
                "spot_tolerations": tuple(parse_toleration(item, "--spot-toleration") for item
                                          in args.spot_toleration or [GKE_SPOT_TOLERATION])}
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
    fail(problems)
    return kubeflow.KubeflowSettings(
        pods=pods, gpu_label=label, gpu_products=products, spot=args.spot, **spot,
        image_pull_secrets=tuple(args.image_pull_secret), timeout_seconds=args.step_timeout,
        checkpoint_root=args.checkpoint_root, storage_secret=args.storage_secret,
        storage_secret_keys=tuple(keys), s3_endpoint=args.s3_endpoint,
        training_retries=args.training_retries,
        nodes={step: machine.replica_count for step, machine in machines.items()
               if machine.replica_count > 1}, trainjob_runtime=args.trainjob_runtime,
        trainjob_service_account=args.trainjob_service_account,
        trainjob_pending_seconds=round(args.trainjob_pending_minutes * 60),
        kueue_queue=args.kueue_queue)


def parse_label(text: str, option: str) -> tuple[str, str]:
    """KEY=VALUE as a node label; ValueError naming `option` otherwise."""
    key, sep, value = text.partition("=")
    if not (key and sep and value):
        raise ValueError(f"{option} {text!r} must be KEY=VALUE (a node label)")
    return key, value


def parse_toleration(text: str, option: str) -> dict[str, str]:
    """KEY=VALUE:EFFECT (operator Equal) or KEY:EFFECT (operator Exists) as a toleration."""
    head, sep, effect = text.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not head:
        raise ValueError(f"{option} {text!r} must be KEY=VALUE:EFFECT or KEY:EFFECT with EFFECT "
                         "NoSchedule, PreferNoSchedule or NoExecute")
    key, eq, value = head.partition("=")
    if eq:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def output_dir(placeholder: bool) -> str:
    """Where the files go unless `--output-dir` says."""
    return os.path.join("build", "kubeflow")


def notes(args: argparse.Namespace, placeholder: bool) -> None:
    """What the files written will lack, printed before they are compiled."""
    if placeholder:
        print(f"note: images point at the placeholder registry {PLACEHOLDER_REGISTRY}; pass "
              "--registry (and --tag) or --image for images your cluster can pull",
              file=sys.stderr)


def report(settings_: kubeflow.KubeflowSettings, tune: tuning.TuningSettings,
           tuned: Mapping[str, str], written: list[str]) -> None:
    """What each step's pod asks for, and what the tuning variants' trials run on."""
    for step, pod in settings_.pods.items():
        gpus, nodes = "", settings_.nodes.get(step, 1)
        if pod.gpu_count:
            where = (f" on {settings_.gpu_label}={settings_.gpu_products[pod.gpu_type]}"
                     if settings_.gpu_label else " on any GPU node")
            gpus = f", {pod.gpu_count} x {kubeflow.GPU_RESOURCE} ({pod.gpu_type}){where}"
        job = (f" x {nodes} nodes of a TrainJob ({settings_.trainjob_runtime}), its launcher "
               "pod without GPUs" if nodes > 1 else "")
        print(f"pod: {step}: cpu {pod.cpu}, memory {pod.memory} (/dev/shm {pod.shm}){gpus}{job}",
              file=sys.stderr)
    if tuned:
        print(f"note: the tuning pipelines run {tune.max_trials} trials, "
              f"{tune.parallel_trials} at a time, each a pod of its training step; then one "
              "more training with the best values", file=sys.stderr)
