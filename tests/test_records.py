"""The plain-Python TFRecord writer produces what TensorFlow reads."""

import pytest
import tensorflow as tf

from components.shard import sharding


def test_example_encoding_matches_tensorflow(tmp_path):
    features = {"image": b"\x00\xffbytes", "label": 300, "key": "cat/ü.jpg".encode(), "neg": -5}
    ours = sharding.encode_example(features)
    theirs = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[features["image"]])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[300])),
        "key": tf.train.Feature(bytes_list=tf.train.BytesList(value=[features["key"]])),
        "neg": tf.train.Feature(int64_list=tf.train.Int64List(value=[-5])),
    }))
    assert tf.train.Example.FromString(ours) == theirs


def test_framing_is_read_by_tfrecorddataset_with_crc_checks(tmp_path):
    path = tmp_path / "x.tfrecord"
    payloads = [b"", b"a", b"x" * 100_000]
    path.write_bytes(b"".join(sharding.frame_record(p) for p in payloads))
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == payloads
    data = bytearray(sharding.frame_record(b"hello world"))
    data[14] ^= 0xFF  # flip a payload byte: the data CRC no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(str(path)))
