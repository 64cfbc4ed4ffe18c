"""TensorBoard event logs of the fastai trainers: one point per epoch for each scalar.

Where the logs go (`log_folder`) and what an epoch writes (`epoch_scalars`) are plain
functions. `ScalarLog` writes with torch's `SummaryWriter`, which needs the `tensorboard`
package; it is imported only when a folder is set, so steps that log nothing never need it.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

from components.common.storage import local_path, run_folder

TENSORBOARD_VARIABLE = "AIP_TENSORBOARD_LOG_DIR"
# History fields that are not scalars to plot: the epoch is the step itself.
_NOT_SCALARS = frozenset({"epoch"})


def log_folder(output_path: str, explicit: str | None = None,
               environ: Mapping[str, str] | None = None) -> str | None:
    """The folder a trainer writes its TensorBoard logs to, or None for no logs.

    The explicit folder when there is one, else this task's sub-folder of
    `AIP_TENSORBOARD_LOG_DIR` (set by Vertex when the job has a base output directory;
    `storage.run_folder`). Unlike the image trainer there is no default inside the output:
    the text model folder and the LM assets folder hold exactly the files their readers
    expect (the pipelines' tests list them), so without either setting nothing is logged.

    Args:
        output_path: The step's output artifact path (names the task's sub-folder).
        explicit: Folder given to the step (gs:// or local); None or "" for the environment's.
        environ: Environment to read; `os.environ` (at call time) when None.

    Returns:
        A local folder path (gs:// through the FUSE mount), or None.
    """
    if explicit:
        return local_path(explicit)
    return run_folder(TENSORBOARD_VARIABLE, output_path, None, environ)


def epoch_scalars(prefix: str, row: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one epoch's history row: `<prefix>/<field>` per number.

    Text fields (the stage's name, the model) and the epoch number (the step) are left
    out; NaN stays (TensorBoard shows it), so a diverged epoch is visible.

    Args:
        prefix: The tags' group, e.g. "lm" or "classifier".
        row: One history row, e.g. `{"epoch": 1, "seconds": 2.5, "valid_loss": 0.7}`.

    Returns:
        Tag to value, in the row's order.
    """
    return {f"{prefix}/{name}": float(value) for name, value in row.items()
            if name not in _NOT_SCALARS and isinstance(value, numbers.Real)
            and not isinstance(value, bool)}


def model_step(history: list[Mapping[str, Any]], model: str) -> int:
    """The step of the latest epoch of `model`: its epochs so far, counted over all stages.

    A stage's own epoch numbers restart at 1 (the classifier's gradual unfreezing has
    several), so the step counts the model's rows in the history instead; the history is
    part of the resumable state, so a resumed run carries on from the same count.
    """
    return sum(1 for row in history if row.get("model") == model)


class ScalarLog:
    """TensorBoard scalars written as each epoch ends; does nothing without a folder.

    Each point is flushed at once, so Vertex's uploader (and a TensorBoard watching the
    folder) sees every epoch while the job runs. Callers write an epoch only after its
    checkpoint and state are saved: a resumed run never writes a step twice (a kill in
    between loses that one point rather than duplicating it).
    """

    def __init__(self, folder: str | None):
        """Checks that the writer is importable when a folder is set (fails before training).

        Args:
            folder: Local folder of the event files, or None to write nothing.
        """
        self.folder = folder
        self._writer = None
        if folder is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            except ImportError as err:
                raise ImportError(f"TensorBoard logs were asked for ({folder}) but the "
                                  "'tensorboard' package is not installed") from err

    def write(self, scalars: Mapping[str, float], step: int) -> None:
        """Adds one point per scalar at `step` and flushes them to the event file."""
        if self.folder is None or not scalars:
            return
        if self._writer is None:
            # Opened at the first point: a resumed run with nothing left adds no empty file.
            from torch.utils.tensorboard import SummaryWriter

            os.makedirs(self.folder, exist_ok=True)
            self._writer = SummaryWriter(log_dir=self.folder)
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Closes the event file (written whole on a FUSE mount once closed)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> ScalarLog:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
