"""Per-image requirement locks from pyproject.toml and constraints.txt.

    .venv/bin/python tools/lock.py          # rewrite containers/<image>/requirements.txt
    .venv/bin/python tools/lock.py --check  # exit 1 when a committed lock is stale

Each image installs pyproject's build requirements, its [project] dependencies and one
extra, plus everything those pull in, each pinned to the version constraints.txt (the
freeze of the working venv) names. *Which* packages they pull in is read from the installed
distributions' metadata (the venv is installed from the same pins; a version mismatch is an
error, not a guess), with environment markers evaluated for the images' platform:
CPython 3.11 on linux x86_64. Requirements and markers are read with `packaging`.

Pins that cannot come from constraints.txt, because the venv here is CPU-only:
- `Image.gpu_extras`: the CUDA libraries a framework's GPU extra pulls in
  (`tensorflow[and-cuda]`) are not installed here. They are pinned at the lower bound the
  framework declares, which is the CUDA/cuDNN its release was built and tested against
  (TensorFlow 2.21: CUDA 12.5, cuDNN 9.3).
- `Image.local_labels`: the same torch version, another build (`2.13.0+cu126` instead of the
  `+cpu` build here), from the PyTorch index the image's Dockerfile names.
- pip freeze leaves out pip, setuptools and wheel: those take the venv's installed version.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import pathlib
import sys
import tomllib
from collections.abc import Iterable, Mapping

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The platform the images run on: markers are evaluated for it, not for this machine.
# python_full_version follows the Dockerfiles' base image tag (a test keeps them equal).
TARGET_ENV: Mapping[str, str] = {
    "python_version": "3.11",
    "python_full_version": "3.11.16",
    "implementation_name": "cpython",
    "implementation_version": "3.11.16",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
}

# pip freeze omits these; their pins come from the installed distribution.
FREEZE_OMITS = frozenset({"pip", "setuptools", "wheel", "distribute"})


@dataclasses.dataclass(frozen=True)
class Image:
    """One runtime image.

    Attributes:
        name: Folder under containers/ and the image name in Artifact Registry.
        extra: The pyproject optional-dependency group the image installs.
        gpu_extras: Package to the extras of it installed in the image only (GPU libraries).
        local_labels: Package to the local version label of the build the image installs.
        index_url: The index serving the labelled builds (the Dockerfile passes it to pip).
    """

    name: str
    extra: str
    gpu_extras: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    local_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    index_url: str = ""


# cu126 for torch: PyTorch 2.13 ships CUDA 12.6 and 13.0 builds (13.2 experimental); only
# the 12.6 build still carries Volta (sm_70, the V100 in pipelines/definitions/vertex.py)
# besides Turing (T4) and newer, and CUDA 12 keeps the driver requirement of the TensorFlow image.
TORCH_CUDA = "cu126"
IMAGES: Mapping[str, Image] = {
    "tensorflow": Image("tensorflow", "tensorflow", gpu_extras={"tensorflow": ("and-cuda",)}),
    "fastai": Image("fastai", "fastai",
                    local_labels={"torch": TORCH_CUDA, "torchvision": TORCH_CUDA},
                    index_url=f"https://download.pytorch.org/whl/{TORCH_CUDA}"),
}


class LockError(Exception):
    """The inputs do not give a consistent lock."""


def normalize(name: str) -> str:
    """PEP 503 name normalisation (also used for extras, as PEP 685 asks)."""
    return canonicalize_name(name)


def public_version(version: str) -> str:
    """`2.13.0+cu126` -> `2.13.0`: the version without its local label."""
    return version.split("+", 1)[0]


# ---------------------------------------------------------------- requirements and markers

def parse_requirement(text: str) -> Requirement:
    """Parses a PEP 508 requirement as written in pyproject or Requires-Dist.

    Args:
        text: The requirement, e.g. `name[extra] >=1.0 ; python_version < "3.12"`.

    Returns:
        The parsed requirement.

    Raises:
        LockError: The text is not a valid requirement (main() reports it, exit 2).
    """
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        raise LockError(f"cannot parse requirement {text!r}: {e}") from e


def applies(req: Requirement, extra: str = "") -> bool:
    """Whether a requirement applies on the images' platform (TARGET_ENV).

    Args:
        req: The requirement; one without a marker always applies.
        extra: The extra being installed, "" for none.

    Returns:
        Whether its environment marker is true there.
    """
    return req.marker is None or req.marker.evaluate({**TARGET_ENV, "extra": extra})


def lower_bound(specifier: SpecifierSet) -> str:
    """The version a `>=X`, `==X` or `~=X` specifier starts at.

    Args:
        specifier: The requirement's version specifier.

    Returns:
        The highest of its lower bounds, as written.

    Raises:
        LockError: It has no exact lower bound (none, or a `==X.*` wildcard).
    """
    bounds = [s.version for s in specifier if s.operator in (">=", "==", "~=")]
    if not bounds or any("*" in b for b in bounds):
        raise LockError(f"specifier {str(specifier)!r} has no lower bound to pin at")
    return max(bounds, key=Version)


# ---------------------------------------------------------------- inputs

def read_pyproject(path: pathlib.Path) -> dict:
    """pyproject.toml, parsed."""
    with open(path, "rb") as f:
        return tomllib.load(f)


def read_constraints(text: str) -> dict[str, tuple[str, str]]:
    """constraints.txt -> normalised name: (name as written, version)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise LockError(f"constraints.txt: {line!r} is not an exact `name==version` pin")
        pins[normalize(name)] = (name.strip(), version.strip())
    return pins


