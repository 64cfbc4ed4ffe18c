"""The suite's test ids, collected twice: under two hash seeds, seconds apart.

pytest-xdist refuses a run whose workers collected different tests ("Different tests were
collected between gw1 and gw0"), so an id that carries the clock (a gzip header's time),
hash order (a set of strings) or random bytes turns `make test` red at random. This
collects the suite twice at once, with PYTHONHASHSEED 1 and 2, the second started `gap`
seconds after the first, and names every id that is not in both.

    python -m tools.collection_check [PYTEST ARGS...]   # e.g. -m "not slow"
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence


def _collect(args: Sequence[str], seed: int, cwd: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": str(seed)}
    env.pop("PYTEST_XDIST_WORKER", None)  # a check run from a test collects as a user would
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ids(process: subprocess.Popen, seed: int) -> list[str]:
    out, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"collecting with PYTHONHASHSEED={seed} failed "
                           f"(exit {process.returncode}):\n{out[-4000:]}")
    return [line for line in out.splitlines() if "::" in line]


def differences(args: Sequence[str] = (), gap: float = 2.0, cwd: str | None = None
                ) -> list[str]:
    """The ids (and order changes) that two collections of the same tests disagree on.

    Args:
        args: pytest's arguments (paths, `-m` expressions).
        gap: Seconds between the two collections' starts (past a second boundary).
        cwd: Where pytest runs; the current folder when None.

    Returns:
        A line per id only one collection has, and one for the first order difference.

    Raises:
        RuntimeError: A collection failed (its output's tail is in the message).
    """
    first = _collect(args, 1, cwd)
    time.sleep(gap)
    second = _collect(args, 2, cwd)
    one, two = _ids(first, 1), _ids(second, 2)
    found = ([f"only with PYTHONHASHSEED=1: {i}" for i in one if i not in set(two)]
             + [f"only with PYTHONHASHSEED=2: {i}" for i in two if i not in set(one)])
    both = set(one) & set(two)
    for a, b in zip([i for i in one if i in both], [i for i in two if i in both]):
        if a != b:  # xdist refuses another order too
            found.append(f"another order: {a} (PYTHONHASHSEED=1) where {b} (2)")
            break
    return found


def main(argv: Sequence[str] | None = None) -> int:
    found = differences(sys.argv[1:] if argv is None else argv)
    for line in found:
        print(line)
    print(f"{len(found)} difference(s) between two collections" if found
          else "the same test ids in both collections")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
