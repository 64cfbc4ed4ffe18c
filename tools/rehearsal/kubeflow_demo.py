"""The image and transformer pipelines compiled for Kubeflow and rehearsed end to end on
tiny data, against an S3 API (moto's server) and an MLflow server, both on loopback.

    python -m tools.datamakers.kubeflow_demo_data runs/kubeflow/data
    python -m tools.rehearsal.kubeflow_demo --data runs/kubeflow/data --output runs/kubeflow
        [--runtime local|image]

Data, encoder, pipeline root and checkpoints are on s3://; the steps' S3 credentials come
from a Kubernetes secret (`--storage-secret`); a training step is retried once. The image
pipeline's training pod is killed once its first checkpoint is in S3, and its retry
resumes from there. Both runs end with a model version in MLflow's registry (alias
`challenger`) and a KServe manifest beside the model. `make rehearse-kubeflow-images`
runs it inside the built images; tests/test_kubeflow_rehearsal.py in this venv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tools.rehearsal.gcs_api import free_port
from tools.rehearsal.kubeflow import Kill, rehearse_kubeflow
from tools.rehearsal.launcher import ObjectStore

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal"}
SECRET = "s3-credentials"
ROOT = "s3://pipelines/root"
# Small enough to run in minutes on two cores, large enough to beat the gate's baselines.
IMAGE_PARAMS = {"data_uri": "s3://datasets/pets", "image_size": "32",
                "min_shards_per_split": "2", "weights": "none", "epochs": "4",
                "fine_tune_epochs": "0", "batch_size": "16", "flip": "false",
                "registration_threshold": "0.0", "model_display_name": "pets"}
TRANSFORMER_PARAMS = {"data_uri": "s3://datasets/docstrings.csv",
                      "model_name": "s3://datasets/encoders/tiny", "epochs": "15",
                      "batch_size": "8", "learning_rate": "0.001", "max_length": "96",
                      "early_stopping_patience": "3", "registration_threshold": "0.3",
                      "model_display_name": "Docstring Packages"}
# The image training pod is lost once this is in S3: its first checkpoint's pointer.
FIRST_CHECKPOINT = "checkpoints/root/checkpoints/**/checkpoint"


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on a free loopback port: yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def mlflow_server(folder: str) -> Iterator[str]:
    """`mlflow server` on a free loopback port with a SQLite store: yields its URL. Without
    MLflow's job execution, whose 7 idle consumer processes would take half a core."""
    os.makedirs(folder, exist_ok=True)
    port = free_port()
    log_path = os.path.join(folder, "server.log")
    with open(log_path, "w+") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
             str(port), "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
             "--default-artifact-root", os.path.join(folder, "artifacts"), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        try:
            _wait_healthy(process, f"http://127.0.0.1:{port}", log_path)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=30)


