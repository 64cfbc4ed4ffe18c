"""The preemption notice itself: a real SIGTERM to this process, caught only inside `with`."""

import os
import signal
import subprocess
import sys
import textwrap

from components.common import preemption


def test_sigterm_inside_the_notice_only_sets_its_flag():
    with preemption.Notice() as notice:
        assert not notice.requested
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one while sealing is only counted
        assert notice.requested
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_outside_the_notice_ends_the_process_as_before():
    script = textwrap.dedent("""
        import os, signal
        from components.common import preemption
        with preemption.Notice():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        print("survived")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == -signal.SIGTERM and "survived" not in done.stdout


def test_preempted_exits_with_143_and_says_where():
    script = ("from components.common import preemption\n"
              "raise preemption.Preempted('at step 7 in /ckpt')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == preemption.EXIT_STATUS == 143


def test_every_rank_stops_when_one_is_told():
    assert preemption.any_rank(False, lambda flag: max(flag, 1))
    assert not preemption.any_rank(False, lambda flag: max(flag, 0))
    assert preemption.any_rank(True, None) and not preemption.any_rank(False, None)


def test_a_step_interval_of_zero_never_checkpoints():
    assert [step for step in range(1, 11) if preemption.due(step, 4)] == [4, 8]
    assert not any(preemption.due(step, 0) for step in range(20))
