"""Loaded by every Python process the tests start (tests/conftest.py puts this folder on
PYTHONPATH): kfp.local steps, replicas, launchers, bench smokes.

At exit, once the atexit handlers have run (this one was registered first, so it runs
last), every object is moved out of the garbage collector's reach: the interpreter's
teardown then skips its full collections, which take ~2 s in a process that imported
torch and transformers, or TensorFlow, against ~0.3 s (measured 2026-11-28). A step's
outputs are written by then; objects freed by reference counting still are.

A test may also slow one product function in them (`slow_calls`, `TEST_SLOW_CALL`).
"""

import atexit
import gc

import slow_calls

atexit.register(gc.freeze)
slow_calls.install()
