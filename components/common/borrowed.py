"""Other libraries' private names the product needs where no public way exists (one today),
read at the pinned versions (CPython 3.11); tests/test_borrowed.py fails when the library
changes, tests/test_structure.py keeps every other module to public names. Known elsewhere:
pipelines/definitions/tuning.py edits GCPC 2.22.0's compiled tuning payload (a private format).
"""

from __future__ import annotations

import logging
from collections.abc import Callable


def before_thread_pools_end(callback: Callable[[], None]) -> None:
    """Runs `callback` when the main thread ends, before concurrent.futures' pools shut down.

    Not `atexit` (the public hook): its handlers run after the pools are shut down, when
    nothing can be scheduled on them any more. CPython's `threading._register_atexit` is
    concurrent.futures' own hook and has no public name; its handlers run last registered
    first, and concurrent.futures registers on import (done here first), so its pools
    shut down after `callback`. Where it is missing, `atexit`, with a warning.
    """
    import concurrent.futures.thread  # noqa: F401 (registers its pools' shutdown now)
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is None:
        import atexit

        logging.getLogger(__name__).warning(
            "threading._register_atexit is missing: %r runs at interpreter exit, where it "
            "cannot use a thread pool", callback)
        register = atexit.register
    register(callback)
