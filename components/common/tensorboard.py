"""TensorBoard event logs of the fastai trainers: one point per epoch for each scalar."""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

from components.common.storage import local_path, run_folder

TENSORBOARD_VARIABLE = "AIP_TENSORBOARD_LOG_DIR"


def log_folder(output_path: str, explicit: str | None = None,
               environ: Mapping[str, str] | None = None) -> str | None:
    """The local folder (gs:// through the FUSE mount) a trainer writes its TensorBoard
    logs to: `explicit` (the step's; None or "": none), else this task's sub-folder of
    `AIP_TENSORBOARD_LOG_DIR` (`storage.run_folder`), else None (never inside the output)."""
    if explicit:
        return local_path(explicit)
    return run_folder(TENSORBOARD_VARIABLE, output_path, None, environ)


def epoch_scalars(prefix: str, row: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one epoch's history row: `<prefix>/<field>` per number
    (not text, not the epoch: the step; NaN stays, so a diverged epoch shows).

    Args:
        prefix: The tags' group, e.g. "lm" or "classifier".
        row: One history row, e.g. `{"epoch": 1, "seconds": 2.5, "valid_loss": 0.7}`.
    """
    return {f"{prefix}/{name}": float(value) for name, value in row.items()
            if name != "epoch" and isinstance(value, numbers.Real)
            and not isinstance(value, bool)}


def model_step(history: list[Mapping[str, Any]], model: str | None) -> int:
    """The step of `model`'s latest epoch: its rows in the (resumable) history, since a
    stage's epoch numbers restart at 1 (None: rows that name no model, as the LM's)."""
    return sum(1 for row in history if row.get("model") == model)


class ScalarLog:
    """TensorBoard scalars, flushed as each epoch ends; does nothing without a folder.
    Callers write an epoch after its checkpoint is saved: a resumed run writes no step twice.
    """

    def __init__(self, folder: str | None):
        """Checks that the writer imports when `folder` (None: write nothing) is set."""
        self.folder, self._writer, self._writer_class = folder, None, None
        if folder is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise ImportError(f"TensorBoard logs were asked for ({folder}) but the "
                                  "'tensorboard' package is not installed") from err
            self._writer_class = SummaryWriter

    def write(self, scalars: Mapping[str, float], step: int) -> None:
        """Adds one point per scalar at `step` and flushes them to the event file."""
        if self.folder is None or not scalars:
            return
        if self._writer is None:
            # Opened at the first point: a resumed run with nothing left adds no empty file.
            os.makedirs(self.folder, exist_ok=True)
            self._writer = self._writer_class(log_dir=self.folder)
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Closes the event file (written whole on a FUSE mount once closed)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
