"""Whether a trained model goes to the Vertex Model Registry, and what is uploaded.

The upload itself is GCPC's `ModelUploadOp` (Vertex only); this module holds the
decision and the preparation, which run anywhere.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any


def gate(metrics: dict[str, Any], metric: str, threshold: float, enabled: bool = True,
         ) -> tuple[bool, str]:
    """Decides whether the model clears the bar for registration.

    Args:
        metrics: The evaluation's `metrics.json`.
        metric: Name of a top-level number in it, e.g. "accuracy" or "macro_f1".
        threshold: The model is registered when `metrics[metric] >= threshold`.
        enabled: False never registers.

    Returns:
        `(register, reason)`: the decision and a sentence saying why.

    Raises:
        ValueError: `metric` is not a finite number in `metrics` (the message lists those
            that are), or the threshold is not a finite number.
    """
    numbers = sorted(k for k, v in metrics.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)
                     and math.isfinite(v))
    if metric not in numbers:
        found = "absent" if metric not in metrics else f"{metrics[metric]!r}, not a finite number"
        raise ValueError(f"registration metric {metric!r} is {found} in the evaluation's "
                         f"metrics; choose one of {numbers}")
    if not math.isfinite(threshold):
        raise ValueError(f"registration threshold must be a finite number, got {threshold}")
    if not enabled:
        return False, "registration is switched off (register_model=false)"
    value = metrics[metric]
    # repr, not a rounded figure: 0.79996 must not read as 0.8000 < 0.8.
    if value >= threshold:
        return True, f"{metric} = {value!r} >= {threshold}: registering"
    return False, f"{metric} = {value!r} < {threshold}: not registering"


def copy_serving_model(model_dir: str, subdir: str, out_dir: str) -> None:
    """Copies the servable part of a model folder (e.g. its SavedModel) to `out_dir`.

    Whatever `out_dir` held (a retried attempt's files) is removed first: the upload
    serves exactly this model.

    Raises:
        FileNotFoundError: `model_dir/subdir` does not exist.
        ValueError: `subdir` is empty or absolute (it would copy more than the model).
    """
    if not subdir or os.path.isabs(subdir):
        raise ValueError(f"subdir must be a folder inside the model, got {subdir!r}")
    source = os.path.join(model_dir, subdir)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"{source} not found: the model folder has no {subdir!r} to serve")
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(source, out_dir)
