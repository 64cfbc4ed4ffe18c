"""Other libraries' private names the product needs where no public way exists (one today),
read at the pinned versions (CPython 3.11); tests/test_borrowed.py fails when the library
changes, tests/test_structure.py keeps every other module to public names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable


def before_thread_pools_end(callback: Callable[[], None]) -> None:
    """Runs `callback` when the main thread ends, before concurrent.futures' pools shut down.

    Not `atexit`: its handlers run once the pools are shut. `threading._register_atexit`
    (concurrent.futures' own hook, no public name) runs last registered first, and
    concurrent.futures registers on import (done here first). Missing: `atexit`, warned.
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
