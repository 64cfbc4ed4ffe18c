"""Shared fixtures: tiny labelled image folders written by the tests themselves."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from PIL import Image

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


EMULATOR_ATTEMPTS = 5
EMULATOR_START_SECONDS = 15


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _emulator_request(port: int, method: str, path: str) -> int | None:
    """HTTP status of `method path` on loopback `port`; None when nothing listens there,
    -1 when something listens but does not answer as an HTTP server.

    http.client, not urllib: no proxy settings from the environment get in the way.
    """
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request(method, path)
        return connection.getresponse().status
    except ConnectionRefusedError:
        return None
    except (OSError, http.client.HTTPException):
        return -1
    finally:
        connection.close()


def _start_emulator(log_path) -> tuple[subprocess.Popen, int] | None:
    """One try at starting the emulator on a free port; None when the port was lost.

    `free_port()` closes its socket before the emulator binds, so another process can
    take the port in between. The emulator then does not exit: its server thread dies
    ("Address already in use" on stderr) and the process hangs; and a connection alone
    would reach the other process. So the emulator is started with a bucket named by a
    random token and counts as ours only when that bucket is there; the bucket is
    deleted again before the tests see the emulator.
    """
    port = free_port()
    token = f"emulator-{uuid.uuid4().hex}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
             "--port", str(port), "--in-memory", "--quiet", "--default-bucket", token],
            stdout=subprocess.DEVNULL, stderr=log,
        )
    deadline = time.monotonic() + EMULATOR_START_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        status = _emulator_request(port, "GET", f"/storage/v1/b/{token}")
        if status == 200:
            if _emulator_request(port, "DELETE", f"/storage/v1/b/{token}") in (200, 204):
                return process, port
            break
        if status is not None:
            break  # another server has the port
        if b"Address already in use" in log_path.read_bytes():
            break
        time.sleep(0.1)
    _stop(process)
    return None


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    """A real GCS JSON API on loopback (gcp-storage-emulator), as `http://127.0.0.1:PORT`."""
    logs = tmp_path_factory.mktemp("gcs-emulator")
    for attempt in range(EMULATOR_ATTEMPTS):
        log_path = logs / f"stderr-{attempt}.log"
        started = _start_emulator(log_path)
        if started:
            break
    else:
        tail = log_path.read_bytes()[-2000:].decode(errors="replace")
        raise RuntimeError(f"gcp-storage-emulator did not start in {EMULATOR_ATTEMPTS} tries; "
                           f"stderr of the last:\n{tail}")
    process, port = started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process)


@pytest.fixture
def gcs(gcs_emulator, monkeypatch):
    """A google-cloud-storage client against the emulator; gcsfs sees it too."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    return storage.Client(project="test-project", credentials=AnonymousCredentials())
