"""The run-state file every trainer keeps in its checkpoint folder (components.common.run_state)."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from components.common import run_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OwnError(RuntimeError):
    """Stands for a trainer's own exception class."""


STATE = run_state.StateFile("state.json", OwnError, "other settings", version=1,
                            leftovers=("vocab.pkl", "assets"),
                            leftover_suffixes=(".pth", ".pth.tmp"))
MARKER = run_state.StateFile("run.json", OwnError, "other settings", marker=True,
                             sort_keys=True, digits=64)


def test_a_fresh_run_clears_leftovers_and_saves_its_state_when_told(tmp_path):
    folder = tmp_path / "ckpt"
    assert not run_state.open_run(str(folder), STATE, {"lr": 0.1}).resumed  # no folder yet
    (folder / "assets" / "fr").mkdir(parents=True)  # another run's, with no state to resume
    # .tmp-state.json.k3x9: what a save killed mid-write leaves (unique per process)
    for name in ("lm-1.pth", "lm-2.pth.tmp", "vocab.pkl", "notes.txt", ".tmp-state.json.k3x9",
                 ".tmp-notes.txt.k3x9"):
        (folder / name).write_text("x")
    resume = run_state.open_run(str(folder), STATE, {"lr": 0.1}, fresh={"epochs_done": 0})
    assert not resume.resumed
    assert sorted(os.listdir(folder)) == [".tmp-notes.txt.k3x9", "notes.txt"]
    assert resume.state == {"version": 1, "fingerprint": run_state.fingerprint({"lr": 0.1}),
                            "epochs_done": 0}
    resume.state["epochs_done"] = 2
    resume.save()
    again = run_state.open_run(str(folder), STATE, {"lr": 0.1}, fresh={"epochs_done": 0})
    assert again.resumed and again.state["epochs_done"] == 2


def test_drop_removes_a_checkpoint_unless_it_is_kept_or_missing(tmp_path):
    resume = run_state.open_run(str(tmp_path), STATE, {"lr": 0.1})
    for name in ("lm-1.pth", "lm-2.pth"):
        (tmp_path / name).write_text("x")
    assert resume.path("lm-1.pth") == str(tmp_path / "lm-1.pth")
    resume.drop("lm-2.pth", "lm-2.pth", None)  # the one the state points at stays
    resume.drop(None)
    resume.drop("lm-3.pth")  # gone already
    resume.drop("lm-1.pth", "lm-2.pth")
    assert os.listdir(tmp_path) == ["lm-2.pth"]


def test_another_run_is_refused_and_nothing_of_it_is_removed(tmp_path):
    folder = tmp_path / "ckpt"
    run_state.open_run(str(folder), STATE, {"lr": 0.1}).save()
    assert os.listdir(folder) == ["state.json"]  # written atomically: no temporary left
    (folder / "vocab.pkl").write_text("x")
    with pytest.raises(OwnError, match=r"holds the state of a different run \(other settings\)"):
        run_state.open_run(str(folder), STATE, {"lr": 0.2})
    assert sorted(os.listdir(folder)) == ["state.json", "vocab.pkl"]  # refused, never deleted
    with pytest.raises(OwnError, match="different run"):  # another state format
        run_state.open_run(str(folder), dataclasses.replace(STATE, version=2), {"lr": 0.1})
    assert run_state.open_run(str(folder), STATE, {"lr": 0.1}).resumed


def test_a_marker_claims_a_free_folder_and_only_the_writer_writes(tmp_path):
    folder = tmp_path / "ckpt"
    worker = run_state.open_run(str(folder), MARKER, {"a": 1}, write=False)
    assert not worker.resumed and not folder.exists()  # a non-chief worker only checks
    chief = run_state.open_run(str(folder), MARKER, {"a": 1}, fresh={"replicas": 2})
    with open(folder / "run.json") as f:
        assert json.load(f) == {"fingerprint": run_state.fingerprint({"a": 1}, length=64),
                                "replicas": 2} == chief.state
    assert run_state.open_run(str(folder), MARKER, {"a": 1}, write=False).resumed
    with pytest.raises(OwnError, match="different run"):
        run_state.open_run(str(folder), MARKER, {"a": 2})


def test_a_gs_uri_is_refused_naming_its_fuse_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OwnError, match="'/gcs/bucket/ckpt'"):
        run_state.open_run("gs://bucket/ckpt", STATE, {}, write=False)
    assert os.listdir(tmp_path) == []  # no local folder named "gs:"


def test_fingerprints_ignore_key_order_and_keep_the_digits_asked_for():
    first = run_state.fingerprint({"a": 1, "b": [2]})
    assert first == run_state.fingerprint({"b": [2], "a": 1}) and len(first) == 16
    assert run_state.fingerprint({"a": 1, "b": [2]}, length=64).startswith(first)
    assert run_state.fingerprint({"a": 2, "b": [2]}) != first


def test_the_default_folder_is_inside_the_output_unless_vertex_names_one(monkeypatch):
    assert run_state.checkpoint_folder("/out/model", environ={}) == "/out/model/checkpoints"
    assert run_state.inside_output("/out/model/checkpoints/", "/out/model")
    for run in ("run-1", "run-2"):  # every run shares AIP_CHECKPOINT_DIR: a folder per task
        assert run_state.checkpoint_folder(f"/out/{run}/train/model", {
            "AIP_CHECKPOINT_DIR": "gs://b/job/ckpt"}) == f"/gcs/b/job/ckpt/{run}/train"
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", "/mnt/ckpt")  # read at call time
    folder = run_state.checkpoint_folder("/out/job-1/train/model")
    assert folder == "/mnt/ckpt/job-1/train"
    assert not run_state.inside_output(folder, "/out/job-1/train/model")
    monkeypatch.delenv("AIP_CHECKPOINT_DIR")
    assert run_state.checkpoint_folder("/out/model") == "/out/model/checkpoints"


def test_both_images_can_import_it_without_the_other_framework():
    code = ("import sys; import components.common.run_state; "
            "print(sorted({'tensorflow', 'tf_keras', 'torch', 'fastai'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_two_processes_saving_at_once_never_fail_and_leave_a_whole_file(tmp_path):
    """300 saves each from 2 processes started together: with one fixed temporary name
    they renamed each other's file away (FileNotFoundError 5 and 4 times in 300)."""
    folder, go = str(tmp_path / "ckpt"), tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "from components.common import run_state\n"
        f"open(os.path.join({str(tmp_path)!r}, 'ready-' + sys.argv[1]), 'w').close()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        "for i in range(300):\n"
        f"    run_state.save({folder!r}, 'run.json', "
        "{'fingerprint': sys.argv[1], 'i': i, 'pad': 'x' * 4000})\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, name], cwd=ROOT, env=env,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{n}").exists() for n in "ab"):  # both imported
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.write_text("")  # they start their loops together
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    with open(os.path.join(folder, "run.json")) as f:
        state = json.load(f)
    assert state["fingerprint"] in ("a", "b") and state["i"] == 299
    assert os.listdir(folder) == ["run.json"]  # no temporary file left behind
