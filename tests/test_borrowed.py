"""components.common.borrowed: the private name it uses still does what it was read to do."""

import concurrent.futures.thread  # noqa: F401 (it needs the hook when first imported)
import logging
import subprocess
import sys
import threading

from components.common import borrowed

# At exit, a callback that needs a thread pool (as s3fs's last checkpoint push does).
_AT_EXIT = """
from concurrent.futures import ThreadPoolExecutor
from components.common.borrowed import before_thread_pools_end
before_thread_pools_end(lambda: print(ThreadPoolExecutor(1).submit(str, "ran").result()))
"""


def test_the_callback_runs_at_exit_while_thread_pools_still_take_work():
    # Fails when CPython drops or reorders threading._register_atexit: the fallback,
    # atexit, runs it after the pools shut down ("cannot schedule new futures").
    assert callable(getattr(threading, "_register_atexit", None)), (
        f"Python {sys.version.split()[0]} has no threading._register_atexit: "
        "components/common/borrowed.py needs another way to run before the pools shut down")
    done = subprocess.run([sys.executable, "-c", _AT_EXIT], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")


def test_without_the_hook_it_falls_back_to_atexit_and_says_so(monkeypatch, caplog):
    registered = []
    monkeypatch.delattr(threading, "_register_atexit")
    monkeypatch.setattr("atexit.register", registered.append)
    with caplog.at_level(logging.WARNING):
        borrowed.before_thread_pools_end(print)
    assert registered == [print]
    assert "threading._register_atexit is missing" in caplog.text
