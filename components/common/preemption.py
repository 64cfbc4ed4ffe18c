"""The preemption notice: SIGTERM (Spot, flex-start, a drained node; a kill follows ~30 s
later) sets a `Notice` flag; the training loop reads it at each step (all ranks agree:
`any_rank`), seals a checkpoint there and raises `Preempted`; the retry resumes.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

# Where the help of every trainer's `checkpoint_every_steps` lives.
EVERY_STEPS_HELP = ("Optimizer steps between mid-epoch checkpoints (0: one per epoch, as "
                    "before). A SIGTERM (Spot or flex-start preemption, a drained node) always "
                    "seals one at the next step; this one is for platforms that kill without "
                    "notice.")

# The exit status of a step stopped by SIGTERM (128 + 15, as a shell reports it).
EXIT_STATUS = 128 + signal.SIGTERM


class Preempted(SystemExit):
    """Raised once the preemption checkpoint is sealed: the step exits with `EXIT_STATUS`
    (a `SystemExit`: no `except Exception` takes it, no traceback)."""

    def __init__(self, where: str):
        super().__init__(EXIT_STATUS)
        self.where = where
        log.warning("%s", self)  # the interpreter prints no message for an exit status

    def __str__(self) -> str:
        return f"stopped by SIGTERM; a checkpoint is sealed {self.where}; a restart resumes there"


class Notice:
    """Catches SIGTERM inside its `with` (main thread only), setting `requested` (this
    process only; see `any_rank`); a second one while the checkpoint is written changes
    nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Callable | int | None = None

    def __enter__(self) -> Notice:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def any_rank(requested: bool, reduce_max: Callable[[int], int] | None) -> bool:
    """Whether any rank got the notice (`requested` is this rank's), so that every rank
    stops at the same step; `reduce_max` is the largest of an int over the ranks (None: one
    process)."""
    return bool(reduce_max(int(requested))) if reduce_max else requested


def due(step: int, every_steps: int) -> bool:
    """Whether optimizer step `step` (from 1) ends with a checkpoint (`every_steps` <= 0:
    never)."""
    return every_steps > 0 and step > 0 and step % every_steps == 0
