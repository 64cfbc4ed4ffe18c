"""A real Cloud Storage JSON API on loopback (gcp-storage-emulator): for tests and rehearsals.

Steps read their raw inputs (`data_uri`, LM assets) through the Cloud Storage API (gcsfs), and
write outputs through Vertex's `/gcs` FUSE mount. Where no Google endpoint is reachable the
API is this emulator: google-cloud-storage and gcsfs both honour `STORAGE_EMULATOR_HOST`.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ATTEMPTS = 5
START_SECONDS = 15
# The repository root: `tools` is not installed, it imports from there.
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _request(port: int, method: str, path: str) -> int | None:
    """HTTP status of `method path` on loopback `port` (http.client: no proxy settings);
    None when nothing listens, -1 when what listens is no HTTP server."""
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


def _start_once(log_path: Path, module: str) -> tuple[subprocess.Popen, int] | None:
    """One try at starting `python -m MODULE start` on a free port; None when the port was
    lost.

    Another process can take the port first, and the emulator then hangs: it counts as ours
    only once a bucket named by a random token is there (deleted again at once).
    """
    port = free_port()
    token = f"emulator-{uuid.uuid4().hex}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "start", "--host", "127.0.0.1",
             "--port", str(port), "--in-memory", "--quiet", "--default-bucket", token],
            stdout=subprocess.DEVNULL, stderr=log,
            cwd=REPO,  # where `tools` imports from, whatever the caller's folder
        )
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        status = _request(port, "GET", f"/storage/v1/b/{token}")
        if status == 200:
            if _request(port, "DELETE", f"/storage/v1/b/{token}") in (200, 204):
                return process, port
            break
        if status is not None:
            break  # another server has the port
        if b"Address already in use" in log_path.read_bytes():
            break
        time.sleep(0.1)
    stop(process)
    return None


def start_emulator(log_folder: str | os.PathLike, module: str = "tools.rehearsal.gcs_api"
                   ) -> tuple[subprocess.Popen, str]:
    """Starts an in-memory emulator (this module's; `gcp_storage_emulator`: as it ships);
    returns the process and its `http://127.0.0.1:PORT`."""
    Path(log_folder).mkdir(parents=True, exist_ok=True)
    for attempt in range(ATTEMPTS):
        log_path = Path(log_folder) / f"gcs-emulator-{attempt}.log"
        started = _start_once(log_path, module)
        if started:
            process, port = started
            return process, f"http://127.0.0.1:{port}"
    tail = log_path.read_bytes()[-2000:].decode(errors="replace")
    raise RuntimeError(f"gcp-storage-emulator did not start in {ATTEMPTS} tries; stderr of "
                       f"the last:\n{tail}")


def seed(url: str, folder: str | os.PathLike) -> int:
    """Uploads `folder/<bucket>/<path>` as `gs://<bucket>/<path>` to the emulator at `url`
    (an anonymous google-cloud-storage client); returns the file count."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage as gcs

    storage = gcs.Client(project="emulator", credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": url})
    count = 0
    for bucket_dir in sorted(Path(folder).iterdir()):
        if not bucket_dir.is_dir():
            continue
        bucket = storage.create_bucket(bucket_dir.name)
        for path in sorted(bucket_dir.rglob("*")):
            if path.is_file():
                bucket.blob(path.relative_to(bucket_dir).as_posix()).upload_from_filename(
                    str(path))
                count += 1
    return count


# The emulator's HTTPServer keeps socketserver's listen backlog of 5: gcsfs reads a batch
# over ~30 connections at once, and each SYN dropped past the backlog costs a 1-3 s
# retransmission (bench/gcs_emulator_bench.py). Requests are still served one at a time.
LISTEN_BACKLOG = 1024


def main(argv: list[str] | None = None) -> None:
    """`python -m tools.rehearsal.gcs_api start ...`: gcp-storage-emulator's command line, with a
    listen backlog that takes a whole batch of concurrent reads."""
    from http import server

    from gcp_storage_emulator.__main__ import main as emulator_main

    server.HTTPServer.request_queue_size = LISTEN_BACKLOG
    emulator_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
