"""The image trainer's workers as separate machines (issue 35, part 1).

Two MultiWorkerMirroredStrategy workers (a process each, loopback CPUs), each with its own
local disk (TMPDIR) and its own view (a symlink) of one shared folder standing for /gcs: the
`AIP_CHECKPOINT_DIR` and the model folder (the same path on both). Every file each worker
opens, renames, removes or creates there is recorded, by machine, by a C library preloaded
into each (LD_PRELOAD): TensorFlow writes from C++, where no Python audit event is raised.
Without a C compiler the other checks run and the test is then skipped.

tests/site/slow_calls.py (`TEST_SLOW_CALL`) makes the chief slow to write the model folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")

from tests.conftest import (  # noqa: E402
    free_port,
    kill_group,
    shard_colour_classes,
    wait_all,
)

REPO = Path(__file__).resolve().parents[1]
SITE = REPO / "tests" / "site"  # slow_calls.py, put in place by its sitecustomize.py
IMAGE_SIZE = 32  # DenseNet121's smallest input
MODEL = "job-1/train/model"  # the model folder, relative to the shared folder
CHECKPOINTS = "checkpoints/job-1/train"  # resolve_dirs' folder under AIP_CHECKPOINT_DIR
# Head phase only (a frozen base traces and steps fastest), one example per worker a step.
PARAMS = dict(epochs=2, fine_tune_epochs=0, batch_size=1, precision="off", steps_per_epoch=2,
              early_stopping_patience=0, reduce_lr_patience=0)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    """A sharded dataset of 32x32 images, 3 classes x 6."""
    return shard_colour_classes(tmp_path_factory.mktemp("replica_data"), 6, IMAGE_SIZE)


# Records every successful open (reads too), fopen, rename, unlink, rmdir and mkdir under
# FILE_AUDIT_PREFIXES, a line per call: machine, pid, event, write (0/1), absolute path(s).
_AUDIT_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static __thread int busy;

static int absolute(int dirfd, const char *path, char *out, size_t size) {
    char dir[PATH_MAX];
    if (!path) return 0;
    if (path[0] == '/') return snprintf(out, size, "%s", path) > 0;
    if (dirfd == AT_FDCWD) {
        if (!getcwd(dir, sizeof dir)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, dir, sizeof dir - 1);
        if (n < 0) return 0;
        dir[n] = 0;
    }
    return snprintf(out, size, "%s/%s", dir, path) > 0;
}

static int matches(const char *path) {
    const char *p = getenv("FILE_AUDIT_PREFIXES");
    while (p && *p) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n && strncmp(path, p, n) == 0 && (path[n] == '/' || path[n] == 0)) return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

static void note(const char *event, int writes, int fd1, const char *p1, int fd2,
                 const char *p2) {
    char a[PATH_MAX * 2] = "", b[PATH_MAX * 2] = "", line[PATH_MAX * 5], name[PATH_MAX];
    if (busy) return;
    busy = 1;
    int saved = errno;
    absolute(fd1, p1, a, sizeof a);
    if (p2) absolute(fd2, p2, b, sizeof b);
    if ((a[0] && matches(a)) || (b[0] && matches(b))) {
        int n = snprintf(line, sizeof line, "%s\t%d\t%s\t%d\t%s\t%s\n",
                         getenv("FILE_AUDIT_MACHINE"), (int)getpid(), event, writes, a, b);
        snprintf(name, sizeof name, "%s/%d.tsv", getenv("FILE_AUDIT_LOG"), (int)getpid());
        int fd = syscall(SYS_openat, AT_FDCWD, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                         0644);
        if (fd >= 0) {
            syscall(SYS_write, fd, line, (size_t)n);
            syscall(SYS_close, fd);
        }
    }
    errno = saved;
    busy = 0;
}

#define REAL(name) \
    static __typeof__(name) *real = NULL; \
    if (!real) real = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)
#define WRITES(flags) (((flags) & O_ACCMODE) != O_RDONLY || ((flags) & (O_CREAT | O_TRUNC)))
#define MODE(flags) \
    mode_t mode = 0; \
    if ((flags) & (O_CREAT | O_TMPFILE)) { \
        va_list args; va_start(args, flags); mode = va_arg(args, int); va_end(args); \
    }
/* One wrapper: call the real function, note a call that succeeded (`ok` of its result r). */
#define WRAP(type, name, params, before, args, ok, event, writes, d1, p1, d2, p2) \
    type name params { \
        before REAL(name); type r = real args; \
        if (ok) note(event, writes, d1, p1, d2, p2); \
        return r; \
    }
#define OPEN(name, params, args, d) \
    WRAP(int, name, params, MODE(flags);, args, r >= 0, "open", WRITES(flags), d, p, AT_FDCWD, NULL)
#define OPEN_2(name, params, args, d) \
    WRAP(int, name, params, , args, r >= 0, "open", WRITES(flags), d, p, AT_FDCWD, NULL)
#define FOPEN(name) WRAP(FILE *, name, (const char *p, const char *m), , (p, m), r, "open", \
                         strpbrk(m, "wa+") != NULL, AT_FDCWD, p, AT_FDCWD, NULL)

OPEN(open, (const char *p, int flags, ...), (p, flags, mode), AT_FDCWD)
OPEN(open64, (const char *p, int flags, ...), (p, flags, mode), AT_FDCWD)
OPEN(openat, (int d, const char *p, int flags, ...), (d, p, flags, mode), d)
OPEN(openat64, (int d, const char *p, int flags, ...), (d, p, flags, mode), d)
OPEN_2(__open_2, (const char *p, int flags), (p, flags), AT_FDCWD)
OPEN_2(__open64_2, (const char *p, int flags), (p, flags), AT_FDCWD)
OPEN_2(__openat_2, (int d, const char *p, int flags), (d, p, flags), d)
OPEN_2(__openat64_2, (int d, const char *p, int flags), (d, p, flags), d)
WRAP(int, creat, (const char *p, mode_t m), , (p, m), r >= 0, "open", 1, AT_FDCWD, p, AT_FDCWD,
     NULL)
FOPEN(fopen)
FOPEN(fopen64)
WRAP(int, rename, (const char *a, const char *b), , (a, b), r == 0, "rename", 1, AT_FDCWD, b,
     AT_FDCWD, a)
WRAP(int, renameat, (int fa, const char *a, int fb, const char *b), , (fa, a, fb, b), r == 0,
     "rename", 1, fb, b, fa, a)
WRAP(int, renameat2, (int fa, const char *a, int fb, const char *b, unsigned int flags), ,
     (fa, a, fb, b, flags), r == 0, "rename", 1, fb, b, fa, a)
WRAP(int, unlink, (const char *p), , (p), r == 0, "remove", 1, AT_FDCWD, p, AT_FDCWD, NULL)
WRAP(int, unlinkat, (int d, const char *p, int flags), , (d, p, flags), r == 0,
     (flags & AT_REMOVEDIR) ? "rmdir" : "remove", 1, d, p, AT_FDCWD, NULL)
WRAP(int, rmdir, (const char *p), , (p), r == 0, "rmdir", 1, AT_FDCWD, p, AT_FDCWD, NULL)
WRAP(int, mkdir, (const char *p, mode_t m), , (p, m), r == 0, "mkdir", 1, AT_FDCWD, p, AT_FDCWD,
     NULL)
WRAP(int, mkdirat, (int d, const char *p, mode_t m), , (d, p, m), r == 0, "mkdir", 1, d, p,
     AT_FDCWD, NULL)
"""


