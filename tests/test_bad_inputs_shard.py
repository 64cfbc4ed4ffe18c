"""The sharding step's bad inputs: a foreign output folder, linked folders, tiny classes."""

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

from components.shard import sharding
from components.shard.contract import ShardingError
from components.shard.sharding import ShardConfig
from tests.conftest import write_class_images
from tests.test_sharding import SMALL, listed, shard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------- output folder

@pytest.mark.parametrize("name,content,ours_first", [
    ("train-00000-of-00016.tfrecord", b"someone else's shard", False),
    ("manifest.json", b'{"dataset": "someone else\'s"}', False),
    ("train-00000-of-00016.tfrecord", b"copied in by hand", True),  # our manifest names none
])
def test_foreign_files_named_like_ours_are_refused_and_kept(tmp_path, image_folder, name,
                                                            content, ours_first):
    out = tmp_path / "out"
    out.mkdir()
    if ours_first:
        shard(image_folder, out)
    (out / name).write_bytes(content)
    before = sorted(os.listdir(out))
    with pytest.raises(ShardingError) as err:
        shard(image_folder, out)
    message = str(err.value)
    assert str(out) in message and name in message
    assert "empty output folder" in message and "remove" in message
    assert sorted(os.listdir(out)) == before  # an earlier output is still whole
    assert (out / name).read_bytes() == content


# A re-run over our own output: tests/test_sharding.py::test_rerun_replaces_previous_output


def test_rerun_after_a_killed_run_removes_its_leftovers(tmp_path, image_folder):
    out = tmp_path / "out"
    shard(image_folder, out)
    # A run killed (no exception handler runs) after one shard and half of another.
    script = textwrap.dedent(f"""
        import os
        from components.shard import sharding

        def killed(tasks, workers, progress):
            sharding.write_shard(tasks[0])
            with open(os.path.join({str(out)!r}, ".tmp-" + tasks[1].filename), "wb") as f:
                f.write(b"half a shard")
            os._exit(9)

        sharding.run_tasks = killed
        config = sharding.ShardConfig(image_size=16, min_shards_per_split=3, num_workers=1)
        sharding.shard_dataset({image_folder!r}, {str(out)!r}, config, progress=False)
    """)
    assert subprocess.run([sys.executable, "-c", script], cwd=REPO).returncode == 9
    left = os.listdir(out)
    assert "manifest.json" not in left and "train-00000-of-00003.tfrecord" in left
    manifest = shard(image_folder, out)
    assert sorted(os.listdir(out)) == sorted(listed(manifest) + ["manifest.json"])


def test_a_failed_run_leaves_nothing_behind(tmp_path, image_folder, monkeypatch):
    out = tmp_path / "out"
    shard(image_folder, out)

    def fails(tasks, workers, progress):
        sharding.write_shard(tasks[0])
        raise RuntimeError("disk full")

    monkeypatch.setattr(sharding, "run_tasks", fails)
    with pytest.raises(RuntimeError, match="disk full"):
        shard(image_folder, out)
    assert os.listdir(out) == []


def _killed_on_validation(task: sharding.ShardTask) -> dict:
    """write_shard, but the worker is killed (as for lack of memory) on a validation shard."""
    if task.filename.startswith("validation"):
        os.kill(os.getpid(), signal.SIGKILL)
    return sharding.write_shard(task)


def test_a_worker_killed_mid_run_fails_the_step_and_leaves_nothing(tmp_path, image_folder,
                                                                    monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(sharding, "run_tasks",
                        functools.partial(sharding.run_tasks, worker_fn=_killed_on_validation))
    with pytest.raises(ShardingError, match="worker process died.*num_workers"):
        shard(image_folder, out, num_workers=2)
    assert os.listdir(out) == []


# ----------------------------------------------------------------------- linked folders

def test_linked_folder_inside_a_class_is_followed_and_loops_are_not(tmp_path):
    root = tmp_path / "data"
    write_class_images(str(root), per_class=6)
    elsewhere = tmp_path / "elsewhere" / "more"
    elsewhere.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (20, 20), (220, 40, 40)).save(elsewhere / f"x{i}.jpg")
    os.symlink(elsewhere, root / "cat" / "sub")
    os.symlink(root / "cat", root / "cat" / "sub-loop")     # the class folder itself
    os.symlink(elsewhere.parent, elsewhere / "up")          # a loop inside the linked folder
    os.symlink(root / "dog", root / "cat" / "dogs")         # another class's folder

    manifest = shard(root, tmp_path / "out")
    assert manifest["skipped"] == []
    assert manifest["examples_in"] == manifest["written"] == 18 + 3
    totals = {c: sum(s["class_counts"][c] for s in manifest["splits"].values())
              for c in manifest["classes"]}
    assert totals == {"cat": 9, "dog": 6, "eel": 6}
    ignored = {i["path"]: i["reason"] for i in manifest["ignored"]}
    assert ignored["cat/sub-loop"].startswith("symbolic link loop")
    assert ignored["cat/sub/up"].startswith("symbolic link loop")
    assert ignored["cat/dogs"].startswith("symbolic link to a folder listed already")
    assert str(root / "dog") in ignored["cat/dogs"]
    assert len(ignored) == 3


# ----------------------------------------------------------------------- tiny classes

@pytest.mark.parametrize("n_images", [1, 2])
def test_class_too_small_for_every_split_is_warned_and_recorded(tmp_path, caplog, n_images):
    root = tmp_path / "data"
    write_class_images(str(root), per_class=10)
    (root / "solo").mkdir()
    for i in range(n_images):
        Image.new("RGB", (20, 20), (90, 90, 90)).save(root / "solo" / f"{i}.jpg")
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger=sharding.__name__):
        manifest = shard(root, out)
    assert manifest["splits"]["train"]["class_counts"]["solo"] == n_images
    gaps = manifest["missing_classes"]
    assert [(g["class"], g["splits"]) for g in gaps] == [("solo", ["validation", "test"])]
    assert gaps[0]["reason"].startswith(f"{n_images} file(s) listed: too few")
    assert "validation_fraction=0.1" in gaps[0]["reason"]
    with open(out / "manifest.json") as f:
        assert json.load(f)["missing_classes"] == gaps
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'solo'" in warnings[0] and "validation, test" in warnings[0]


def test_a_class_whose_only_test_file_is_unreadable_is_recorded(tmp_path):
    root = tmp_path / "data"
    written = write_class_images(str(root), per_class=10)
    config = ShardConfig(**SMALL, max_skipped_fraction=0.5)
    splits = sharding.stratified_split(written, sorted(written), config.fractions, config.seed)
    [drawn] = [path for path, _ in splits["test"] if path.startswith("dog/")]
    (root / drawn).write_bytes(b"")
    manifest = sharding.shard_dataset(str(root), str(tmp_path / "out"), config, progress=False)
    assert [s["path"] for s in manifest["skipped"]] == [drawn]
    [gap] = manifest["missing_classes"]
    assert gap["class"] == "dog" and gap["splits"] == ["test"]
    assert gap["reason"] == ("the file(s) drawn for test are unusable (see skipped); fix or "
                             "replace them")


def test_a_split_asked_to_be_empty_is_no_gap(tmp_path):
    root = tmp_path / "data"
    write_class_images(str(root), per_class=10)
    manifest = shard(root, tmp_path / "out", train_fraction=0.9, validation_fraction=0.1,
                     test_fraction=0.0)
    assert manifest["missing_classes"] == []
