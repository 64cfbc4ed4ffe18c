"""Where a step's process runs: here, in this Python environment, or inside its image.

Every step's process of every rehearsal (a Vertex replica, a KFP pod's container, a
TrainJob node) is started by `start_step`, with the environment `step_env` writes out.
`--runtime local` starts each command as a process of this venv (`python3` on the PATH is
this interpreter), with KFP's mount prefixes pointed at the rehearsal's folders
(`step_site/sitecustomize.py`). `--runtime image` runs it with buildah inside the image
the JSON names, built here by `make images-local`, with those folders mounted and the
Cloud Storage API an emulator seeded with gcs/. Both show a Vertex step `gs://BUCKET/x` as
the file `OUTPUT/gcs/BUCKET/x`: here at that path, inside an image at `/gcs/BUCKET/x`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tools.rehearsal import gcs_api
from tools.rehearsal.records import RehearsalError

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_site")
ROOT = str(gcs_api.REPO)  # the repository: where steps import from
MOUNTS_ENV = "REHEARSAL_MOUNTS"  # the step's mounts as step_site/sitecustomize.py reads them
# What a step's process does not take from this one: the rehearsal's own credentials and
# cluster variables (a replica, a pod or a node has only those its job gives it), and its
# PYTHONPATH (the image's there; made afresh here).
NOT_INHERITED_PREFIXES = ("AWS_", "PET_", "AIP_")
NOT_INHERITED = ("CLUSTER_SPEC", "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                 "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "PYTHONPATH")
RUNTIMES = ("local", "image")
GCS_MOUNT = "/gcs"
BUILDAH = ("buildah", "--storage-driver", "vfs")


def without_gpus(env: Mapping[str, str]) -> dict[str, str]:
    """A job's variables with the GPU count a step holds itself to set to 0: the job's
    machines have GPUs, this one has none (the check: tests/test_gpus.py)."""
    from components.common.gpus import EXPECTED_GPUS_VARIABLE

    return {**env, EXPECTED_GPUS_VARIABLE: "0"} if EXPECTED_GPUS_VARIABLE in env else dict(env)


def open_mount(folder: str) -> None:
    """Gives every file under the stand-in for /gcs the modes of a shared FUSE mount
    (gcsfuse shows one mode, whoever wrote it): 0777 folders, 0666 files."""
    for root, _, files in os.walk(folder):
        os.chmod(root, 0o777)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666)


class ImageContainers:
    """Runs steps inside locally built images (`make images-local`) with buildah.

    One working container per image per rehearsal (vfs copies a whole image per container):
    steps of one image share its filesystem outside /gcs, unlike on Vertex. Steps run as the
    image's user, chroot-isolated on the host's network (loopback TF_CONFIG addresses work).
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.env: dict[str, str] = {}  # for every step: where the Cloud Storage API is

    def container(self, image: str) -> str:
        """The working container of `image`, made on first use."""
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

    def run_command(self, image: str, command: list[str], volumes: Mapping[str, str],
                    env: Mapping[str, str]) -> list[str]:
        """The command line that runs `command` in `image` with each local folder of
        `volumes` mounted where it names (`{OUTPUT/gcs: "/gcs"}` on Vertex)."""
        return [*BUILDAH, "run", "--isolation", "chroot",
                *[f"--volume={local}:{mount}" for local, mount in volumes.items()],
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
        """Removes the working containers (the images stay)."""
        for name in self.names.values():
            subprocess.run([*BUILDAH, "rm", name], capture_output=True)
        self.names.clear()


def containers_for(kind: str) -> ImageContainers | None:
    """The containers steps of runtime `kind` run in (None: here); refuses a kind not in
    `RUNTIMES` (RehearsalError)."""
    if kind not in RUNTIMES:
        raise RehearsalError(f"--runtime must be one of {RUNTIMES}, got {kind!r}")
    return ImageContainers() if kind == "image" else None


class Runtime:
    """Where one rehearsal's steps run (`kind`, one of `RUNTIMES`) and the paths they see
    (gcs/ and logs/ in the rehearsal's absolute folder `output`)."""

    def __init__(self, kind: str, output: str) -> None:
        self.containers = containers_for(kind)
        self.kind = kind
        self.gcs = os.path.join(output, "gcs")
        self.logs = os.path.join(output, "logs")

    def local(self, uri: str) -> str:
        """The rehearsal's file for a gs:// URI (what /gcs/ would show on Vertex)."""
        if uri.startswith("gs://"):
            return os.path.join(self.gcs, uri[len("gs://"):])
        return uri

    def step_path(self, uri: str) -> str:
        """A gs:// URI as a step sees it: `/gcs/...` inside an image, else the local file."""
        if self.kind == "image" and uri.startswith("gs://"):
            return GCS_MOUNT + "/" + uri[len("gs://"):]
        return self.local(uri)

    def host_path(self, step_path: str) -> str:
        """The local file behind a path a step was given (see `step_path`)."""
        if self.kind == "image" and step_path.startswith(GCS_MOUNT + "/"):
            return os.path.join(self.gcs, step_path[len(GCS_MOUNT) + 1:])
        return step_path

    def check_visible(self, inputs: Mapping[str, Any]) -> None:
        """Inside an image a step sees only /gcs: a local path parameter would not exist."""
        if self.kind != "image":
            return
        for name, value in inputs.items():
            if isinstance(value, str) and value and not value.startswith("gs://") and \
                    os.path.exists(value):
                raise RehearsalError(
                    f"--param {name}={value} is a local path, which a step inside the image "
                    f"cannot see: copy it under {self.gcs}/BUCKET/... and pass gs://BUCKET/...")

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Makes gcs/; inside images serves it through the API emulator, removes containers."""
        os.makedirs(self.gcs, exist_ok=True)
        if not self.containers:
            yield
            return
        # Raw inputs are read through the API, later outputs through /gcs (as on Vertex).
        api, url = gcs_api.start_emulator(self.logs)
        count = gcs_api.seed(url, self.gcs)
        self.containers.env = {"STORAGE_EMULATOR_HOST": url}
        print(f"[rehearse] Cloud Storage API: {count} files of {self.gcs} on {url}")
        try:
            yield
        finally:
            self.containers.remove_all()
            gcs_api.stop(api)

    def before_job(self) -> None:
        """Readies gcs/ for a job's processes (inside images: writable by the image's user)."""
        if self.containers:
            open_mount(self.gcs)


def step_env(variables: Mapping[str, str], mounts: Mapping[str, str],
             python_path: Sequence[str] = ()) -> dict[str, str]:
    """The environment of a step's process run here (`--runtime local`).

    This process's variables but `NOT_INHERITED*`, `PYTHONUNBUFFERED=1`, the job's
    `variables`, then what stands in for the image: `PATH` with this venv's bin/ first,
    `PYTHONPATH` (`python_path`, step_site/, the repository), `TMPDIR` the folder mounted at
    /tmp and `MOUNTS_ENV` the others (step_site/sitecustomize.py reads them).

    Args:
        variables: What its job gives it (container env, secrets' keys, CLUSTER_SPEC, ...).
        mounts: Local folder -> the path the step has it at (`/gcs`, `/s3`, `/tmp`, ...).
        python_path: Folders put first on its PYTHONPATH (tests' hooks).
    """
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith(NOT_INHERITED_PREFIXES) and k not in NOT_INHERITED}
    at = {path: local for local, path in mounts.items()}
    tmp = {"TMPDIR": at.pop("/tmp")} if "/tmp" in at else {}
    return {**kept, "PYTHONUNBUFFERED": "1", **variables, **tmp,
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": os.pathsep.join([*python_path, SITE_DIR, ROOT]),
            MOUNTS_ENV: json.dumps(at)}


def start_step(command: list[str], variables: Mapping[str, str], log_path: str,
               mounts: Mapping[str, str], containers: ImageContainers | None = None,
               image: str = "", python_path: Sequence[str] = ()) -> subprocess.Popen:
    """Starts a step's process in this process's folder, its output to `log_path`.

    Args:
        command: Its command line.
        variables, mounts, python_path: As `step_env` takes them.
        log_path: Its log file (its folder is made).
        containers: Where `--runtime image` runs it, in `image`, with `mounts` mounted;
            None: here, with `step_env`.
        image: Its image.

    Returns:
        The process, in a session of its own (`stop` ends it with what it started).
    """
    if containers:
        command, env = containers.run_command(image, command, mounts, variables), None
    else:
        env = step_env(variables, mounts, python_path)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


# Between the SIGTERM and the kill: Compute Engine's 30 s from a Spot VM's soft off to its
# power off (the API's Scheduling.skipGuestOsShutdown), Kubernetes' default
# terminationGracePeriodSeconds.
GRACE_PERIOD_S = 30.0


def stop(process: subprocess.Popen, grace: float = 0.0) -> None:
    """Ends a step's process group, then reaps it: killed at once (its pod, replica or node
    lost) or, given a grace period, sent SIGTERM and killed once the period passes (a
    preemption, a node shut down gracefully)."""
    if grace:
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    _signal_group(process, signal.SIGKILL)  # what is left of the group
    process.wait()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
