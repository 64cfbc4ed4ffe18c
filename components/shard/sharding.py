"""The sharding step: list the class folders, split, plan the shards, write, check, manifest
(`<data_uri>/<class>/**/<image>` to `<split>-NNNNN-of-MMMMM.tfrecord` and `manifest.json`).

Only files this step can prove its own (named by its manifest or a killed run's claim) are
removed; others named like its output stop the run. Records are encoded in plain Python:
TensorFlow in every worker costs seconds and hundreds of MB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
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
    find_following_links,
)

log = logging.getLogger(__name__)

# Images encoded up front to estimate a record's bytes: ~0.5% of the input, 4..32 images.
_SIZE_SAMPLE_SHARE, _SIZE_SAMPLE_MIN, _SIZE_SAMPLE_MAX = 0.005, 4, 32


def shard_dataset(data_uri: str, out_dir: str, config: ShardConfig,
                  progress: bool = True) -> dict[str, Any]:
    """Shards a folder of class sub-folders into TFRecords and writes `manifest.json`.

    Args:
        data_uri: Local folder or `gs://bucket/prefix` with one sub-folder per class.
        out_dir: Local output folder; an earlier run's shards are replaced, other files kept.
        config: How to shard.
        progress: Show a progress bar on stderr.

    Returns:
        The manifest.

    Raises:
        ShardingError: Bad layout, a class with no usable image, too many unusable files
            (nothing is left behind), or foreign shard-named files in `out_dir`.
    """
    _check_output_folder(data_uri, out_dir)
    listing = list_labelled_files(data_uri)
    os.makedirs(out_dir, exist_ok=True)
    _clear_output(out_dir)
    splits = stratified_split(listing.files, listing.classes, config.fractions, config.seed)
    examples_in = sum(len(p) for p in listing.files.values())

    all_items = [item for split in SPLITS for item in splits[split]]
    sample_size = min(len(all_items), _SIZE_SAMPLE_MAX,
                      max(_SIZE_SAMPLE_MIN, int(len(all_items) * _SIZE_SAMPLE_SHARE)))
    sample = [path for path, _ in random.Random(config.seed).sample(all_items, sample_size)]
    record_bytes = estimate_record_bytes(data_uri, sample, config)

    tasks = []
    for split in SPLITS:
        n_shards = shard_count(len(splits[split]), record_bytes, config.target_shard_mb,
                               config.min_shards_per_split)
        for index, items in enumerate(chunk(splits[split], n_shards)):
            filename = f"{split}-{index:05d}-of-{n_shards:05d}.tfrecord"
            tasks.append(ShardTask(data_uri, out_dir, filename, items, config))
    claim_output(out_dir, [task.filename for task in tasks])

    workers = worker_count(config.num_workers, examples_in, len(tasks), os.cpu_count() or 1)
    try:
        results = run_tasks(tasks, workers, progress=progress)
        manifest = build_manifest(data_uri, listing, config, examples_in, results)
        check_manifest(manifest)
    except BaseException:
        remove_own_files(out_dir)
        raise
    for gap in manifest["missing_classes"]:
        log.warning("class %r has no example in %s (manifest: missing_classes): %s",
                    gap["class"], ", ".join(gap["splits"]), gap["reason"])
    copies = manifest["duplicate_files"]["across_classes"]
    if copies["count"]:
        log.warning("%d image(s) are in two class folders or more, one label each (manifest: "
                    "duplicate_files): %s", copies["count"], copies["copies"][:3])
    write_json_atomically(os.path.join(out_dir, MANIFEST_NAME), manifest, allow_nan=False)
    os.remove(os.path.join(out_dir, CLAIM_NAME))  # the manifest now names the shards
    return manifest


@dataclasses.dataclass
class Listing:
    """The labelled files found under an input folder."""

    classes: list[str]
    files: dict[str, list[str]]  # class -> sorted paths relative to the input root
    ignored: list[dict[str, str]]  # {"path", "reason"} for files that are not examples


def list_labelled_files(data_uri: str) -> Listing:
    """Lists `<data_uri>/<class>/**/<file>`; stray and hidden files are ignored and listed.

    Raises:
        ShardingError: The folder does not exist, or has fewer than two classes.
    """
    fs, root = filesystem(data_uri)
    root = root.rstrip("/")
    if not fs.isdir(root):
        if fs.isfile(root):
            raise ShardingError(f"data_uri {data_uri!r} is a file, not a folder of class "
                                "folders: give the folder whose sub-folders (one per class) "
                                "hold the images (a CSV of texts is the text pipeline's input)")
        raise ShardingError(f"input folder {data_uri!r} does not exist or is not a folder")
    files: dict[str, list[str]] = {}
    ignored: list[dict[str, str]] = []
    folders = []
    for entry in fs.ls(root, detail=True):
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        # A symbolic link to a folder is a class folder too (listings call it "other").
        if entry["type"] == "directory" or (entry.get("islink") and fs.isdir(entry["name"])):
            folders.append(name)
            if not name.startswith("."):
                files[name] = []
        elif entry.get("islink") and not fs.exists(entry["name"]):
            ignored.append({"path": name, "reason": "symbolic link to nothing"})
        else:
            ignored.append({"path": name, "reason": "outside class folders"})
    # Listed folder by folder: `find` on the root does not enter linked folders.
    listed = {os.path.realpath(f"{root}/{folder}") for folder in files}
    for folder in sorted(folders):
        for path in find_following_links(fs, f"{root}/{folder}", listed, ignored, root):
            relative = path[len(root):].lstrip("/")
            parts = relative.split("/")
            if folder not in files:  # a hidden top-level folder such as .git/
                ignored.append({"path": relative, "reason": "hidden folder"})
            elif any(part.startswith(".") for part in parts):
                ignored.append({"path": relative, "reason": "hidden file"})
            else:
                files[folder].append(relative)
    empty = sorted(c for c, paths in files.items() if not paths)
    if empty:
        raise ShardingError(f"class folder(s) {empty} under {data_uri!r} hold no files: "
                            "add images or remove them")
    if len(files) < 2:
        raise ShardingError(f"found {len(files)} class folder(s) under {data_uri!r}; a "
                            "classifier needs at least two: put each class's images in its "
                            "own sub-folder")
    classes = sorted(files)
    return Listing(classes=classes, files={c: files[c] for c in classes}, ignored=ignored)


def split_counts(n: int, fractions: dict[str, float]) -> dict[str, int]:
    """Splits `n` items by fractions, rounding validation and test, train taking the rest."""
    validation = round(n * fractions["validation"])
    test = round(n * fractions["test"])
    if validation + test > n:  # only possible through rounding of tiny classes
        test = n - validation
    return {"train": n - validation - test, "validation": validation, "test": test}


def stratified_split(
    files: dict[str, list[str]], classes: list[str], fractions: dict[str, float], seed: int
) -> dict[str, list[tuple[str, int]]]:
    """Split name to a shuffled `[(path, label)]`, drawn class by class (label = index
    in `classes`); the same seed and inputs give the same assignment and order."""
    rng = random.Random(seed)
    splits: dict[str, list[tuple[str, int]]] = {s: [] for s in SPLITS}
    for label, name in enumerate(classes):
        paths = sorted(files[name])
        rng.shuffle(paths)
        counts = split_counts(len(paths), fractions)
        start = 0
        for split in SPLITS:
            splits[split].extend((p, label) for p in paths[start:start + counts[split]])
            start += counts[split]
    for split in SPLITS:
        rng.shuffle(splits[split])
    return splits


def shard_count(n_examples: int, bytes_per_example: float, target_shard_mb: float,
                min_shards: int) -> int:
    """Shards for a split: as the size target asks, at least `min_shards` (readers
    interleave), never more than the examples."""
    if n_examples == 0:
        return 0
    by_size = math.ceil(n_examples * bytes_per_example / (target_shard_mb * 1e6))
    return min(n_examples, max(min_shards, by_size))


# A writer process takes ~0.4 s to start and ~1 s to write 200 images at 224 px.
IMAGES_PER_WORKER = 200


def worker_count(num_workers: int, n_images: int, n_shards: int, cpus: int) -> int:
    """`num_workers`, or (0) one per core but one per IMAGES_PER_WORKER images at most;
    never more than the shards."""
    wanted = num_workers or min(cpus, n_images // IMAGES_PER_WORKER)
    return max(1, min(wanted, n_shards))


def chunk(items: list, n_chunks: int) -> list[list]:
    """Cuts `items` into `n_chunks` contiguous runs whose lengths differ by at most one."""
    n = len(items)
    return [items[i * n // n_chunks:(i + 1) * n // n_chunks] for i in range(n_chunks)]


# The names this step writes; one it cannot prove its own (`own_files`) stops the run.
_OWN_FILE = re.compile(rf"^({re.escape(TMP_PREFIX)})?"
                       rf"(({'|'.join(SPLITS)})-\d{{5}}-of-\d{{5}}\.tfrecord|{re.escape(MANIFEST_NAME)})$")
# Names the files a run is writing until its manifest does (see `claim_output`).
CLAIM_NAME = ".shard-claim.json"


def own_files(out_dir: str) -> set[str]:
    """Names in `out_dir` this step can prove it wrote (the manifest and its shards, what
    a claim names, their temporary names); a manifest not this step's proves nothing."""
    names = {CLAIM_NAME}
    for proof in (MANIFEST_NAME, CLAIM_NAME):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            with open(os.path.join(out_dir, proof)) as f:
                found = json.load(f)
            if proof == CLAIM_NAME:
                names |= {str(name) for name in found["files"]}
            elif found["format_version"] == MANIFEST_VERSION:
                names |= {MANIFEST_NAME} | {str(shard["file"]) for split in SPLITS
                                            for shard in found["splits"][split]["shards"]}
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


