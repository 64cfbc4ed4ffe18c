"""The preemption notice: SIGTERM stops training at the next step and seals a checkpoint there.

Spot VMs, flex-start, maintenance events and drained Kubernetes nodes send SIGTERM, then kill
the process after a grace period (about 30 s on Vertex Spot; `terminationGracePeriodSeconds`
on Kubernetes, 30 s by default). A trainer that only checkpoints at the end of an epoch loses
up to an epoch of paid GPU time there. Inside training, every trainer holds a `Notice`: its
handler only sets a flag (no work in a signal handler), the training loop reads it at each
step boundary (all ranks agree: `any_rank`), seals a mid-epoch checkpoint to the store its
per-epoch checkpoints use, and raises `Preempted`, so the step exits non-zero and the
platform restarts or retries it; the restart resumes from that checkpoint.

`checkpoint_every_steps` (each trainer's setting, help `EVERY_STEPS_HELP`) also seals every
N optimizer steps, for platforms that kill without notice. This module imports neither
TensorFlow nor torch.
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
    """Raised once the preemption checkpoint is sealed: the step exits with `EXIT_STATUS`.

    A `SystemExit`, so no `except Exception` on the way up takes it for a failure of its
    own, and the interpreter exits with the status without a traceback.
    """

    def __init__(self, where: str):
        super().__init__(EXIT_STATUS)
        self.where = where
        log.warning("%s", self)  # the interpreter prints no message for an exit status

    def __str__(self) -> str:
        return f"stopped by SIGTERM; a checkpoint is sealed {self.where}; a restart resumes there"


class Notice:
    """Catches SIGTERM while training runs (a context manager), keeping it as a flag.

    Outside the main thread (where Python refuses signal handlers) or outside the `with`,
    SIGTERM does what it did before. A second SIGTERM while the checkpoint is written is
    only counted: the seal is what the grace period is for.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: Callable | int | None = None
        self._installed = False

    def __enter__(self) -> Notice:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc_info) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        """Whether SIGTERM arrived (this process only; see `any_rank`)."""
        return self._event.is_set()

    def request(self) -> None:
        """Sets the flag as SIGTERM does (a peer rank's notice, `any_rank`)."""
        self._event.set()


def any_rank(requested: bool, reduce_max: Callable[[int], int] | None) -> bool:
    """Whether any rank got the notice, so that every rank stops at the same step.

    Args:
        requested: This rank's flag.
        reduce_max: The largest of an int over every rank (e.g. a torch all-reduce with
            MAX); None on one process.

    Returns:
        True when one rank or more was told to stop.
    """
    return bool(reduce_max(int(requested))) if reduce_max else requested


def due(step: int, every_steps: int) -> bool:
    """Whether optimizer step `step` (counted from 1 in the run) ends with a checkpoint.

    Args:
        step: Optimizer steps done so far in the run.
        every_steps: `checkpoint_every_steps`; 0 or less never.
    """
    return every_steps > 0 and step > 0 and step % every_steps == 0
