"""`pipelines.step_log`: a local run reported one line per step, its logs kept in files."""

import io
import re

import pytest
from kfp import dsl, local

from pipelines.step_log import StepFailed, StepLog, last_error, steps_reported


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def say(word: str) -> str:
    print(f"saying {word}")
    return word


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def refuse(word: str):
    raise ValueError(f"column 'label' of {word}.csv is empty: fill it or drop the rows")


@dsl.pipeline
def two_steps(word: str):
    refuse(word=say(word=word).output)


def test_a_failing_step_is_reported_by_its_own_error_and_log(tmp_path, capsys):
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    with pytest.raises(StepFailed) as failed, steps_reported(str(tmp_path / "logs")):
        two_steps(word="reviews")
    assert failed.value.task == "refuse"
    assert failed.value.reason == ("ValueError: column 'label' of reviews.csv is empty: "
                                   "fill it or drop the rows")
    assert failed.value.log_path == str(tmp_path / "logs" / "refuse.log")
    assert "Traceback (most recent call last)" in (tmp_path / "logs" / "refuse.log").read_text()
    assert "saying reviews" in (tmp_path / "logs" / "say.log").read_text()
    assert "saying reviews" not in (tmp_path / "logs" / "refuse.log").read_text()
    run_log = (tmp_path / "logs" / "run.log").read_text()
    assert "Executing task" in run_log and "saying reviews" in run_log
    # the terminal: one line per step, in order, and none of the executors' output
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["say", "ok"], ["refuse", "FAILED"]]


def test_step_lines_carry_the_time_and_a_terminal_sees_the_epoch(tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    log = StepLog(str(tmp_path), terminal, clock=iter([10.0, 12.0, 13.0, 14.5]).__next__)
    log.write("12:00 - INFO - Executing task \x1b[96m'train-text'\x1b[0m\n")
    log.write("    0     1.234    1.111    0.500  00:03\n    Epoch 2/8\n")
    log.write("12:01 - INFO - Task 'train-text' finished with status SUCCESS\n")
    log.close()
    shown = terminal.getvalue()
    assert "train-text ... epoch 1, 2 s" in shown  # fastai counts epochs from 0
    assert "train-text ... epoch 2/8, 3 s" in shown
    assert re.search(r"\r  train-text +ok +4\.5 s$", shown.rstrip())
    assert (tmp_path / "train-text.log").read_text().splitlines() == [
        "    0     1.234    1.111    0.500  00:03", "    Epoch 2/8"]


@pytest.mark.parametrize("lines, expected", [
    (["    Traceback (most recent call last):", '      File "x.py", line 1, in f',
      "        raise KeyError('a')", "    KeyError: 'a'", "    "], "KeyError: 'a'"),
    (["    starting", "    killed by signal 9"], "killed by signal 9"),
    ([], "no output"),
])
def test_last_error_is_the_exception_a_log_ends_with(lines, expected):
    assert last_error(lines) == expected
