"""The preemption notice itself: a real SIGTERM to this process, caught only inside `with`."""

import json
import os
import signal
import subprocess
import sys

import pytest

from components.common import preemption

REPO = os.path.dirname(os.path.dirname(__file__))


def test_sigterm_inside_the_notice_only_sets_its_flag():
    with preemption.Notice() as notice:
        assert not notice.requested
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one while sealing is only counted
        assert notice.requested
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("script, status", [
    ("with preemption.Notice():\n    pass\nos.kill(os.getpid(), signal.SIGTERM)\n",
     -signal.SIGTERM),  # outside the notice, a SIGTERM ends the process as before
    ("raise preemption.Preempted('at step 7 in /ckpt')\n", 143),
], ids=["sigterm-outside-the-notice", "preempted"])
def test_a_sigterm_outside_the_notice_kills_as_before_and_preempted_exits_with_143(script,
                                                                                   status):
    done = subprocess.run([sys.executable, "-c", "import os, signal\nfrom components.common "
                           f"import preemption\n{script}print('survived')\n"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == status and "survived" not in done.stdout
    assert preemption.EXIT_STATUS == 143


def test_every_rank_stops_when_one_is_told():
    assert preemption.any_rank(False, lambda flag: max(flag, 1))
    assert not preemption.any_rank(False, lambda flag: max(flag, 0))
    assert preemption.any_rank(True, None) and not preemption.any_rank(False, None)


def test_a_step_interval_of_zero_never_checkpoints():
    assert [step for step in range(1, 11) if preemption.due(step, 4)] == [4, 8]
    assert not any(preemption.due(step, 0) for step in range(20))


def probe_pid(pid_file: str):
    import os

    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))


def test_a_steps_python_is_the_containers_first_process(tmp_path):
    """The SIGTERM of a preemption reaches a container's first process only: the command KFP
    compiles for a step must end in python itself, not in a shell that ignores it."""
    from pipelines.definitions.steps import component

    container = component(probe_pid, "unused:1").component_spec.implementation.container
    pid_file = tmp_path / "pid"
    executor_input = {"inputs": {"parameterValues": {"pid_file": str(pid_file)}},
                      "outputs": {"outputFile": str(tmp_path / "out.json")}}
    args = [a.replace("{{$}}", json.dumps(executor_input)) for a in container.args]
    env = {**os.environ, "PYTHONPATH": REPO,
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}  # its python3
    shell = subprocess.Popen([*container.command, *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    output = shell.communicate(timeout=120)[0]
    assert shell.returncode == 0, output
    assert int(pid_file.read_text()) == shell.pid  # the shell exec'd python
