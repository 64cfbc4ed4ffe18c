"""Writing the shards: the output folder, the shard writers, the TFRecord format.

Only files this step can prove its own (named by its manifest or a killed run's claim) are
removed; others named like its output stop the run. Records are encoded in plain Python:
TensorFlow in every worker costs seconds and hundreds of MB.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import re
import struct
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import google_crc32c

from components.common.images import BadImage, decode_image, encode_image, resize
from components.common.storage import TMP_PREFIX, filesystem, local_path, write_json_atomically
from components.shard.contract import (
    IMAGE_KEY,
    KEY_KEY,
    LABEL_KEY,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    SPLITS,
    ShardConfig,
    ShardingError,
)

# The names this step writes; one it cannot prove its own (`own_files`) stops the run.
_OWN_FILE = re.compile(rf"^({re.escape(TMP_PREFIX)})?"
                       rf"(({'|'.join(SPLITS)})-\d{{5}}-of-\d{{5}}\.tfrecord|{re.escape(MANIFEST_NAME)})$")
# Names the files a run is writing until its manifest does (see `claim_output`).
CLAIM_NAME = ".shard-claim.json"


def own_files(out_dir: str) -> set[str]:
    """Names in `out_dir` this step can prove it wrote (the manifest and its shards, what
    a claim names, their temporary names); a manifest not this step's proves nothing."""
    names = {CLAIM_NAME}
    try:
        with open(os.path.join(out_dir, MANIFEST_NAME)) as f:
            manifest = json.load(f)
        if manifest["format_version"] == MANIFEST_VERSION:
            names |= {MANIFEST_NAME} | {str(shard["file"]) for split in SPLITS
                                        for shard in manifest["splits"][split]["shards"]}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    try:
        with open(os.path.join(out_dir, CLAIM_NAME)) as f:
            names |= {str(name) for name in json.load(f)["files"]}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return names | {TMP_PREFIX + name for name in names}


def claim_output(out_dir: str, names: list[str]) -> None:
    """Records the files a run is about to write: the proof a killed run's leftovers are ours."""
    write_json_atomically(os.path.join(out_dir, CLAIM_NAME),
                          {"files": sorted(set(names) | {MANIFEST_NAME})})


def remove_own_files(out_dir: str) -> None:
    """Removes `own_files`: the manifest first (nothing looks whole), the claim last."""
    present = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
    claims = [name for name in (CLAIM_NAME, TMP_PREFIX + CLAIM_NAME) if name in present]
    doomed = sorted((present & own_files(out_dir)) - set(claims))
    if doomed:
        claim_output(out_dir, doomed)
        claims = [CLAIM_NAME]
    for name in sorted(doomed, key=lambda n: n != MANIFEST_NAME) + claims:
        os.remove(os.path.join(out_dir, name))


def clear_output(out_dir: str) -> None:
    """Removes what an earlier run of this step wrote; other files are left alone.

    Raises:
        ShardingError: Files named like its output that nothing proves its own.
    """
    if not os.path.isdir(out_dir):
        return
    foreign = sorted(name for name in set(os.listdir(out_dir)) - own_files(out_dir)
                     if _OWN_FILE.match(name))
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise ShardingError(
            f"output folder {out_dir!r} holds {', '.join(foreign[:5])}{more}, named like this "
            "step's output but named by no manifest of this step, so perhaps another "
            "dataset's; they are left alone: choose an empty output folder, or move or "
            "remove those files")
    remove_own_files(out_dir)


def check_output_folder(data_uri: str, out_dir: str) -> None:
    """Refuses an output folder inside the input folder, or the reverse.

    Raises:
        ShardingError: The two folders overlap.
    """
    if data_uri.startswith("s3://"):
        return  # an S3 bucket is never a local folder
    source = os.path.realpath(local_path(data_uri))  # gs:// as its FUSE path
    target = os.path.realpath(out_dir)
    if os.path.commonpath([source, target]) in (source, target):
        raise ShardingError(
            f"output folder {out_dir!r} and input folder {data_uri!r} overlap: the shards "
            "would be read as images next time, or the images overwritten; write the "
            "output outside the input folder")