def installed_version(name: str) -> str | None:
    """The version of an installed distribution (local label included), None if absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_requires(name: str) -> list[str]:
    """The Requires-Dist lines of an installed distribution."""
    return importlib.metadata.requires(name) or []


# ---------------------------------------------------------------- the lock

@dataclasses.dataclass(frozen=True)
class Pin:
    """One line of a lock."""

    name: str
    version: str
    note: str = ""


def resolve(image: Image, pyproject: Mapping, constraints: Mapping[str, tuple[str, str]],
            version_of=installed_version, requires_of=installed_requires) -> list[Pin]:
    """The pins of one image, sorted by normalised name.

    Args:
        image: Which image.
        pyproject: pyproject.toml as parsed by tomllib.
        constraints: read_constraints() of constraints.txt.
        version_of: Installed version of a distribution, None when absent (injectable for tests).
        requires_of: Requires-Dist lines of an installed distribution.

    Returns:
        One Pin per package the image installs (this project itself excluded).

    Raises:
        LockError: A requirement is neither installed nor pinnable, or the venv and
            constraints.txt disagree, or pyproject pins another version than constraints.txt.
    """
    gpu_extras = {normalize(k): tuple(normalize(e) for e in v)
                  for k, v in image.gpu_extras.items()}
    labels = {normalize(k): v for k, v in image.local_labels.items()}
    wanted, gpu_only = _required(_roots(image, pyproject), constraints, gpu_extras,
                                 version_of, requires_of)
    pins = [_pin(name, version_of(name), constraints, labels.get(name), image.index_url)
            for name in wanted]
    pins.extend(p for n, p in gpu_only.items() if n not in wanted)
    return sorted(pins, key=lambda p: normalize(p.name))


def _roots(image: Image, pyproject: Mapping) -> list[str]:
    """The requirements an image installs first: build requirements, dependencies, extra.

    Raises:
        LockError: pyproject.toml has no such extra.
    """
    project = pyproject["project"]
    extras_table = project.get("optional-dependencies", {})
    if image.extra not in extras_table:
        raise LockError(f"pyproject.toml has no optional-dependencies group {image.extra!r}")
    return [*pyproject.get("build-system", {}).get("requires", []),
            *project.get("dependencies", []), *extras_table[image.extra]]


def _required(roots: Iterable[str], constraints: Mapping[str, tuple[str, str]],
              gpu_extras: Mapping[str, tuple[str, ...]], version_of,
              requires_of) -> tuple[dict[str, set[str]], dict[str, Pin]]:
    """`(wanted, gpu_only)`: every package `roots` pull in (normalised name: the extras
    asked of it), and the GPU libraries the CPU venv lacks, pinned at their lower bound.

    Raises:
        LockError: A requirement is not installed, or pyproject pins another version than
            constraints.txt.
    """
    wanted: dict[str, set[str]] = {}
    gpu_only: dict[str, Pin] = {}
    queue: list[str] = []

    def want(req: Requirement) -> None:
        # packaging keeps names and extras as written: key everything by the normalised form
        name = normalize(req.name)
        extras = {normalize(e) for e in req.extras} | set(gpu_extras.get(name, ()))
        seen = wanted.get(name)
        if seen is not None and extras <= seen:
            return
        wanted[name] = (seen or set()) | extras
        queue.append(name)

    for text in roots:
        req = parse_requirement(text)
        if applies(req):
            _check_pyproject_pin(req, constraints)
            want(req)

    while queue:
        name = queue.pop()
        extras = wanted[name]
        if version_of(name) is None:
            raise LockError(f"{name} is required but not installed in this venv: "
                            "install the pinned stack first (make venv)")
        for text in requires_of(name):
            req = parse_requirement(text)
            dep = normalize(req.name)
            base = applies(req)
            by_extra = [e for e in sorted(extras) if applies(req, e)]
            if not base and not by_extra:
                continue
            if version_of(dep) is not None:
                want(req)
            elif not base and set(by_extra) <= set(gpu_extras.get(name, ())):
                # a GPU library the CPU venv lacks: the framework's own lower bound
                gpu_only[dep] = Pin(dep, lower_bound(req.specifier),
                                    f"{name}[{','.join(by_extra)}] lower bound")
            else:
                raise LockError(f"{name} requires {text!r}, which is not installed here")
    return wanted, gpu_only


def _check_pyproject_pin(req: Requirement, constraints: Mapping[str, tuple[str, str]]) -> None:
    """Raises LockError when pyproject.toml pins `req` (==) at another version than
    constraints.txt."""
    name = normalize(req.name)
    for spec in req.specifier:
        if spec.operator == "==" and name in constraints:
            pinned = public_version(spec.version)
            if pinned != constraints[name][1]:
                raise LockError(f"pyproject.toml pins {name}=={pinned} but constraints.txt "
                                f"has {constraints[name][1]}")


def _pin(name: str, installed: str | None, constraints: Mapping[str, tuple[str, str]],
         label: str | None, index_url: str) -> Pin:
    """The lock line of a wanted package, `installed` at that version in the venv, with
    its image's local `label` (the build from `index_url`) when it has one.

    Raises:
        LockError: constraints.txt does not pin it, or pins another version.
    """
    if name in constraints:
        written, version = constraints[name]
        if public_version(installed) != version:
            raise LockError(f"the venv has {name} {installed} but constraints.txt pins "
                            f"{version}: reinstall the venv (make venv)")
        note = ""
    elif name in FREEZE_OMITS:
        written, version = name, public_version(installed)
        note = "pip freeze omits it: the venv's version"
    else:
        raise LockError(f"{name} is required but constraints.txt does not pin it")
    if label is not None:
        version = f"{version}+{label}"
        note = f"{label} build from {index_url}"
    return Pin(written, version, note)


def render(image: Image, pins: Iterable[Pin]) -> str:
    """The text of containers/<image>/requirements.txt."""
    lines = [
        f"# {image.name} image: pyproject.toml's build requirements, [project] dependencies",
        f"# and the {image.extra!r} extra, pinned to constraints.txt, for CPython 3.11 on"
        " linux x86_64.",
        "# Generated by tools/lock.py; do not edit: .venv/bin/python tools/lock.py",
    ]
    if image.index_url:
        labels = "/+".join(sorted(set(image.local_labels.values())))
        lines.append(f"# +{labels} builds: {image.index_url} (Dockerfile: --extra-index-url)")
    for pin in pins:
        line = f"{pin.name}=={pin.version}"
        lines.append(f"{line}  # {pin.note}" if pin.note else line)
    return "\n".join(lines) + "\n"


def lock_path(image: Image, root: pathlib.Path = ROOT) -> pathlib.Path:
    """Where an image's lock lives: containers/<image>/requirements.txt."""
    return root / "containers" / image.name / "requirements.txt"


def generate(root: pathlib.Path = ROOT) -> dict[pathlib.Path, str]:
    """Every image's lock text, keyed by the path it belongs at."""
    pyproject = read_pyproject(root / "pyproject.toml")
    constraints = read_constraints((root / "constraints.txt").read_text())
    return {lock_path(image, root): render(image, resolve(image, pyproject, constraints))
            for image in IMAGES.values()}


def main(argv: list[str] | None = None) -> int:
    """Writes (or with --check, compares) every image's lock.

    Returns:
        0 when written or fresh, 1 when --check finds a stale lock, 2 on inconsistent inputs.
    """
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when a committed lock differs")
    args = p.parse_args(argv)
    try:
        locks = generate()
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = []
    for path, text in locks.items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
