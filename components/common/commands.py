"""What the project's commands share: an expected error ends one with a line, not a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable


def reports(*errors: type[BaseException]) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorates a command's `main`: an error of `errors` is printed as one `error: ...`
    line and the command exits with 2, as argparse does; others keep their traceback."""
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