def process_image(data: bytes, config: ShardConfig) -> bytes:
    """Decode, convert to RGB, resize and encode one image file's bytes."""
    image = resize(decode_image(data, config.image_size), config.image_size, config.resize_method)
    return encode_image(image, config.image_format, config.jpeg_quality)


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One shard for one worker to write."""

    data_uri: str
    out_dir: str
    filename: str
    items: list[tuple[str, int]]  # (path relative to data_uri, label)
    config: ShardConfig


_READ_BATCH = 32  # files fetched concurrently per request (gcsfs fetches a batch in parallel)


def read_files(data_uri: str, paths: list[str]) -> Iterable[tuple[str, bytes | Exception]]:
    """Yields `(path, bytes or the error)` for files under `data_uri`, fetched in batches."""
    fs, root = filesystem(data_uri)
    root = root.rstrip("/")
    for start in range(0, len(paths), _READ_BATCH):
        batch = paths[start:start + _READ_BATCH]
        full = [f"{root}/{p}" for p in batch]
        # cat_ranges, not cat: cat expands glob characters, and "[" is common in names.
        fetched = fs.cat_ranges(full, [None] * len(full), [None] * len(full), on_error="return")
        yield from zip(batch, fetched)


def make_record(path: str, label: int, encoded_image: bytes) -> bytes:
    """One framed TFRecord holding an Example with the image, its label and source path."""
    return frame_record(encode_example({IMAGE_KEY: encoded_image, LABEL_KEY: label,
                                        KEY_KEY: path.encode()}))


def _encoded(data_uri: str, paths: list[str], config: ShardConfig
             ) -> Iterable[tuple[str, bytes, bytes | BadImage]]:
    """Yields `(path, file bytes, encoded image or the BadImage saying why there is none)`."""
    for path, data in read_files(data_uri, paths):
        try:
            if isinstance(data, Exception):
                raise BadImage(f"cannot read file: {data}")
            encoded = process_image(data, config)
        except BadImage as err:
            encoded = err
        yield path, data, encoded


# 64 bits of a file's SHA-256 tell copies apart; short, as one is held per file.
CONTENT_DIGEST_CHARS = 16


def write_shard(task: ShardTask) -> dict[str, Any]:
    """Writes one shard under a temporary name, renaming it when complete.

    Returns:
        `{"file", "records", "sha256", "bytes", "labels": {label: n}, "skipped": [...],
        "contents": {path: digest}}`.
    """
    digest, labels, skipped, contents, size = hashlib.sha256(), Counter(), [], {}, 0
    final = os.path.join(task.out_dir, task.filename)
    temporary = os.path.join(task.out_dir, TMP_PREFIX + task.filename)
    label_of = dict(task.items)
    with open(temporary, "wb") as out:
        for path, data, encoded in _encoded(task.data_uri, [p for p, _ in task.items],
                                             task.config):
            if isinstance(encoded, BadImage):
                skipped.append({"path": path, "reason": str(encoded)})
                continue
            label = label_of[path]
            contents[path] = hashlib.sha256(data).hexdigest()[:CONTENT_DIGEST_CHARS]
            record = make_record(path, label, encoded)
            out.write(record)
            digest.update(record)
            size += len(record)
            labels[label] += 1
    os.replace(temporary, final)
    return {"file": task.filename, "records": sum(labels.values()), "sha256": digest.hexdigest(),
            "bytes": size, "labels": dict(labels), "skipped": skipped, "contents": contents}


def estimate_record_bytes(data_uri: str, sample: list[str], config: ShardConfig) -> float:
    """Mean bytes of one framed record, from encoding a sample of the images."""
    sizes = [len(make_record(path, 0, encoded)) for path, _, encoded in
             _encoded(data_uri, sample, config) if not isinstance(encoded, BadImage)]
    # With no decodable sample, assume raw pixels: more shards, never too few.
    return sum(sizes) / len(sizes) if sizes else config.image_size ** 2 * 3.0


def run_tasks(tasks: list[ShardTask], workers: int, worker_fn: Callable = write_shard,
              progress: bool = True) -> list[dict[str, Any]]:
    """Runs `worker_fn` over tasks in `workers` spawned processes with a progress bar (a fork
    keeps locks held by threads it does not copy, which hung a CI run; a script's entry point
    must sit under `if __name__ == "__main__":`).

    Raises:
        ShardingError: A worker died before returning its shard (killed for memory, say).
    """
    from tqdm import tqdm

    total = sum(len(t.items) for t in tasks)
    results = []
    with tqdm(total=total, unit="img", desc="sharding", disable=not progress,
              file=sys.stderr, mininterval=1.0) as bar:
        if workers == 1:
            for task in tasks:
                results.append(worker_fn(task))
                bar.update(len(task.items))
            return results
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            # Longest tasks first keeps all workers busy until the end.
            ordered = sorted(tasks, key=lambda t: -len(t.items))
            pending = {pool.submit(worker_fn, task): task for task in ordered}
            for future in as_completed(pending):
                results.append(future.result())
                bar.update(len(pending[future].items))
        except BrokenProcessPool as err:
            raise ShardingError(
                f"a sharding worker process died before returning its shard ({err}); a "
                "worker killed for lack of memory is the usual cause: give the step more "
                "memory or lower num_workers") from err
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return results


_CRC_MASK_DELTA = 0xA282EAD8


def _masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    """Frames one record as TFRecord: length, its masked CRC32C, payload, its masked CRC32C."""
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", _masked_crc32c(length)) + payload
            + struct.pack("<I", _masked_crc32c(payload)))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are encoded as 10-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_example(features: dict[str, bytes | int]) -> bytes:
    """Serializes a `tf.train.Example` of single bytes (BytesList) or int (Int64List) values.

    Returns:
        The Example, features in sorted key order (equal inputs give equal bytes).
    """
    entries = []
    for name in sorted(features):
        value = features[name]
        if isinstance(value, bytes):  # Feature.bytes_list = 1; BytesList.value = 1
            feature = _field(1, _field(1, value))
        elif isinstance(value, int):  # Feature.int64_list = 3; Int64List.value = 1 (packed)
            feature = _field(3, _field(1, _varint(value)))
        else:
            raise TypeError(f"feature {name!r}: expected bytes or int, got {type(value).__name__}")
        # Features.feature = 1 (map<string, Feature>): entry key = 1, value = 2
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))  # Example.features = 1
