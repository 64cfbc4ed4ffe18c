"""What the project's commands share: an expected error ends one with a line, not a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable


def reports(*errors: type[BaseException]) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorates a command's `main`: an error of `errors` it raises is printed to stderr as
    one `error: ...` line and the command exits with status 2, as argparse does on bad
    arguments; any other exception still ends it with a traceback.

    Args:
        errors: The exceptions whose message says what to change (a missing file, a
            refused setting).
    """
    def decorate(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args, **kwargs) -> int:
            try:
                return main(*args, **kwargs)
            except errors as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        return run
    return decorate
