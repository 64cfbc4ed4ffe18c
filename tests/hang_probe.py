"""Tests that hang, three ways, and one that passes: run only by test_suite_timeout.py,
with a timeout of a few seconds (the file's name keeps it out of the suite)."""

import ctypes
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor


def _same(x):
    return x


def test_hangs_waiting():
    time.sleep(600)


def test_hangs_holding_the_gil():
    ctypes.PyDLL(None).sleep(600)  # PyDLL keeps the GIL through the call


def test_hangs_with_a_forked_child_alive():
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    assert list(pool.map(_same, [1])) == [1]  # its worker now holds the xdist pipes too
    time.sleep(600)


def test_passes():
    pass
