"""Writing the shards: images read in batches, resized and encoded, framed as TFRecords.

One `ShardTask` per shard, written by `write_shard` under a temporary name in worker
processes (`run_tasks`); `estimate_record_bytes` sizes a record from a sample.
"""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from components.common.images import BadImage, decode_image, encode_image, resize
from components.common.storage import TMP_PREFIX, filesystem
from components.shard import records
from components.shard.contract import IMAGE_KEY, KEY_KEY, LABEL_KEY, ShardConfig, ShardingError

_READ_BATCH = 32  # files fetched concurrently per request (gcsfs fetches a batch in parallel)


# --------------------------------------------------------------------------- images


def process_image(data: bytes, config: ShardConfig) -> bytes:
    """Decode, convert to RGB, resize and encode one image file's bytes."""
    image = resize(decode_image(data, config.image_size), config.image_size, config.resize_method)
    return encode_image(image, config.image_format, config.jpeg_quality)


# --------------------------------------------------------------------------- writing


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One shard for one worker to write."""

    data_uri: str
    out_dir: str
    filename: str
    items: list[tuple[str, int]]  # (path relative to data_uri, label)
    config: ShardConfig


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
    return records.frame_record(records.encode_example({
        IMAGE_KEY: encoded_image,
        LABEL_KEY: label,
        KEY_KEY: path.encode(),
    }))


# Enough of a file's SHA-256 to tell copies apart in a data set (64 bits), kept short
# because the manifest step holds one per file.
CONTENT_DIGEST_CHARS = 16


def write_shard(task: ShardTask) -> dict[str, Any]:
    """Writes one shard under a temporary name, renaming it when complete.

    Returns:
        `{"file", "records", "sha256", "bytes", "labels": {label: n}, "skipped": [...],
        "contents": {path: digest of the file's bytes}}` (for `duplicate_files`).
    """
    digest = hashlib.sha256()
    labels: Counter[int] = Counter()
    skipped = []
    contents = {}
    size = 0
    final = os.path.join(task.out_dir, task.filename)
    temporary = os.path.join(task.out_dir, TMP_PREFIX + task.filename)
    label_of = dict(task.items)
    with open(temporary, "wb") as out:
        for path, data in read_files(task.data_uri, [p for p, _ in task.items]):
            try:
                if isinstance(data, Exception):
                    raise BadImage(f"cannot read file: {data}")
                encoded = process_image(data, task.config)
            except BadImage as err:
                skipped.append({"path": path, "reason": str(err)})
                continue
            label = label_of[path]
            contents[path] = hashlib.sha256(data).hexdigest()[:CONTENT_DIGEST_CHARS]
            record = make_record(path, label, encoded)
            out.write(record)
            digest.update(record)
            size += len(record)
            labels[label] += 1
    os.replace(temporary, final)
    return {
        "file": task.filename,
        "records": sum(labels.values()),
        "sha256": digest.hexdigest(),
        "bytes": size,
        "labels": dict(labels),
        "skipped": skipped,
        "contents": contents,
    }


def estimate_record_bytes(data_uri: str, sample: list[str], config: ShardConfig) -> float:
    """Mean bytes of one framed record, from encoding a sample of the images."""
    sizes = []
    for path, data in read_files(data_uri, sample):
        if isinstance(data, Exception):
            continue
        try:
            sizes.append(len(make_record(path, 0, process_image(data, config))))
        except BadImage:
            continue
    # With no decodable sample, assume raw pixels: more shards, never too few.
    return sum(sizes) / len(sizes) if sizes else config.image_size ** 2 * 3.0


def run_tasks(tasks: list[ShardTask], workers: int, worker_fn: Callable = write_shard,
              progress: bool = True) -> list[dict[str, Any]]:
    """Runs `worker_fn` over tasks in `workers` processes with a progress bar.

    Workers are spawned, not forked: a fork copies a process's locks but not its threads
    (gcsfs's event loop, a notebook's, TensorFlow's or torch's pools), so a lock one of
    them held stays held in the child for ever (a CI run hung in this pool, its shards
    written, with TensorFlow and torch loaded in the parent). Each worker starts a
    fresh interpreter (~0.4 s); the caller's `__main__` is imported again under another
    name, so a script must keep its entry point under `if __name__ == "__main__":`.

    Raises:
        ShardingError: A worker died before returning its shard (killed for memory,
            say): the step fails instead of waiting for ever for the result, as
            `multiprocessing.Pool` would.
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