def _clear_output(out_dir: str) -> None:
    """Removes what an earlier run wrote, refusing files named like its own that are not."""
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


def _check_output_folder(data_uri: str, out_dir: str) -> None:
    """Refuses an output folder inside the input folder, or the reverse."""
    if data_uri.startswith("s3://"):
        return  # an S3 bucket is never a local folder
    source = os.path.realpath(local_path(data_uri))  # gs:// as its FUSE path
    target = os.path.realpath(out_dir)
    if os.path.commonpath([source, target]) in (source, target):
        raise ShardingError(
            f"output folder {out_dir!r} and input folder {data_uri!r} overlap: the shards "
            "would be read as images next time, or the images overwritten; write the "
            "output outside the input folder")


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One shard for one worker to write."""

    data_uri: str
    out_dir: str
    filename: str
    items: list[tuple[str, int]]  # (path relative to data_uri, label)
    config: ShardConfig


_READ_BATCH = 32  # files fetched concurrently per request (gcsfs fetches a batch in parallel)


def encoded_images(data_uri: str, paths: list[str], config: ShardConfig
                   ) -> Iterable[tuple[str, bytes | Exception, bytes | BadImage]]:
    """Yields `(path, file bytes, encoded image or the BadImage saying why there is none)`:
    files under `data_uri` fetched in batches, decoded, resized and encoded by `config`."""
    fs, root = filesystem(data_uri)
    for start in range(0, len(paths), _READ_BATCH):
        batch = paths[start:start + _READ_BATCH]
        full = [f"{root.rstrip('/')}/{p}" for p in batch]
        # cat_ranges, not cat: cat expands glob characters, and "[" is common in names.
        fetched = fs.cat_ranges(full, [None] * len(full), [None] * len(full), on_error="return")
        for path, data in zip(batch, fetched):
            try:
                if isinstance(data, Exception):
                    raise BadImage(f"cannot read file: {data}")
                image = resize(decode_image(data, config.image_size), config.image_size,
                               config.resize_method)
                encoded = encode_image(image, config.image_format, config.jpeg_quality)
            except BadImage as err:
                encoded = err
            yield path, data, encoded


def make_record(path: str, label: int, encoded_image: bytes) -> bytes:
    """One framed TFRecord holding an Example with the image, its label and source path."""
    return frame_record(encode_example({IMAGE_KEY: encoded_image, LABEL_KEY: label,
                                        KEY_KEY: path.encode()}))


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
        for path, data, encoded in encoded_images(task.data_uri, [p for p, _ in task.items],
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
             encoded_images(data_uri, sample, config) if not isinstance(encoded, BadImage)]
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
    """A serialized `tf.train.Example` of single bytes (BytesList) or int (Int64List) values,
    features in sorted key order (equal inputs give equal bytes)."""
    entries = []
    for name in sorted(features):
        value = features[name]
        if isinstance(value, bytes):  # Feature.bytes_list = 1; BytesList.value = 1
            feature = _field(1, _field(1, value))
        else:  # an int: Feature.int64_list = 3; Int64List.value = 1 (packed)
            feature = _field(3, _field(1, _varint(value)))
        # Features.feature = 1 (map<string, Feature>): entry key = 1, value = 2
        entries.append(_field(1, _field(1, name.encode()) + _field(2, feature)))
    return _field(1, b"".join(entries))  # Example.features = 1


def build_manifest(data_uri: str, listing: Listing, config: ShardConfig, examples_in: int,
                   results: list[dict[str, Any]]) -> dict[str, Any]:
    """Assembles the manifest from the shard writers' results."""
    by_file = {r["file"]: r for r in results}
    splits_out: dict[str, Any] = {}
    skipped = sorted((s for r in results for s in r["skipped"]), key=lambda s: s["path"])
    for split in SPLITS:
        shard_results = [by_file[f] for f in sorted(by_file) if f.startswith(split + "-")]
        counts: Counter[int] = Counter()
        for r in shard_results:
            counts.update({int(k): v for k, v in r["labels"].items()})
        splits_out[split] = {
            "count": sum(counts.values()),
            "class_counts": {name: counts.get(i, 0) for i, name in enumerate(listing.classes)},
            "shards": [
                {k: r[k] for k in ("file", "records", "sha256", "bytes")} for r in shard_results
            ],
        }
    return {
        "format_version": MANIFEST_VERSION,
        "input_uri": data_uri,
        "seed": config.seed,
        "fractions": config.fractions,
        "image": {
            "height": config.image_size,
            "width": config.image_size,
            "channels": 3,
            "format": config.image_format,
            "jpeg_quality": config.jpeg_quality if config.image_format == "jpeg" else None,
            "resize_method": config.resize_method,
        },
        "features": {"image": IMAGE_KEY, "label": LABEL_KEY, "key": KEY_KEY},
        "classes": listing.classes,
        "label_map": {name: i for i, name in enumerate(listing.classes)},
        "examples_in": examples_in,
        "written": sum(s["count"] for s in splits_out.values()),
        "skipped": skipped,
        "ignored": listing.ignored,
        "missing_classes": missing_classes(splits_out, listing.files, config.fractions),
        "duplicate_files": duplicate_files(results),
        "max_skipped_fraction": config.max_skipped_fraction,
        "splits": splits_out,
    }


