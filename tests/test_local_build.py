"""The local image build (`make images-local`): its build arguments and stand-in base recipe.

Building the images takes many minutes and GBs, so `make test` never does; these tests hold
the recipe to the Dockerfiles and the locks instead. The build itself and
`python -m tools.rehearsal --runtime image` are run by hand (docs/contributors.md: "Building and
running the images here").
"""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from tools import local_build
from tools.local_build import BuildError

IMAGES = local_build.RUNTIMES
CONTAINERS = Path(__file__).resolve().parent.parent / "containers"


def _lock(runtime: str) -> str:
    return (CONTAINERS / runtime / "requirements.txt").read_text()


def _dockerfile(runtime: str) -> str:
    return local_build.dockerfile_path(runtime).read_text()


@pytest.mark.parametrize("runtime", IMAGES)
def test_every_local_build_arg_is_one_the_dockerfile_declares(runtime):
    args = local_build.build_args(runtime, "localhost/standin:x", "abc", "0.1.0")
    assert set(args) <= set(re.findall(r"^ARG (\w+)", _dockerfile(runtime), re.M))
    assert args["BASE_IMAGE"] == "localhost/standin:x"


def _requirements_after_build_step(tmp_path: Path,
                                   build_args: dict[str, str]) -> tuple[list[str], list[str]]:
    """Runs the fastai Dockerfile's own `if ...; fi` that rewrites the torch pins."""
    text = _dockerfile("fastai").replace("\\\n", " ")
    [step] = re.findall(r"^RUN (if .*?fi) ", text, re.M)
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(_lock("fastai"))
    defaults = dict(re.findall(r"^ARG (TORCH_\w+)=(\S*)$", _dockerfile("fastai"), re.M))
    env = {**os.environ, **defaults, **build_args}
    subprocess.run(["sh", "-ec", step], cwd=tmp_path, env=env, check=True)
    pip_args = subprocess.run(
        ["sh", "-ec", 'echo ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"}'],
        env=env, capture_output=True, text=True, check=True).stdout.split()
    return requirements.read_text().splitlines(), pip_args


def test_cloud_build_labels_the_torch_pins_cu126_and_asks_pytorchs_index(tmp_path):
    lines, pip_args = _requirements_after_build_step(tmp_path, {})
    changed = [(old, new) for old, new in zip(_lock("fastai").splitlines(), lines) if old != new]
    assert [new.split()[0] for _, new in changed] == ["torch==2.13.0+cu126",
                                                      "torchvision==0.28.0+cu126"]
    assert pip_args == ["--extra-index-url", "https://download.pytorch.org/whl/cu126"]


def test_local_build_installs_the_registry_build_of_the_same_torch(tmp_path):
    args = local_build.build_args("fastai", "base", "sha", "0.1.0")
    lines, pip_args = _requirements_after_build_step(tmp_path, args)
    pins = {line.split("==")[0]: line.split("==")[1].split()[0] for line in lines
            if line.startswith(("torch==", "torchvision=="))}
    assert pins == {"torch": "2.13.0", "torchvision": "0.28.0"}
    assert pip_args == []  # PyTorch's index is not asked at all
    untouched = [line for line in lines if not line.startswith(("torch==", "torchvision=="))]
    original = _lock("fastai").splitlines()
    assert untouched == [line for line in original
                         if not line.startswith(("torch==", "torchvision=="))]


@pytest.mark.parametrize("runtime", IMAGES)
def test_standin_is_the_public_bases_debian_release_and_python_minor(runtime):
    reference = local_build.base_image_default(_dockerfile(runtime))
    base = local_build.parse_python_base(reference)
    assert base["suite"] == "bookworm"
    # the Python the lock was resolved for (uv's recorded command, `make lock`)
    assert f"--python-version {base['version']} " in _lock(runtime).splitlines()[1]
    assert base["minor"] == "3.11"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", base["digest"])
    assert local_build.standin_name(base) == "localhost/standin-python:3.11-slim-bookworm"


