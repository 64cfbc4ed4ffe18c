"""One node of the transformer step's TrainJob, as a Kubeflow Trainer node runs it.

A node is no KFP pod: it maps Trainer's `PET_*` variables onto torchrun's, fetches the
dataset, trains through `launch.train` (checkpoints in the task's folder under
`--checkpoint-root`: a restarted node resumes), and node 0 uploads the model to `--model-uri`
and deletes the job once the launcher pod no longer runs (`watch_owner`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from components.common.storage import MOUNTED_VARIABLE, filesystem, is_remote
from components.train_transformer.contract import TransformerConfig, TransformerTrainingError
from components.trainjob import launcher
from components.trainjob.contract import NODE_RANK, processes_per_node, torchrun_environment

COMMAND = ("python", "-m", "components.train_transformer.node")
# The model folder's root, the same on every node and attempt: the run's fingerprint holds it.
MODEL_ROOT = "/tmp/trainjob-node"


def read_config(text: str) -> TransformerConfig:
    """`TransformerConfig` from a JSON object of its fields.

    Raises:
        TransformerTrainingError: Not JSON, not an object of its fields, or a refused value.
    """
    try:
        return TransformerConfig(**json.loads(text))
    except ValueError as err:
        raise TransformerTrainingError(f"--config is not JSON: {err}") from err
    except TypeError as err:  # not an object, or a field TransformerConfig has not
        raise TransformerTrainingError(f"--config must be a JSON object of TransformerConfig's "
                                       f"fields: {err}") from err


def plan(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """The node's plan from its command line and environment: the arguments, `config` a
    `TransformerConfig`, and `environment`, the variables to set before training.

    Raises:
        TransformerTrainingError: A bad `--config`.
        components.trainjob.contract.NodeEnvironmentError: Bad `PET_*` variables.
        SystemExit: A missing or unknown argument (argparse's message).
    """
    p = argparse.ArgumentParser(prog="python -m components.train_transformer.node",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset-uri", required=True, help="the preparation step's folder")
    p.add_argument("--model-uri", required=True, type=lambda uri: uri.rstrip("/"),
                   help="s3://, gs:// or local folder node 0 writes the model to")
    p.add_argument("--config", required=True, type=read_config,  # its errors are not argparse's
                   help="TransformerConfig's fields as one JSON object")
    p.add_argument("--checkpoint-root", default="", type=lambda uri: uri.rstrip("/"),
                   help="gs:// or s3:// root of the checkpoints (<root>/checkpoints) and "
                        "TensorBoard logs (<root>/tensorboard); empty: the environment's")
    p.add_argument("--tensorboard-dir", default="", help="TensorBoard folder (the step's input)")
    args = p.parse_args(list(argv))
    args.environment = environment = dict(torchrun_environment(environ))
    root = args.checkpoint_root
    if root:  # the trainers' own contract (Vertex's names), as one pod is given it
        environment.setdefault("AIP_CHECKPOINT_DIR", f"{root}/checkpoints")
        environment.setdefault("AIP_TENSORBOARD_LOG_DIR", f"{root}/tensorboard")
    if is_remote(root) or is_remote(args.model_uri):
        environment.setdefault(MOUNTED_VARIABLE, "0")  # no bucket is mounted on a node
    return args


def copy_folder(source: str, target: str) -> None:
    """Copies folder `source` over `target` (s3://, gs:// or local; one side local)."""
    if is_remote(source) and is_remote(target):
        raise ValueError(f"copy {source} to {target}: one side must be local")
    if not is_remote(target):
        shutil.rmtree(target, ignore_errors=True)
        if is_remote(source):
            fs, path = filesystem(source)
            fs.get(path.rstrip("/") + "/", target.rstrip("/") + "/", recursive=True)
        else:
            shutil.copytree(source, target)
        return
    fs, path = filesystem(target)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.put(source.rstrip("/") + "/", path.rstrip("/") + "/", recursive=True)


def local_model_dir(model_uri: str, root: str = MODEL_ROOT) -> str:
    """`root` + the URI's `<run>/<task>/model`: the same checkpoint folder on every node."""
    parts = [part for part in model_uri.rstrip("/").split("/") if part][-3:]
    return os.path.join(root, *parts)


def run(plan_: argparse.Namespace, environ: MutableMapping[str, str], scratch: str,
        model_root: str = MODEL_ROOT) -> dict[str, Any] | None:
    """Trains this node's processes (`plan_`'s variables set in `environ`, `os.environ`,
    for torch's), the dataset fetched into `scratch`, the model folder made under
    `model_root` (`local_model_dir`); node 0 uploads the model. Returns node 0's result."""
    from components.train_transformer import launch

    environ.update(plan_.environment)
    dataset = plan_.dataset_uri
    if is_remote(dataset):
        dataset = os.path.join(scratch, "dataset")
        copy_folder(plan_.dataset_uri, dataset)
    model_dir = local_model_dir(plan_.model_uri, model_root)
    os.makedirs(model_dir, exist_ok=True)
    gpus = processes_per_node(environ, _visible_gpus())
    result = launch.train(dataset, model_dir, plan_.config, environ=environ, gpus=gpus,
                          tensorboard_folder=plan_.tensorboard_dir or None)
    if result is not None:  # node 0: rank 0 wrote the model here
        copy_folder(model_dir, plan_.model_uri)
        shutil.rmtree(model_dir, ignore_errors=True)
        print(f"[node] model uploaded to {plan_.model_uri}", flush=True)
    with contextlib.suppress(OSError):  # the folders left empty (another node's: kept)
        os.removedirs(model_dir if os.path.isdir(model_dir) else os.path.dirname(model_dir))
    return result


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def watch_owner(environ: Mapping[str, str]) -> threading.Thread | None:
    """On node 0, `launcher.watch_owner` in a daemon thread; None on other nodes, without
    an owner, or where the API cannot be reached (a line says why).

    Args:
        environ: `launcher.OWNER_VARIABLES`, `KUBECONFIG` (else in-cluster), and
            `OWNER_POLL_VARIABLE`.
    """
    if environ.get(NODE_RANK) != "0" or not all(map(environ.get, launcher.OWNER_VARIABLES)):
        return None
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        if environ.get("KUBECONFIG"):
            config.load_kube_config(environ["KUBECONFIG"], client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as error:
        print(f"[node] not watching the launcher pod: {error}", flush=True)
        return None
    poll = float(environ.get(launcher.OWNER_POLL_VARIABLE) or launcher.OWNER_POLL_SECONDS)
    thread = threading.Thread(target=launcher.watch_owner, name="owner-watch", daemon=True,
                              args=(client.ApiClient(configuration), environ),
                              kwargs={"poll_seconds": poll})
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    node_plan = plan(sys.argv[1:] if argv is None else argv, os.environ)
    watch_owner(os.environ)
    with tempfile.TemporaryDirectory(prefix="trainjob-node-") as scratch:
        run(node_plan, os.environ, scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
