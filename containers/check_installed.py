"""Check, inside an image build, that what pip installed is what the lock says.

    python check_installed.py requirements.txt --record /opt/venv/installed.txt

Fails when a locked distribution is missing or at another version. Lists what pip installed
beyond the lock, each with what required it (torch's CUDA builds pin their CUDA libraries
exactly, from an index the lock cannot read), marking what a range pulled in as floating.
Writes every installed distribution and version to `--record`. Standard library only.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys

BOOTSTRAP = ("pip", "setuptools", "wheel")  # the venv's own; setuptools is locked too


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> dict[str, str]:
    """`name==version` lines (comments and blanks ignored) -> {canonical name: version}."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise ValueError(f"lock line {line!r} is not name==version")
            pins[canonical(name)] = version.strip()
    return pins


def pins_of(requirements: list[str]) -> dict[str, str]:
    """{name: specifier} of a distribution's Requires-Dist, markers dropped."""
    pins = {}
    for requirement in requirements:
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*([^;]*)",
                         requirement)
        if match:
            pins[canonical(match.group(1))] = match.group(2).strip().strip("()")
    return pins


def _pins_exactly(spec: str, version: str) -> bool:
    """`==V` naming this very release (PEP 440 compares releases without trailing zeros:
    13.0.3.0 is 13.0.3); `==V.*` (a series) and ranges float."""
    if not spec.startswith("==") or "," in spec or spec.endswith(".*"):
        return False
    return re.sub(r"(\.0)+$", "", spec[2:]) == re.sub(r"(\.0)+$", "", version)


def compare(locked: dict[str, str], installed: dict[str, str],
            requires: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(errors, extras): lock pins not installed as pinned, and what else is installed."""
    errors = []
    for name, version in sorted(locked.items()):
        if name not in installed:
            errors.append(f"{name}=={version} is locked but not installed")
        elif installed[name] != version:
            errors.append(f"{name} is locked at {version} but {installed[name]} is installed")
    wanted_by: dict[str, list[str]] = {}
    for owner, reqs in sorted(requires.items()):
        for name, spec in pins_of(reqs).items():
            wanted_by.setdefault(name, []).append(f"{owner} {spec}".strip())
    extras = []
    for name, version in sorted(installed.items()):
        if name in locked or name in BOOTSTRAP:
            continue
        reasons = wanted_by.get(name, [])
        exact = any(_pins_exactly(reason.rpartition(" ")[2], version) for reason in reasons)
        extras.append(f"{name}=={version} ({'; '.join(reasons) or 'nothing requires it'})"
                      + ("" if exact else " FLOATING: not pinned exactly"))
    return errors, extras


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lock")
    p.add_argument("--record")
    args = p.parse_args(argv)
    with open(args.lock) as f:
        locked = read_lock(f.read())
    installed, requires = {}, {}
    for dist in importlib.metadata.distributions():
        name = canonical(dist.metadata["Name"])
        installed[name] = dist.version
        requires[name] = dist.requires or []
    if args.record:
        with open(args.record, "w") as f:
            f.writelines(f"{name}=={installed[name]}\n" for name in sorted(installed))
    errors, extras = compare(locked, installed, requires)
    if errors:
        print("the image does not hold what the lock pins:\n  " + "\n  ".join(errors),
              file=sys.stderr)
        return 1
    print(f"{len(locked)} locked distributions installed at their pins; "
          f"{len(extras)} more, not in the lock:" + "".join(f"\n  {e}" for e in extras))
    return 0


if __name__ == "__main__":
    sys.exit(main())