_NO_COMPILER = "no C compiler (cc or gcc): the other checks passed, the file record was not kept"


@pytest.fixture(scope="module")
def audit_library(tmp_path_factory) -> str | None:
    """The file-access recorder (`_AUDIT_C`) built as a shared library; None without a
    C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None
    root = tmp_path_factory.mktemp("audit_library")
    (root / "audit.c").write_text(_AUDIT_C)
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(root / "audit.so"),
                    str(root / "audit.c"), "-ldl"], check=True, capture_output=True)
    return str(root / "audit.so")


# One Vertex replica: the KFP component function, as the container runs it.
_WORKER = """
import json, logging, sys
from kfp import dsl
from components.train_image.component import train_image_classifier
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
dataset, model_dir, params, out = sys.argv[1:]
model, metrics = dsl.Model(uri=model_dir), dsl.Metrics(uri=out + ".metrics")
train_image_classifier(dataset=dsl.Dataset(uri=dataset), model=model, metrics=metrics,
                       **json.loads(params))
json.dump({"metrics": metrics.metadata, "model": model.metadata}, open(out, "w"))
"""


class _Machines:
    """2 workers as separate machines sharing one folder (/gcs); see the module docstring."""

    def __init__(self, root: Path, library: str | None):
        self.root, self.library = root, library
        self.shared = root / "shared"
        self.audit = root / "audit"
        for folder in (self.shared, self.audit):
            folder.mkdir(exist_ok=True)
        self.model_dir = self.shared / MODEL

    def view(self, index: int) -> Path:
        return self.root / f"machine{index}" / "gcs"

    def start(self, dataset: str, name: str, params: dict, **more: str) -> list:
        """Starts both workers (chief = workerpool0, worker = workerpool1), each in its own
        process group (a machine: killed whole); their results go to `<name><i>.json`."""
        hosts = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
        workers = []
        for index in (0, 1):
            machine = self.root / f"machine{index}"
            (machine / "tmp").mkdir(parents=True, exist_ok=True)
            if not self.view(index).exists():
                self.view(index).symlink_to(self.shared, target_is_directory=True)
            spec = {"cluster": {"workerpool0": hosts[:1], "workerpool1": hosts[1:]},
                    "task": {"type": f"workerpool{index}", "index": 0},
                    "environment": "cloud"}
            env = {k: v for k, v in os.environ.items()
                   if k not in ("TF_CONFIG", "CLUSTER_SPEC", "AIP_CHECKPOINT_DIR",
                                "AIP_TENSORBOARD_LOG_DIR", "LD_PRELOAD")}
            env.update(PYTHONPATH=os.pathsep.join([str(SITE), str(REPO)]),
                       CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2",
                       OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                       TMPDIR=str(machine / "tmp"), CLUSTER_SPEC=json.dumps(spec),
                       AIP_CHECKPOINT_DIR=str(self.view(index) / "checkpoints"), **more)
            if self.library:
                env.update(LD_PRELOAD=self.library, FILE_AUDIT_LOG=str(self.audit),
                           FILE_AUDIT_MACHINE=str(index),
                           FILE_AUDIT_PREFIXES=f"{self.shared}:{self.view(index)}")
            out = self.root / f"{name}{index}.json"
            with open(f"{out}.log", "w") as log:
                process = subprocess.Popen(
                    [sys.executable, "-c", _WORKER, dataset, str(self.model_dir),
                     json.dumps(params), str(out)],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            workers.append((process, out))
        return workers

    def audited(self) -> list[dict]:
        """The file accesses recorded so far, paths relative to the shared folder; the
        record is emptied."""
        records = []
        prefixes = [str(self.shared)] + [str(self.view(i)) for i in (0, 1)]
        for path in self.audit.iterdir():
            for line in path.read_text().splitlines():
                machine, pid, event, write, *paths = line.split("\t")
                relative = []
                for p in paths:
                    prefix = next((x for x in prefixes if p == x or p.startswith(x + "/")), None)
                    relative.append(p[len(prefix) + 1:] if prefix else p)
                records.append({"machine": machine, "pid": pid, "event": event,
                                "write": write == "1", "path": relative[0],
                                "source": relative[1]})
            path.unlink()
        return records


def _log(out: Path) -> str:
    return Path(f"{out}.log").read_text()[-4000:]


def _wait(workers: list, timeout: float) -> list[float]:
    """Waits for both workers (conftest.wait_all); the times they ended."""
    return wait_all([process for process, _ in workers], timeout,
                    lambda: "the workers did not finish: " + _log(workers[0][1]))


def _epochs_logged(out: Path) -> list[int]:
    return [int(line.split("head epoch ")[1].split(":")[0])
            for line in Path(f"{out}.log").read_text().splitlines() if "head epoch " in line]


@pytest.mark.slow
def test_workers_on_separate_machines_wait_for_a_slow_chief_that_alone_writes(
        dataset, densenet_weights, audit_library, tmp_path):
    """The chief sleeps before writing the model; the other worker ends cleanly only after
    the chief's outputs exist, and never touches the model folder: the chief alone writes
    it, the run state and the history. The other worker writes only TensorFlow's
    temporaries of its own name (`workertemp_<task>`) in the checkpoint folder."""
    machines = _Machines(tmp_path, audit_library)
    workers = machines.start(dataset, "run", {**PARAMS, "weights": densenet_weights},
                             TEST_SLOW_CALL="components.train_image.training:write_artifact=8")
    ended = _wait(workers, 420)
    for process, out in workers:
        assert process.returncode == 0 and "Traceback" not in _log(out), _log(out)
    chief, worker = (json.loads(out.read_text()) for _, out in workers)
    assert (chief["model"]["strategy"], chief["model"]["replicas"]) == ("multi_worker", 2)
    figures = [[run["metrics"][k] for k in ("train_loss", "val_loss", "epochs_run")]
               for run in (chief, worker)]
    assert figures[0] == pytest.approx(figures[1], rel=1e-6)
    assert "sleeping 8.0 s before components.train_image.training:write_artifact" in _log(
        workers[0][1])
    assert "TEST_SLOW_CALL" not in _log(workers[1][1])  # the other worker never writes it
    written = [p for p in machines.model_dir.rglob("*") if p.is_file()]
    assert {"model.keras", "labels.json", "preprocessing.json", "history.json",
            "saved_model.pb"} <= {p.name for p in written}
    # The other worker waited for the chief's last output.
    assert max(p.stat().st_mtime for p in written) <= ended[1]
    assert not (machines.shared / CHECKPOINTS).exists()  # the state is cleared
    leftovers = [p for p in machines.shared.rglob("*")
                 if p.name.startswith(".tmp") or "workertemp" in p.name or
                 p.name.endswith(".tmp")]
    assert leftovers == []

    if audit_library is None:
        pytest.skip(_NO_COMPILER)
    audit = machines.audited()
    model = [r for r in audit if r["path"].startswith(MODEL + "/") or
             r["source"].startswith(MODEL + "/")]
    assert model and {r["machine"] for r in model} == {"0"}, [
        r for r in model if r["machine"] != "0"][:10]
    renamed = Counter(r["path"].rsplit("/", 1)[1] for r in model if r["event"] == "rename")
    assert {name: renamed[name] for name in ("labels.json", "preprocessing.json",
                                             "history.json")} == dict.fromkeys(
        ("labels.json", "preprocessing.json", "history.json"), 1)
    state = [r for r in audit if r["write"] and r["path"].startswith(CHECKPOINTS + "/")]
    run_file = [r for r in state if "run.json" in r["path"]]
    assert run_file and {r["machine"] for r in run_file} == {"0"}
    # The other worker's writes: TensorFlow's temporaries named after its task, removed
    # (and the folders above them, where it gets there before the chief).
    temporary = f"{CHECKPOINTS}/backup-head/workertemp_0"
    others = [r for r in audit if r["write"] and r["machine"] == "1"]
    assert any(r["path"].startswith(temporary + "/") for r in others), others
    assert all(r["path"].startswith(temporary + "/") or r["path"] == temporary or
               (r["event"] == "mkdir" and temporary.startswith(r["path"] + "/"))
               for r in others), [r for r in others if "workertemp" not in r["path"]]
    # Temporaries (what is renamed into place) are each written by one process only.
    sources = {r["source"] for r in audit if r["event"] == "rename"}
    writers = {}
    for r in audit:
        if r["event"] == "open" and r["write"] and r["path"] in sources:
            writers.setdefault(r["path"], set()).add(r["pid"])
    assert writers and all(len(pids) == 1 for pids in writers.values()), writers

@pytest.mark.slow
def test_a_worker_killed_mid_run_and_restarted_resumes_on_both(dataset, densenet_weights,
                                                                audit_library, tmp_path):
    """The non-chief worker's machine dies after the first epoch's backup. The chief fails
    instead of hanging; the restarted job (both workers, as Vertex restarts it) resumes
    from that backup on both and finishes the run."""
    params = {**PARAMS, "weights": densenet_weights}
    machines = _Machines(tmp_path, audit_library)
    checkpoints = machines.shared / CHECKPOINTS
    workers = machines.start(dataset, "first", params)
    try:
        deadline = time.monotonic() + 300
        while not (checkpoints / "backup-head" / "chief" / "checkpoint").exists():
            assert all(p.poll() is None for p, _ in workers), [_log(o) for _, o in workers]
            assert time.monotonic() < deadline, "no backup was saved"
            time.sleep(0.05)
        kill_group(workers[1][0])  # preempted: no chance to clean up
        started = time.monotonic()
        workers[0][0].wait(timeout=180)  # its peer is gone: it fails, it does not hang
        failed_after = time.monotonic() - started
    finally:
        for process, _ in workers:
            kill_group(process)
    assert workers[0][0].returncode != 0, _log(workers[0][1])
    assert not (machines.model_dir / "model.keras").exists()
    done = [r["epoch"] for r in json.loads((checkpoints / "history-head.json").read_text())]
    assert done == [0], done  # killed in the second epoch
    first_record = json.loads((checkpoints / "history-head.json").read_text())[0]
    machines.audited()

    workers = machines.start(dataset, "restart", params)  # the same machines, restarted
    _wait(workers, 420)
    for process, out in workers:
        assert process.returncode == 0, _log(out)
    chief = json.loads(workers[0][1].read_text())
    assert chief["metrics"]["epochs_run"] == 2 and chief["metrics"]["replicas"] == 2
    # Both resumed after the epoch backed up: none is run twice.
    assert _epochs_logged(workers[0][1]) == _epochs_logged(workers[1][1]) == [1], _log(
        workers[0][1])
    history = json.loads((machines.model_dir / "history.json").read_text())["head"]
    assert [r["epoch"] for r in history] == [0, 1]
    assert history[0] == pytest.approx(first_record)  # the first attempt's epoch, kept
    assert not checkpoints.exists()
    print(f"the chief failed {failed_after:.1f} s after its peer was killed")
    if audit_library is None:
        pytest.skip(_NO_COMPILER)
    backup = f"{CHECKPOINTS}/backup-head/chief/"
    restored = {r["machine"] for r in machines.audited()
                if r["path"].startswith(backup) and not r["write"]}
    assert restored == {"0", "1"}  # both read the chief's backup
