"""TFRecord framing and `tf.train.Example` encoding in plain Python.

The sharding workers write records without importing TensorFlow: importing it in
every worker process costs seconds and hundreds of MB each, and the two formats
involved are small and stable. The reader (``components.formats.shards``) parses
them with TensorFlow, and the tests check that TensorFlow reads back what is written here.
"""

from __future__ import annotations

import struct

import google_crc32c

_CRC_MASK_DELTA = 0xA282EAD8


def _masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    """Frames one record in the TFRecord format.

    Args:
        payload: The serialized record (usually a `tf.train.Example`).

    Returns:
        length, masked CRC32C of the length, payload, masked CRC32C of the payload.
    """
    length = struct.pack("<Q", len(payload))
    return b"".join((
        length,
        struct.pack("<I", _masked_crc32c(length)),
        payload,
        struct.pack("<I", _masked_crc32c(payload)),
    ))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are encoded as 10-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _bytes_feature(values: list[bytes]) -> bytes:
    # Feature.bytes_list = 1; BytesList.value = 1 (repeated bytes)
    return _field(1, b"".join(_field(1, v) for v in values))


def _int64_feature(values: list[int]) -> bytes:
    # Feature.int64_list = 3; Int64List.value = 1 (packed varints)
    return _field(3, _field(1, b"".join(_varint(v) for v in values)))


def encode_example(features: dict[str, bytes | int]) -> bytes:
    """Serializes a `tf.train.Example` holding single bytes or int64 values.

    Args:
        features: Feature name to value; `bytes` become a BytesList, `int` an Int64List.

    Returns:
        The serialized Example, with features in sorted key order so equal inputs
        give equal bytes.
    """
    entries = []
    for name in sorted(features):
        value = features[name]
        if isinstance(value, bytes):
            feature = _bytes_feature([value])
        elif isinstance(value, int):
            feature = _int64_feature([value])
        else:
            raise TypeError(f"feature {name!r}: expected bytes or int, got {type(value).__name__}")
        # Features.feature = 1 (map<string, Feature>): entry key = 1, value = 2
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))  # Example.features = 1
