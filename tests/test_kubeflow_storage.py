"""s3:// data for the Kubeflow target: listed and read through s3fs from a real S3 API on
loopback (moto's server), as tests/test_gcs_input.py does for gs:// with an emulator.

AWS itself cannot be reached here; moto's server answers S3's REST API on 127.0.0.1, and
the code under test talks to it as to MinIO or Ceph (`AWS_ENDPOINT_URL`).
"""

import os

import pytest

from components.preflight.data import data_fingerprint
from components.prepare_text.contract import PrepareConfig
from components.prepare_text.preparation import prepare_text_dataset
from components.shard import sharding
from components.shard.contract import ShardingError
from components.shard.listing import list_labelled_files
from components.shard.sharding import ShardConfig
from tests.conftest import plant_bad_files, write_class_images

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on a free loopback port: its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A boto3 client of the loopback server, with the environment the steps read."""
    import boto3
    import fsspec

    for name, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3_server}.items():
        monkeypatch.setenv(name, value)
    fsspec.filesystem("s3").clear_instance_cache()  # s3fs caches per endpoint settings
    return boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")


def _upload(client, bucket, root, prefix):
    client.create_bucket(Bucket=bucket)
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            client.upload_file(path, bucket, prefix + os.path.relpath(path, root))


def test_kubeflow_shards_an_s3_folder_like_a_local_one(s3, tmp_path):
    root = str(tmp_path / "images")
    write_class_images(root, per_class=6)
    bad = plant_bad_files(root)
    _upload(s3, "train-data", root, "datasets/pets/")
    config = ShardConfig(image_size=16, min_shards_per_split=2, max_skipped_fraction=0.5,
                         num_workers=2)
    remote = sharding.shard_dataset("s3://train-data/datasets/pets", str(tmp_path / "remote"),
                                    config, progress=False)
    here = sharding.shard_dataset(root, str(tmp_path / "here"), config, progress=False)
    assert remote["input_uri"] == "s3://train-data/datasets/pets"
    assert remote["classes"] == ["cat", "dog", "eel"]
    assert {s["path"] for s in remote["skipped"]} == set(bad)
    assert remote["splits"] == here["splits"]  # the same bytes whichever way they came
    # the preflight's fingerprint of the folder is the same data's
    assert data_fingerprint("s3://train-data/datasets/pets")


def test_kubeflow_missing_s3_folder_is_a_clear_error(s3):
    s3.create_bucket(Bucket="empty-bucket")
    with pytest.raises(ShardingError, match="s3://empty-bucket/nothing-here.*does not exist"):
        list_labelled_files("s3://empty-bucket/nothing-here")


def test_kubeflow_prepares_an_s3_csv(s3, tmp_path):
    rows = ["text,label"] + [f"a review number {i} about the {w},{w}"
                             for i in range(40) for w in (("price", "delivery")[i % 2],)]
    local = tmp_path / "reviews.csv"
    local.write_text("\n".join(rows) + "\n")
    s3.create_bucket(Bucket="texts")
    s3.upload_file(str(local), "texts", "in/reviews.csv")
    config = PrepareConfig(text_column="text", label_columns=("label",))
    remote = prepare_text_dataset("s3://texts/in/reviews.csv", str(tmp_path / "r"), config)
    here = prepare_text_dataset(str(local), str(tmp_path / "h"), config)
    assert remote["labels"] == here["labels"] == ["delivery", "price"]
    assert remote["splits"] == here["splits"]
    assert remote["source_sha256"] == here["source_sha256"]
    assert remote["source"] == "s3://texts/in/reviews.csv"