def _wait_healthy(process: subprocess.Popen, url: str, log_path: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            with open(log_path) as f:
                raise RuntimeError(f"mlflow server did not start:\n{f.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:  # not listening yet
            time.sleep(0.5)


def use_store(endpoint: str, setenv: Callable[[str, str], None] = os.environ.__setitem__
              ) -> None:
    """Points this process (the launcher's side) at the S3 server at `endpoint` with its
    credentials, each variable set by `setenv` (tests pass `monkeypatch.setenv`)."""
    import fsspec

    for name, value in {**CREDENTIALS, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL_S3": endpoint}.items():
        setenv(name, value)
    fsspec.filesystem("s3").clear_instance_cache()  # s3fs caches per endpoint settings


def make_bucket(uri: str) -> None:
    """Makes the bucket of an s3:// URI unless it exists."""
    ObjectStore().check_bucket(uri, make=True)


def upload(local: str, uri: str) -> None:
    """Copies a local file or folder to an s3:// URI (its bucket made as needed)."""
    make_bucket(uri)
    ObjectStore().upload(local, uri)


def stage(folder: str) -> None:
    """Uploads the data in `folder` (`tools.datamakers.kubeflow_demo_data`) where the
    parameters name it, and makes the buckets the runs write to."""
    for name in ("pets", "docstrings.csv", "tiny"):
        if not os.path.exists(os.path.join(folder, name)):
            raise FileNotFoundError(f"{folder}/{name} is missing: write the data with "
                                    f"`python -m tools.datamakers.kubeflow_demo_data {folder}`")
    upload(os.path.join(folder, "pets"), IMAGE_PARAMS["data_uri"])
    upload(os.path.join(folder, "docstrings.csv"), TRANSFORMER_PARAMS["data_uri"])
    upload(os.path.join(folder, "tiny"), TRANSFORMER_PARAMS["model_name"])
    make_bucket("s3://checkpoints")  # where the training steps keep their checkpoints
    make_bucket(ROOT)


def compile_for(endpoint: str, build: str) -> str:
    """Compiles the Kubeflow YAML against the S3 server into `build`; returns it."""
    subprocess.run([sys.executable, "compile.py", "--target", "kubeflow", "--output-dir", build,
                    "--s3-endpoint", endpoint, "--storage-secret", SECRET,
                    "--checkpoint-root", "s3://checkpoints/root", "--training-retries", "1",
                    "--pipelines", "image_pipeline,transformer_pipeline"],
                   check=True, capture_output=True)
    return build


def rehearse_both(build: str, output: str, tracking_uri: str, runtime: str = "local",
                  image_params: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Rehearses the image pipeline (its training killed once) and the transformer one.

    Args:
        build: The folder `compile_for` wrote.
        output: Local folder of the rehearsals (image/ and transformer/ in it).
        tracking_uri: The MLflow server both runs register in.
        runtime: "local" (this venv) or "image" (every step in the built images).
        image_params: Image pipeline parameters over IMAGE_PARAMS.
    """
    runs = {"image": ({**IMAGE_PARAMS, **(image_params or {})},
                      [Kill("train-densenet121", FIRST_CHECKPOINT)]),
            "transformer": (TRANSFORMER_PARAMS, [])}
    return {kind: rehearse_kubeflow(
        os.path.join(build, f"{kind}_pipeline.yaml"), os.path.join(output, kind),
        {**params, "tracking_uri": tracking_uri}, pipeline_root=ROOT, runtime=runtime,
        secrets={SECRET: dict(CREDENTIALS)}, kill=kill) for kind, (params, kill) in runs.items()}


def main(argv: list[str] | None = None) -> int:
    """Runs `python -m tools.rehearsal.kubeflow_demo`; prints the summaries and registrations."""
    p = argparse.ArgumentParser(prog="python -m tools.rehearsal.kubeflow_demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True,
                   help="folder `python -m tools.datamakers.kubeflow_demo_data` wrote")
    p.add_argument("--output", required=True, help="local folder of the rehearsals")
    p.add_argument("--runtime", choices=("local", "image"), default="local")
    args = p.parse_args(argv)
    output = os.path.abspath(args.output)
    with s3_server() as endpoint, mlflow_server(os.path.join(output, "mlflow")) as tracking:
        use_store(endpoint)
        stage(args.data)
        build = compile_for(endpoint, os.path.join(output, "build"))
        summaries = rehearse_both(build, output, tracking, args.runtime)
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
        for kind, summary in summaries.items():
            name = (IMAGE_PARAMS if kind == "image" else TRANSFORMER_PARAMS)[
                "model_display_name"]
            version = client.get_model_version_by_alias(name, "challenger")
            print(json.dumps({"pipeline": kind, "metrics": summary.get("metrics"),
                              "registration": summary.get("registration"),
                              "mlflow": {"name": name, "version": version.version,
                                         "source": version.source},
                              "tasks": [(t["display_name"], t["state"], t["attempts"])
                                        for t in summary["rehearsal"]["tasks"]]},
                             indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
