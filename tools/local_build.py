"""Build the two runtime images on this machine, with no registry reachable: `make images-local`.

    python tools/local_build.py [--runtime tensorflow|fastai ...] [--report FILE]

Cloud Build builds `containers/*/Dockerfile` FROM the public python image pinned by digest.
No registry can be pulled from here, so this script builds both Dockerfiles with buildah
(chroot isolation, vfs storage) on a stand-in for that base made offline:

1. Stand-in base: `debootstrap --variant=minbase` of the public image's Debian release,
   with the libraries its CPython loads, and this machine's CPython of the same minor copied
   to `/usr/local` (standard library only; Debian 12's 3.11.2 is older than the locks need).
2. `--build-arg BASE_IMAGE=<stand-in>`, and `TORCH_LOCAL_LABEL=` (empty): PyTorch's own
   index is unreachable, so pip installs PyPI's build of the same torch. Only here.
3. This machine's CA bundle (a TLS-intercepting proxy) is bind-mounted into the RUN steps
   with a pip.conf pointing at it; neither is written into an image.

Images are tagged with the URIs `compile.py` bakes into `build/local/*.json`, so
`python -m tools.rehearsal build/local/image_pipeline.json --runtime image` runs in them.
Build times and image sizes go to `build/images/report.json`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIMES = ("tensorflow", "fastai")
WORK = ROOT / "build" / "images"
STORAGE = ("--storage-driver", "vfs")
# Debian's mirror as apt on this machine is set up to reach it.
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The oldest CPython the locks install on: soupsieve 4.1.2 (fastai lock) needs >= 3.11.5.
MIN_PYTHON = (3, 11, 5)
# What python:3.11-slim carries besides CPython, and the libraries its extension modules load.
RUNTIME_PACKAGES = ("ca-certificates", "netbase", "tzdata", "libssl3", "libsqlite3-0",
                    "libffi8", "libbz2-1.0", "liblzma5", "zlib1g", "libreadline8",
                    "libncursesw6", "libuuid1", "libgdbm6", "libexpat1", "libnsl2", "libtirpc3")
# Parts of a CPython install the runtime never uses (the official slim image drops them too).
PYTHON_EXCLUDES = ("lib/python{minor}/site-packages/*", "lib/python{minor}/test",
                   "lib/python{minor}/idlelib", "lib/python{minor}/tkinter",
                   "lib/python{minor}/turtledemo", "lib/python{minor}/config-*",
                   "lib/libpython{minor}.a", "include", "share", "__pycache__")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class BuildError(RuntimeError):
    """A local image build cannot go on; the message says why and what to do."""


def dockerfile_path(runtime: str) -> Path:
    return ROOT / "containers" / runtime / "Dockerfile"


def base_image_default(dockerfile_text: str) -> str:
    """The `ARG BASE_IMAGE=` default of a Dockerfile: the public base Cloud Build uses."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)\s*$", dockerfile_text, re.M)
    if not match:
        raise BuildError("the Dockerfile has no `ARG BASE_IMAGE=<image>` default")
    return match.group(1)


def parse_python_base(reference: str) -> dict[str, str]:
    """`python:3.11.16-slim-bookworm@sha256:...` -> version, minor, Debian suite, digest."""
    match = re.fullmatch(r"(?:docker\.io/(?:library/)?)?python:(?P<version>\d+\.\d+\.\d+)"
                         r"-slim-(?P<suite>[a-z]+)(?:@(?P<digest>sha256:[0-9a-f]{64}))?",
                         reference)
    if not match:
        raise BuildError(f"{reference!r} is not an official python:<x.y.z>-slim-<debian> image")
    version = match.group("version")
    return {"version": version, "minor": ".".join(version.split(".")[:2]),
            "suite": match.group("suite"), "digest": match.group("digest") or ""}


def standin_name(base: dict[str, str]) -> str:
    """Local name of the stand-in for a public base (never pushed anywhere)."""
    return f"localhost/standin-python:{base['minor']}-slim-{base['suite']}"


def check_python(version: tuple[int, ...], base: dict[str, str]) -> None:
    """The CPython copied into the stand-in must be the base's minor and satisfy the locks."""
    minor = ".".join(map(str, version[:2]))
    if minor != base["minor"]:
        raise BuildError(f"the stand-in needs CPython {base['minor']} (the base image's), but "
                         f"this interpreter is {minor}: run with python{base['minor']}")
    if tuple(version[:3]) < MIN_PYTHON:
        raise BuildError(f"CPython {'.'.join(map(str, version[:3]))} is older than "
                         f"{'.'.join(map(str, MIN_PYTHON))}, which the locks need")


def copy_python(prefix: Path, destination: Path, minor: str) -> None:
    """Copies a CPython install to `destination`, without what `PYTHON_EXCLUDES` names."""
    excludes = [pattern.format(minor=minor) for pattern in PYTHON_EXCLUDES]

    def ignore(folder: str, names: list[str]) -> set[str]:
        relative = Path(folder).relative_to(prefix)
        return {name for name in names if any(
            fnmatch.fnmatch((relative / name).as_posix(), pattern) or name == pattern
            for pattern in excludes)}

    shutil.copytree(prefix, destination, symlinks=True, ignore=ignore, dirs_exist_ok=True)


def build_args(runtime: str, base_image: str, git_sha: str, version: str) -> dict[str, str]:
    """`--build-arg`s of the local build of one runtime image."""
    # PyTorch's indexes are unreachable here: PyPI's build of the same version, both images.
    return {"BASE_IMAGE": base_image, "GIT_SHA": git_sha, "VERSION": version,
            "TORCH_INDEX_URL": "", "TORCH_LOCAL_LABEL": ""}


