"""gs:// input listed and read through gcsfs from a real GCS API on loopback."""

import os
import socket
import urllib.parse

import pytest

from components.common.input_kinds import folder_files
from components.shard.contract import ShardingError
from components.shard.sharding import list_labelled_files
from tests.conftest import http_json, plant_bad_files, write_class_images
from tests.test_sharding import bracket_folder, shard


def _upload(client, bucket_name, root, prefix):
    bucket = client.create_bucket(bucket_name)
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            bucket.blob(prefix + os.path.relpath(path, root)).upload_from_filename(path)


def test_shards_a_gs_folder_like_a_local_one(gcs, tmp_path):
    root = str(tmp_path / "images")
    write_class_images(root, per_class=6)
    bad = plant_bad_files(root)
    _upload(gcs, "train-data", root, "datasets/pets/")
    config = dict(max_skipped_fraction=0.5, num_workers=2)
    remote = shard("gs://train-data/datasets/pets", tmp_path / "remote", **config)
    here = shard(root, tmp_path / "here", **config)
    assert remote["input_uri"] == "gs://train-data/datasets/pets"
    assert remote["classes"] == ["cat", "dog", "eel"]
    assert {s["path"] for s in remote["skipped"]} == set(bad)
    assert {i["path"] for i in remote["ignored"]} == {".DS_Store", "README.md", "cat/.hidden.jpg"}
    # the same bytes whichever way the files were reached
    assert remote["splits"] == here["splits"]


def test_missing_gs_folder_is_a_clear_error(gcs, tmp_path):
    gcs.create_bucket("empty-bucket")
    with pytest.raises(ShardingError, match=r"gs://empty-bucket/nothing-here.*does not exist"):
        list_labelled_files("gs://empty-bucket/nothing-here")


def test_brackets_in_gs_names_are_plain_characters(gcs, tmp_path):
    bracket_folder(tmp_path / "images", per_class=4)
    _upload(gcs, "bracket-data", str(tmp_path / "images"), "sets [v2]/")
    manifest = shard("gs://bracket-data/sets [v2]", tmp_path / "out", min_shards_per_split=1)
    assert manifest["classes"] == ["cat [hi-res]", "dog"]
    assert manifest["written"] == 8 and manifest["skipped"] == []


def test_the_emulator_takes_a_batch_of_concurrent_connections(gcs_emulator):
    """gcsfs reads a batch of files over ~30 connections at once. The emulator serves one
    request at a time; with socketserver's listen backlog of 5 the kernel dropped the SYNs
    past it, each costing a 1-3 s retransmission: 1.8 files/s (bench/gcs_emulator_bench.py).
    Here the first connection holds the server (it sends nothing) while the rest wait in
    the backlog: every one of 40 must get in."""
    address = urllib.parse.urlparse(gcs_emulator)
    held = []
    try:
        for _ in range(40):
            try:
                held.append(socket.create_connection((address.hostname, address.port),
                                                     timeout=0.5))
            except OSError:
                break
        connected = len(held)
    finally:
        for connection in held:
            connection.close()
    assert connected == 40
    assert http_json((address.hostname, address.port), "GET", "/storage/v1/b")[0] == 200


def test_a_gs_model_folder_is_listed_as_now_with_files_only(gcs, tmp_path):
    """The preflight and the trainer list a gs:// model folder alike (`folder_files`): an
    object under "tokenizer.json/" makes a folder, not the file, and a file added since a
    first listing is seen (gcsfs keeps listings)."""
    from components.preflight.pipeline_checks import model_name_problems
    from components.train_transformer.training import TransformerTrainingError, model_source

    bucket = gcs.create_bucket("models")
    for name in ("config.json", "model.safetensors", "tokenizer.json/inside"):
        bucket.blob(f"encoder/{name}").upload_from_string("{}")
    uri = "gs://models/encoder"
    assert folder_files(uri) == {"config.json", "model.safetensors"}
    assert "no tokenizer.json" in model_name_problems(uri)[0]
    with pytest.raises(TransformerTrainingError, match="no tokenizer.json"):
        model_source(uri, str(tmp_path))
    bucket.blob("encoder/vocab.txt").upload_from_string("a\n")
    assert model_name_problems(uri) == []
    assert model_source(uri, str(tmp_path)) == str(tmp_path / "model")
    assert sorted(os.listdir(tmp_path / "model")) == ["config.json", "model.safetensors",
                                                      "tokenizer.json", "vocab.txt"]
