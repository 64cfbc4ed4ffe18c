"""A GPU step checks, before it trains, that it sees the GPUs its machine was given (the
compiled job names the count): the frameworks fall back to the CPU silently, at GPU prices.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

# How many GPUs the machine of this step has; unset (local runs, CPU machines): no check.
EXPECTED_GPUS_VARIABLE = "EXPECTED_GPU_COUNT"
# The NVIDIA kernel driver's version, where the driver is loaded (Linux).
_DRIVER_FILE = "/proc/driver/nvidia/version"


class GpuMismatchError(RuntimeError):
    """The step sees fewer GPUs than its machine was given."""


def expected_gpus(environ: Mapping[str, str] | None = None) -> int:
    """The GPU count the compiled job gave this step; 0 when it gave none.

    Raises:
        GpuMismatchError: The variable is set but not a whole number.
    """
    raw = (os.environ if environ is None else environ).get(EXPECTED_GPUS_VARIABLE, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise GpuMismatchError(f"{EXPECTED_GPUS_VARIABLE}={raw!r} is not a GPU count")
    return int(raw)


def driver_version(path: str = _DRIVER_FILE) -> str:
    """The loaded NVIDIA driver's version line, or "" where none is loaded."""
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ""


def check_gpus(expected: int, seen: Sequence[str], framework: str, cuda: str,
               driver: str) -> str:
    """Holds the GPUs `framework` ("TensorFlow", "PyTorch") sees to the count the machine
    was given (`expected`; 0: nothing to check), naming its CUDA build ("": none) and the
    `driver_version()`.

    Returns:
        A line for the log: the devices and versions.

    Raises:
        GpuMismatchError: Fewer GPUs seen than expected, with what to look at.
    """
    versions = f"CUDA {cuda or 'none (a CPU build)'}; driver {driver or 'not loaded'}"
    line = f"GPUs: {len(seen)} seen by {framework} ({', '.join(seen) or 'none'}); {versions}"
    if len(seen) < expected:
        raise GpuMismatchError(
            f"this step's machine has {expected} GPU(s) but {framework} sees {len(seen)} "
            f"({versions}); stopping now rather than training on the CPU at GPU prices. "
            "Look for a driver older than the image's CUDA, a GPU the image's build does not "
            "support, or (Kubernetes) a missing NVIDIA device plugin")
    return line


def require_tensorflow_gpus(environ: Mapping[str, str] | None = None) -> str:
    """`check_gpus` for TensorFlow's devices; logs and returns the line."""
    expected = expected_gpus(environ)
    if not expected:
        return ""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    names = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
             for g in gpus]
    cuda = tf.sysconfig.get_build_info().get("cuda_version", "")
    line = check_gpus(expected, names, "TensorFlow", cuda, driver_version())
    log.info(line)
    return line


def require_torch_gpus(environ: Mapping[str, str] | None = None) -> str:
    """`check_gpus` for PyTorch's devices (fastai and the transformer trainer)."""
    expected = expected_gpus(environ)
    if not expected:
        return ""
    import torch

    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    line = check_gpus(expected, names, "PyTorch", torch.version.cuda or "", driver_version())
    log.info(line)
    return line