def image_tags() -> dict[str, str]:
    """The image URIs `compile.py` bakes into build/local/*.json, per runtime."""
    sys.path.insert(0, str(ROOT))
    import compile as compile_module

    defaults = compile_module.parse_args([])
    return compile_module.image_uris(defaults)


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def buildah(*args: str, capture: bool = False) -> str:
    result = run(["buildah", *STORAGE, *args], capture_output=capture, text=True)
    return result.stdout.strip() if capture else ""


def image_id(name: str) -> str:
    """The ID of a local image, "" when there is none of that name."""
    result = subprocess.run(["buildah", *STORAGE, "images", "--quiet", "--no-trunc", name],
                            capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def image_size(name: str) -> str:
    """The image's size as buildah reports it (its layers, uncompressed: e.g. "6.24 GB")."""
    [entry] = json.loads(buildah("images", "--json", name, capture=True))
    return entry["size"]


def make_standin(base: dict[str, str], work: Path) -> str:
    """Builds the stand-in base image (skipped when it exists); returns its name."""
    name = standin_name(base)
    if image_id(name):
        print(f"stand-in {name} exists")
        return name
    check_python(sys.version_info, base)
    for tool in ("debootstrap", "buildah"):
        if not shutil.which(tool):
            raise BuildError(f"{tool} is not installed: `make images-local` installs it")
    rootfs = work / "standin-rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    run(["debootstrap", "--variant=minbase", f"--include={','.join(RUNTIME_PACKAGES)}",
         base["suite"], str(rootfs), DEBIAN_MIRROR])
    copy_python(Path(sys.base_prefix), rootfs / "usr" / "local", base["minor"])
    bindir = rootfs / "usr" / "local" / "bin"
    for alias in ("python3", "python"):
        link = bindir / alias
        if not link.exists():
            link.symlink_to(f"python{base['minor']}")
    # libpython is found through /usr/local/lib (Debian's ld.so.conf), not the build's RUNPATH
    run(["ldconfig", "-r", str(rootfs)])
    for cache in (rootfs / "var" / "cache" / "apt", rootfs / "var" / "lib" / "apt" / "lists"):
        for item in cache.glob("*"):
            if item.is_file():
                item.unlink()
    container = buildah("from", "scratch", capture=True)
    try:
        run(["tar", "-C", str(rootfs), "-cf", str(work / "standin.tar"), "."])
        buildah("add", container, str(work / "standin.tar"), "/")
        buildah("config", "--env", "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:"
                "/sbin:/bin", "--env", "LANG=C.UTF-8",
                "--env", f"PYTHON_VERSION={'.'.join(map(str, sys.version_info[:3]))}",
                "--cmd", "python3", "--label",
                f"stand-in-for=python:{base['version']}-slim-{base['suite']}", container)
        buildah("commit", "--rm", container, name)
    except BaseException:
        subprocess.run(["buildah", *STORAGE, "rm", container], capture_output=True)
        raise
    finally:
        (work / "standin.tar").unlink(missing_ok=True)
        shutil.rmtree(rootfs, ignore_errors=True)
    return name


def build_image(runtime: str, base_image: str, tag: str, work: Path) -> dict[str, object]:
    """Builds one runtime image; returns its tag, build seconds and size."""
    git_sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip() or "unknown"
    args = build_args(runtime, base_image, git_sha, version("vertex-gpu-pipelines"))
    pip_conf = work / "pip.conf"  # for the RUN steps: pip trusts this machine's CA bundle
    pip_conf.write_text(f"[global]\ncert = {CA_BUNDLE}\n")
    # No --layers: vfs stores every committed layer as a full copy of the file system, so
    # each small COPY after the 5 GB dependency layer would cost another 6 GB of disk.
    command = ["build", "--isolation", "chroot", "--file",
               str(dockerfile_path(runtime)), "--tag", tag,
               "--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
               "--volume", f"{pip_conf}:/etc/pip.conf:ro"]
    for key, value in args.items():
        command += ["--build-arg", f"{key}={value}"]
    replaced = image_id(tag)
    started = time.monotonic()
    buildah(*command, str(ROOT))
    seconds = time.monotonic() - started
    if replaced and replaced != image_id(tag):  # vfs: an old image is GBs of disk
        subprocess.run(["buildah", *STORAGE, "rmi", replaced], capture_output=True)
    return {"tag": tag, "build_args": args, "seconds": round(seconds, 1),
            "size": image_size(tag)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime", action="append", choices=RUNTIMES,
                   help="build only this image (repeatable; default: both)")
    p.add_argument("--report", default=str(WORK / "report.json"))
    args = p.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    tags = image_tags()
    report: dict[str, object] = {}
    try:
        for runtime in args.runtime or RUNTIMES:
            base = parse_python_base(base_image_default(dockerfile_path(runtime).read_text()))
            started = time.monotonic()
            standin = make_standin(base, WORK)
            report.setdefault("standin", {"tag": standin, "stands_in_for": base,
                                          "seconds": round(time.monotonic() - started, 1),
                                          "size": image_size(standin)})
            report[runtime] = build_image(runtime, standin, tags[runtime], WORK)
    except (BuildError, subprocess.CalledProcessError) as err:
        print(f"images-local failed: {err}", file=sys.stderr)
        return 1
    Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    for key, item in report.items():
        print(f"{key:<11} {item['size']:>9}  {item['seconds']:7.1f} s  {item['tag']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
