"""The suite's timeout (tests/conftest.py): a hung test fails by name, with its stacks,
and the run goes on, whichever way it hangs."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_hung_tests_are_named_as_crashed_with_their_stacks_and_the_run_ends():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--timeout", "3",
         "tests/hang_probe.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    for name in ("test_hangs_waiting", "test_hangs_holding_the_gil",
                 "test_hangs_with_a_forked_child_alive"):
        assert f"crashed while running 'tests/hang_probe.py::{name}'" in out, out
        assert f"in {name}" in out, out  # the hung thread's stack names the test function
    assert "3 failed, 1 passed" in out, out