def test_base_reference_parsing_refuses_what_is_not_the_official_slim_image():
    for reference in ("python:3.11", "ubuntu:22.04", "python:latest",
                      "nvidia/cuda:12.5.1-runtime-ubuntu22.04"):
        with pytest.raises(BuildError, match="not an official python"):
            local_build.parse_python_base(reference)
    with pytest.raises(BuildError, match="ARG BASE_IMAGE"):
        local_build.base_image_default("FROM python:3.11.16-slim-bookworm\n")


def test_minimum_python_is_what_the_locked_packages_require():
    """MIN_PYTHON is the highest Requires-Python floor among the locked packages installed
    here: lower and some lock would not install, as Debian 12's own 3.11.2 does not."""
    floors = []
    for runtime in IMAGES:
        for line in _lock(runtime).splitlines():
            name, _, version = line.split("#")[0].strip().partition("==")
            if not version:
                continue
            try:
                meta = importlib.metadata.metadata(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            # .get: a package may declare no floor at all (cloudml-hypertune's 2019 wheel)
            if meta["Version"] != version.split("+")[0] or not meta.get("Requires-Python"):
                continue
            spec = SpecifierSet(meta["Requires-Python"])
            floors += [tuple(int(p) for p in s.version.split(".")) + (0,) * 2
                       for s in spec if s.operator in (">=", "~=") and
                       s.version.startswith("3.11")]
    assert floors, "no locked package with a 3.11.x floor is installed here"
    assert max(floors)[:3] == local_build.MIN_PYTHON


def test_python_check_refuses_another_minor_or_an_older_patch():
    base = {"minor": "3.11", "version": "3.11.16", "suite": "bookworm", "digest": ""}
    local_build.check_python(sys.version_info, base)  # this machine can build the stand-in
    with pytest.raises(BuildError, match="older than 3.11.5"):
        local_build.check_python((3, 11, 2), base)
    with pytest.raises(BuildError, match="needs CPython 3.11"):
        local_build.check_python((3, 12, 1), base)


def test_python_copy_keeps_the_runtime_and_drops_what_it_never_uses(tmp_path):
    prefix = tmp_path / "prefix"
    files = ["bin/python3.11", "lib/libpython3.11.so.1.0", "lib/python3.11/os.py",
             "lib/python3.11/json/__init__.py", "lib/python3.11/ensurepip/__init__.py",
             "lib/python3.11/lib-dynload/_ssl.so", "lib/python3.11/site-packages/numpy/x.py",
             "lib/python3.11/test/test_os.py", "lib/python3.11/__pycache__/os.pyc",
             "lib/python3.11/config-3.11-x86_64-linux-gnu/Makefile",
             "lib/libpython3.11.a", "include/python3.11/Python.h", "share/man/man1/p.1"]
    for name in files:
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        (prefix / name).write_text("x")
    (prefix / "bin" / "python3").symlink_to("python3.11")
    local_build.copy_python(prefix, tmp_path / "usr-local", "3.11")
    copied = sorted(str(p.relative_to(tmp_path / "usr-local"))
                    for p in (tmp_path / "usr-local").rglob("*") if not p.is_dir())
    assert copied == ["bin/python3", "bin/python3.11", "lib/libpython3.11.so.1.0",
                      "lib/python3.11/ensurepip/__init__.py", "lib/python3.11/json/__init__.py",
                      "lib/python3.11/lib-dynload/_ssl.so", "lib/python3.11/os.py"]
    assert (tmp_path / "usr-local" / "bin" / "python3").is_symlink()
    assert (tmp_path / "usr-local" / "lib" / "python3.11" / "site-packages").is_dir()


def test_local_tags_are_the_images_the_local_compile_bakes_in():
    tags = local_build.image_tags()
    assert set(tags) == set(IMAGES)
    for runtime, tag in tags.items():
        assert tag.endswith(f"/{runtime}:{importlib.metadata.version('vertex-gpu-pipelines')}")
