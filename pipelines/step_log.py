"""What a person reads while a pipeline runs locally: one line per step (and the epoch a
long step is at), the logs in files, in place of kfp.local's every executor log line."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

# kfp.local's own log lines (kfp/local/pipeline_orchestrator.py, task_dispatcher.py).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r" - INFO - Executing task '(?P<task>[^']+)'")
_FINISHED = re.compile(r" - (INFO|ERROR) - Task '(?P<task>[^']+)' finished with status "
                       r"(?P<status>\w+)")
# Keras prints "Epoch 3/8"; fastai's progress table rows start with the epoch number.
_EPOCH = re.compile(r"^\s*(?:Epoch (?P<keras>\d+/\d+)|(?P<fastai>\d+)\s+\d+\.\d+\s)")


class StepFailed(RuntimeError):
    """A step of a local run failed; the message is its own error, not kfp's."""

    def __init__(self, task: str, reason: str, log_path: str):
        super().__init__(f"step {task!r} failed: {reason}")
        self.task, self.reason, self.log_path = task, reason, log_path


def last_error(lines: list[str]) -> str:
    """The exception a step's log `lines` end with (`Type: message`), or its last line."""
    starts = [i for i, line in enumerate(lines) if line.strip() == "Traceback (most recent call "
              "last):"]
    if starts:
        header = lines[starts[-1]]
        indent = len(header) - len(header.lstrip())
        # After the frames (indented deeper than the header) comes the exception itself.
        for line in lines[starts[-1] + 1:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                return line.strip()
    rest = [line.strip() for line in lines if line.strip()]
    return rest[-1] if rest else "no output"


class StepLog(io.TextIOBase):
    """A text stream that files a local run's output by step and reports each step once.

    Args:
        folder: Where `run.log` and one `<step>.log` per step are written.
        terminal: Where the one-line-per-step report goes.
        clock: Seconds, for the steps' times.
    """

    def __init__(self, folder: str, terminal: TextIO,
                 clock: Callable[[], float] = time.monotonic):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.terminal, self.clock = folder, terminal, clock
        self.interactive = terminal.isatty()
        self.run_log = open(os.path.join(folder, "run.log"), "w")
        self.task: str | None = None
        self.task_log: TextIO | None = None
        self.task_lines: list[str] = []
        self.seen: set[str] = set()  # a step that runs again (a loop) appends to its log
        self.started = 0.0
        self.failed: StepFailed | None = None
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.run_log.write(text)
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        for stream in (self.run_log, self.task_log):
            if stream and not stream.closed:
                stream.flush()

    def close(self) -> None:
        if self._partial:
            self._line(_ANSI.sub("", self._partial))
            self._partial = ""
        if self.task_log:
            self.task_log.close()
        self.run_log.close()
        super().close()

    def step_path(self, task: str) -> str:
        return os.path.join(self.folder, f"{task}.log")

    def _line(self, line: str) -> None:
        started, finished = _STARTED.search(line), _FINISHED.search(line)
        if started:
            self.task, self.task_lines, self.started = started["task"], [], self.clock()
            self.task_log = open(self.step_path(self.task), "a" if self.task in self.seen else "w")
            self.seen.add(self.task)
            if self.interactive:
                self._say(f"  {self.task} ...", end="\r")
            return
        if finished and self.task_log:
            self.task_log.close()
            self.task_log = None
            seconds = self.clock() - self.started
            task, ok = finished["task"], finished["status"] == "SUCCESS"
            self._say(f"  {task:<32} {'ok' if ok else 'FAILED':<6} {seconds:7.1f} s")
            if not ok and self.failed is None:
                self.failed = StepFailed(task, last_error(self.task_lines), self.step_path(task))
            return
        if self.task_log:
            self.task_log.write(line + "\n")
            self.task_lines.append(line)
            epoch = _EPOCH.match(line)
            if epoch and self.interactive:
                at = epoch["keras"] or f"{int(epoch['fastai']) + 1}"
                self._say(f"  {self.task} ... epoch {at}, {self.clock() - self.started:.0f} s",
                          end="\r")

    def _say(self, text: str, end: str = "\n") -> None:
        # On a terminal the progress line is rewritten in place; pad over its last text.
        self.terminal.write(text.ljust(79) + end if self.interactive else text + end)
        self.terminal.flush()


@contextlib.contextmanager
def steps_reported(folder: str) -> Iterator[StepLog]:
    """Files a local run's output by step under `folder` while the block runs.

    Raises:
        StepFailed: In place of kfp.local's RuntimeError: the step, its error and its log.
    """
    log = StepLog(folder, sys.stdout)
    try:
        with contextlib.redirect_stdout(log):
            yield log
    except RuntimeError as err:
        if log.failed is None:
            raise
        raise log.failed from err
    finally:
        log.close()