# Copies listed per kind in the manifest (all are counted).
_LISTED_COPIES = 20


def duplicate_files(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Files written more than once (same bytes): counted, and those across two class
    folders (two labels) or two splits (trained on, tested on), some listed."""
    copies: dict[str, list[tuple[str, str]]] = {}
    for result in results:
        split = result["file"].split("-", 1)[0]
        for path, digest in result.get("contents", {}).items():
            copies.setdefault(digest, []).append((path, split))
    repeated = [sorted(group) for group in copies.values() if len(group) > 1]

    def across(where) -> dict[str, Any]:
        found = sorted([path for path, _ in group] for group in repeated
                       if len({where(path, split) for path, split in group}) > 1)
        return {"count": len(found), "copies": found[:_LISTED_COPIES]}

    return {"files": sum(len(group) for group in repeated), "images": len(repeated),
            "across_classes": across(lambda path, _: path.split("/", 1)[0]),
            "across_splits": across(lambda _, split: split)}


def missing_classes(splits_out: dict[str, Any], files: dict[str, list[str]],
                    fractions: dict[str, float]) -> list[dict[str, Any]]:
    """`[{"class", "splits", "reason"}]`: classes with no example in a split asked for (too
    few files, or unreadable ones): recorded and warned about, not refused."""
    gaps = []
    for name, paths in files.items():
        missing = [s for s in SPLITS
                   if fractions[s] > 0 and splits_out[s]["class_counts"][name] == 0]
        if not missing:
            continue
        drawn = split_counts(len(paths), fractions)
        too_few = [s for s in missing if not drawn[s]]
        lost = [s for s in missing if drawn[s]]
        reasons = []
        if too_few:
            asked = ", ".join(f"{s}_fraction={fractions[s]:g}" for s in too_few)
            reasons.append(f"{len(paths)} file(s) listed: too few for one example in "
                           f"{', '.join(too_few)} at {asked}; add images to this class")
        if lost:
            reasons.append(f"the file(s) drawn for {', '.join(lost)} are unusable (see "
                           "skipped); fix or replace them")
        gaps.append({"class": name, "splits": missing, "reason": "; ".join(reasons)})
    return gaps


def check_manifest(manifest: dict[str, Any]) -> None:
    """Fails when a class has no usable image or too many files were unusable."""
    skipped = manifest["skipped"]
    examples_in = manifest["examples_in"]
    reasons = "; ".join(f"{s['path']}: {s['reason']}" for s in skipped[:5])
    more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
    totals = sum((Counter(split["class_counts"]) for split in manifest["splits"].values()),
                 Counter())
    empty = [name for name in manifest["classes"] if totals[name] == 0]
    if empty:
        raise ShardingError(f"class(es) {empty} have no usable image after skipping "
                            f"unreadable files ({reasons}{more}): fix or remove those files")
    share = len(skipped) / examples_in if examples_in else 0.0
    if share > manifest["max_skipped_fraction"]:
        raise ShardingError(
            f"{len(skipped)} of {examples_in} files ({share:.1%}) are unusable, more than "
            f"max_skipped_fraction={manifest['max_skipped_fraction']}: {reasons}{more}. "
            "Fix the files or raise max_skipped_fraction."
        )
