"""Test-only: makes one function of the product sleep before it runs, in the processes a
test starts, so that the product ships no hook for it.

`TEST_SLOW_CALL="package.module:function=seconds"` wraps `function` in `module` when the
module is first imported: each call sleeps `seconds`, logging a warning that says so
(`LOGGED`), then runs. Callers that look it up at call time (a module's own global, or
`module.function`) get the wrap. A multi-machine test slows the one writer this way (the
image chief's `write_artifact`), so that a process which does not wait for that writer
would finish before the outputs exist. Installed by this folder's sitecustomize.py, so
processes spawned from the test's (torch's ranks) are slowed too, with this folder on
their PYTHONPATH.
"""

from __future__ import annotations

import functools
import importlib.machinery
import logging
import os
import sys
import time

VARIABLE = "TEST_SLOW_CALL"
LOGGED = "%s: sleeping %.1f s before %s (a test)"


class _Wrapper:  # a meta path finder: wraps the function once its module ran
    def __init__(self, module: str, function: str, seconds: float):
        self.module, self.function, self.seconds = module, function, seconds

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            function = getattr(module, self.function)
            where = f"{self.module}:{self.function}"

            @functools.wraps(function)
            def slowed(*args, **kwargs):
                logging.getLogger(__name__).warning(LOGGED, VARIABLE, self.seconds, where)
                time.sleep(self.seconds)
                return function(*args, **kwargs)

            setattr(module, self.function, slowed)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Puts the wrap `TEST_SLOW_CALL` asks for in place (nothing when it is unset)."""
    value = os.environ.get(VARIABLE)
    if value:
        target, seconds = value.rsplit("=", 1)
        module, function = target.split(":")
        sys.meta_path.insert(0, _Wrapper(module, function, float(seconds)))
