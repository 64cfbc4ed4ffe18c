"""Shared fixtures: tiny labelled image folders written by the tests themselves."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from pipelines import gcs_api

# A colour per class keeps tiny datasets learnable by tiny models.
CLASS_COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 40), "eel": (40, 40, 220)}


def write_class_images(root: str, per_class: int = 12, size: tuple[int, int] = (40, 30),
                       seed: int = 0) -> dict[str, list[str]]:
    """Writes `<root>/<class>/<i>.<ext>` images in assorted formats and colour modes.

    Returns:
        Class name to the relative paths written.
    """
    rng = np.random.default_rng(seed)
    written: dict[str, list[str]] = {}
    modes = ["RGB", "L", "P", "RGBA", "CMYK"]
    for name, colour in CLASS_COLOURS.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            noise = rng.integers(-30, 30, (size[1], size[0], 3))
            pixels = np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels, "RGB")
            mode = modes[i % len(modes)]
            image = image.convert(mode)
            # JPEG cannot hold P or RGBA: those go to PNG, as in real buckets.
            ext = "png" if mode in ("P", "RGBA") else "jpg"
            relative = f"{name}/{i:03d}.{ext}"
            image.save(os.path.join(root, relative))
            written.setdefault(name, []).append(relative)
    return written


def plant_bad_files(root: str) -> dict[str, str]:
    """Adds files a real bucket has: bad images in class folders, strays outside them.

    Returns:
        Relative path of each planted bad image to the start of its expected skip reason.
    """
    with open(os.path.join(root, "cat", "empty.jpg"), "wb"):
        pass
    with open(os.path.join(root, "cat", "000.jpg"), "rb") as f:
        data = f.read()
    with open(os.path.join(root, "dog", "truncated.jpg"), "wb") as f:
        f.write(data[: len(data) // 3])
    with open(os.path.join(root, "eel", "notes.txt"), "w") as f:
        f.write("not an image\n")
    with open(os.path.join(root, ".DS_Store"), "wb") as f:
        f.write(b"\0\0\0\1Bud1")
    with open(os.path.join(root, "README.md"), "w") as f:
        f.write("# my dataset\n")
    with open(os.path.join(root, "cat", ".hidden.jpg"), "wb") as f:
        f.write(data)
    return {
        "cat/empty.jpg": "empty file",
        "dog/truncated.jpg": "unreadable image",
        "eel/notes.txt": "not a recognised image format",
    }


@pytest.fixture
def image_folder(tmp_path) -> str:
    """12 images per class in three classes, no bad files."""
    root = str(tmp_path / "images")
    write_class_images(root)
    return root


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """A real GCS JSON API on loopback (gcp-storage-emulator), as `http://127.0.0.1:PORT`."""
    process, url = gcs_api.start_emulator(tmp_path_factory.mktemp("gcs-emulator"))
    try:
        yield url
    finally:
        gcs_api.stop(process)


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    """A google-cloud-storage client against the emulator; gcsfs sees it too."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    return storage.Client(project="test-project", credentials=AnonymousCredentials())
