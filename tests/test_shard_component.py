"""The sharding step through kfp.local: a real KFP executor run in a subprocess."""

import hashlib
import os

import pytest
from kfp import local

from components.shard import component
from components.shard.contract import read_manifest
from pipelines.definitions.steps import component as step_component
from tests.conftest import plant_bad_files, write_class_images

PARAMS = dict(image_size=16, min_shards_per_split=3, max_skipped_fraction=0.2, num_workers=2)


@pytest.fixture(scope="module")
def bucket_like_folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bucket") / "images")
    written = write_class_images(root, per_class=10)
    bad = plant_bad_files(root)
    return root, written, bad


@pytest.fixture(scope="module")
def two_runs(bucket_like_folder, tmp_path_factory):
    root, _, _ = bucket_like_folder
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path_factory.mktemp("kfp-root")))
    shard = step_component(component.shard_images, "local/unused:dev")
    return [shard(data_uri=root, **PARAMS).outputs["dataset"] for _ in range(2)]


def test_counts_label_map_and_skip_reasons(two_runs, bucket_like_folder):
    _, written, bad = bucket_like_folder
    dataset = two_runs[0]
    manifest = read_manifest(dataset.path)
    assert manifest["label_map"] == {"cat": 0, "dog": 1, "eel": 2}
    assert manifest["examples_in"] == 30 + len(bad)
    assert manifest["written"] == 30
    assert manifest["image"] == {"height": 16, "width": 16, "channels": 3, "format": "jpeg",
                                 "jpeg_quality": 95, "resize_method": "crop"}
    assert manifest["seed"] == 42 and manifest["input_uri"].endswith("images")
    skipped = {s["path"]: s["reason"] for s in manifest["skipped"]}
    assert skipped.keys() == bad.keys()
    for path, reason in bad.items():
        assert skipped[path].startswith(reason)
    ignored = {i["path"] for i in manifest["ignored"]}
    assert ignored == {".DS_Store", "README.md", "cat/.hidden.jpg"}
    totals = {name: sum(manifest["splits"][s]["class_counts"][name] for s in manifest["splits"])
              for name in written}
    assert totals == {name: len(paths) for name, paths in written.items()}
    # what the console shows
    assert dataset.metadata["written"] == 30 and dataset.metadata["skipped"] == 3
    assert dataset.metadata["missing_classes"] == len(manifest["missing_classes"])
    assert dataset.metadata["train_examples"] == manifest["splits"]["train"]["count"]


def test_same_inputs_and_seed_give_identical_shards(two_runs):
    first, second = (read_manifest(d.path) for d in two_runs)
    assert first["splits"] == second["splits"]
    for dataset in two_runs:
        for split in read_manifest(dataset.path)["splits"].values():
            for shard in split["shards"]:
                with open(os.path.join(dataset.path, shard["file"]), "rb") as f:
                    assert hashlib.sha256(f.read()).hexdigest() == shard["sha256"]

