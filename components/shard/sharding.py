"""Shard a folder of labelled images into train/validation/test TFRecords.

Input layout: `<data_uri>/<class name>/**/<image file>`, local or gs://.
Output: `<split>-NNNNN-of-MMMMM.tfrecord` files and `manifest.json` in one folder.

Images are resized with a center crop (`resize_method="crop"`: the shorter side is
scaled to `image_size` and the longer side is cropped symmetrically) or letterboxed
(`"pad"`: the longer side is scaled to `image_size` and the rest padded with black).
No random augmentation happens here: the trainer augments live, per epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from components.common.images import BadImage, decode_image, encode_image, resize
from components.common.storage import TMP_PREFIX, filesystem, local_path, write_json_atomically
from components.shard import records
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

log = logging.getLogger(__name__)

_READ_BATCH = 32  # files fetched concurrently per request (gcsfs fetches a batch in parallel)
# Images encoded up front to estimate the bytes of a record: ~0.5% of the input, so
# the serial estimate stays small next to the parallel write, and 4..32 images.
_SIZE_SAMPLE_SHARE, _SIZE_SAMPLE_MIN, _SIZE_SAMPLE_MAX = 0.005, 4, 32
# The names this step writes into its output folder. One there that it cannot prove
# its own (`own_files`) stops the run; files with other names are never touched.
_OWN_FILE = re.compile(rf"^({re.escape(TMP_PREFIX)})?"
                       rf"(({'|'.join(SPLITS)})-\d{{5}}-of-\d{{5}}\.tfrecord|{re.escape(MANIFEST_NAME)})$")
# Names the files a run is writing until its manifest does (see `claim_output`).
_CLAIM_NAME = ".shard-claim.json"


# --------------------------------------------------------------------------- listing


@dataclasses.dataclass
class Listing:
    """The labelled files found under an input folder."""

    classes: list[str]
    files: dict[str, list[str]]  # class -> sorted paths relative to the input root
    ignored: list[dict[str, str]]  # {"path", "reason"} for files that are not examples


def list_labelled_files(data_uri: str) -> Listing:
    """Lists `<data_uri>/<class>/**/<file>`; stray and hidden files are ignored and listed.

    Args:
        data_uri: Local folder or `gs://bucket/prefix` with one sub-folder per class.

    Returns:
        The classes (sorted), their files and the ignored files with reasons.

    Raises:
        ShardingError: The folder does not exist, or has fewer than two classes.
    """
    fs, root = filesystem(data_uri)
    root = root.rstrip("/")
    if not fs.isdir(root):
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
        for path in _find_following_links(fs, f"{root}/{folder}", listed, ignored, root):
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
        raise ShardingError(
            f"class folder(s) {empty} under {data_uri!r} hold no files: add images or remove them"
        )
    if len(files) < 2:
        raise ShardingError(
            f"found {len(files)} class folder(s) under {data_uri!r}; a classifier needs at least "
            "two: put each class's images in its own sub-folder"
        )
    classes = sorted(files)
    return Listing(classes=classes, files={c: files[c] for c in classes}, ignored=ignored)


def _find_following_links(fs, top: str, listed: set[str], ignored: list[dict[str, str]],
                          root: str) -> list[str]:
    """Files under `top` (sorted), entering symbolic links to folders as `find` does not.

    A linked folder that holds the link (a loop) or overlaps a folder listed already
    (another class, another link) is not entered but recorded in `ignored`: entering it
    would never end, or read the same images twice, perhaps under two labels.
    `listed` holds the real paths of the class folders and grows with each linked
    folder entered (links exist on local disks only: gs:// listings have none).
    """
    found, pending = [], [top]
    while pending:
        for path, info in sorted(fs.find(pending.pop(), detail=True).items()):
            hidden = any(p.startswith(".") for p in path[len(root):].split("/"))
            if not (info.get("islink") and fs.isdir(path)) or hidden:
                found.append(path)
                continue
            target = os.path.realpath(path)
            relative = path[len(root):].lstrip("/")
            holder = os.path.realpath(os.path.dirname(path))
            if os.path.commonpath([target, holder]) == target:
                ignored.append({"path": relative, "reason": f"symbolic link loop: {target} "
                                "holds the link; not entered"})
            elif any(os.path.commonpath([target, seen]) in (target, seen) for seen in listed):
                ignored.append({"path": relative, "reason": "symbolic link to a folder listed "
                                f"already ({target}); not entered, so no image is read twice"})
            else:
                listed.add(target)
                pending.append(path)
    return sorted(found)


# --------------------------------------------------------------------------- split


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
    """Assigns each file to a split, class by class, then shuffles each split.

    Args:
        files: Class name to its file paths.
        classes: Class names in label order (label = index).
        fractions: Split name to share, summing to 1.
        seed: The same seed and inputs give the same assignment and order.

    Returns:
        Split name to a shuffled list of `(path, label)`.
    """
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


# --------------------------------------------------------------------------- sizing


def shard_count(n_examples: int, bytes_per_example: float, target_shard_mb: float,
                min_shards: int) -> int:
    """How many shards a split of `n_examples` is written to.

    As many as the size target asks for, but at least `min_shards` so readers can
    interleave, and never more than there are examples.
    """
    if n_examples == 0:
        return 0
    by_size = math.ceil(n_examples * bytes_per_example / (target_shard_mb * 1e6))
    return min(n_examples, max(min_shards, by_size))


def chunk(items: list, n_chunks: int) -> list[list]:
    """Cuts `items` into `n_chunks` contiguous runs whose lengths differ by at most one."""
    n = len(items)
    return [items[i * n // n_chunks:(i + 1) * n // n_chunks] for i in range(n_chunks)]


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


def write_shard(task: ShardTask) -> dict[str, Any]:
    """Writes one shard under a temporary name, renaming it when complete.

    Returns:
        `{"file", "records", "sha256", "bytes", "labels": {label: n}, "skipped": [...]}`.
    """
    digest = hashlib.sha256()
    labels: Counter[int] = Counter()
    skipped = []
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


def own_files(out_dir: str) -> set[str]:
    """Names in `out_dir` this step can prove it wrote: the manifest and the shards it
    names, and what an unfinished run's claim names, each with its temporary name.
    A manifest that is not this step's (not JSON, other keys) proves nothing."""
    names = {_CLAIM_NAME}
    try:
        with open(os.path.join(out_dir, MANIFEST_NAME)) as f:
            manifest = json.load(f)
        if manifest["format_version"] == MANIFEST_VERSION:
            names |= {MANIFEST_NAME} | {str(shard["file"]) for split in SPLITS
                                        for shard in manifest["splits"][split]["shards"]}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    try:
        with open(os.path.join(out_dir, _CLAIM_NAME)) as f:
            names |= {str(name) for name in json.load(f)["files"]}
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return names | {TMP_PREFIX + name for name in names}


def claim_output(out_dir: str, names: list[str]) -> None:
    """Records the files a run is about to write, before it writes them: a run killed
    mid-way leaves no manifest, and the claim is what proves its leftovers ours."""
    write_json_atomically(os.path.join(out_dir, _CLAIM_NAME),
                          {"files": sorted(set(names) | {MANIFEST_NAME})})


def remove_own_files(out_dir: str) -> None:
    """Removes the files `own_files` proves ours: the manifest first, so nothing looks
    whole, and the claim last, so a kill half-way still leaves the rest provably ours."""
    present = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
    claims = [name for name in (_CLAIM_NAME, TMP_PREFIX + _CLAIM_NAME) if name in present]
    doomed = sorted((present & own_files(out_dir)) - set(claims))
    if doomed:
        claim_output(out_dir, doomed)
        claims = [_CLAIM_NAME]
    for name in sorted(doomed, key=lambda n: n != MANIFEST_NAME) + claims:
        os.remove(os.path.join(out_dir, name))


def clear_output(out_dir: str) -> None:
    """Removes what an earlier run of this step wrote; other files are left alone.

    Raises:
        ShardingError: The folder holds files named like this step's output that no
            manifest or claim of this step names (another dataset's shards, another
            tool's manifest): they are kept, and nothing is removed.
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
    """Refuses an output folder inside the input folder (or the reverse): its shards
    would be listed as images of a class on the next run, or the input overwritten.

    Raises:
        ShardingError: The two folders overlap.
    """
    source = os.path.realpath(local_path(data_uri) if data_uri.startswith("gs://")
                              else data_uri)
    target = os.path.realpath(out_dir)
    if os.path.commonpath([source, target]) in (source, target):
        raise ShardingError(
            f"output folder {out_dir!r} and input folder {data_uri!r} overlap: the shards "
            "would be read as images next time, or the images overwritten; write the "
            "output outside the input folder")


def run_tasks(tasks: list[ShardTask], workers: int, worker_fn: Callable = write_shard,
              progress: bool = True) -> list[dict[str, Any]]:
    """Runs `worker_fn` over tasks in `workers` processes with a progress bar.

    Workers are forked: spawning would re-import the caller's `__main__` (kfp's
    executor, a notebook, a script on stdin) in every worker. fsspec resets its
    event loop and instance cache after a fork, so gcsfs is safe in the children.
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
        context = multiprocessing.get_context("fork")
        with context.Pool(workers) as pool:
            sizes = {t.filename: len(t.items) for t in tasks}
            # Longest tasks first keeps all workers busy until the end.
            ordered = sorted(tasks, key=lambda t: -len(t.items))
            for result in pool.imap_unordered(worker_fn, ordered):
                results.append(result)
                bar.update(sizes[result["file"]])
    return results


def shard_dataset(data_uri: str, out_dir: str, config: ShardConfig,
                  progress: bool = True) -> dict[str, Any]:
    """Shards a folder of class sub-folders into TFRecords and writes `manifest.json`.

    Args:
        data_uri: Local folder or `gs://bucket/prefix` with one sub-folder per class.
        out_dir: Local folder for the shards and manifest (on Vertex a /gcs/ FUSE path).
            Shards and a manifest left there by an earlier run (or a killed one) are
            replaced; other files are kept.
        config: How to shard.
        progress: Show a progress bar on stderr.

    Returns:
        The manifest.

    Raises:
        ShardingError: Bad layout, a class with no usable image, or too many unusable
            files (no manifest or shard is left behind then), or files named like
            shards in `out_dir` that are not this step's (nothing is touched then).
    """
    check_output_folder(data_uri, out_dir)
    listing = list_labelled_files(data_uri)
    os.makedirs(out_dir, exist_ok=True)
    clear_output(out_dir)
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

    workers = config.num_workers or os.cpu_count() or 1
    try:
        results = run_tasks(tasks, min(workers, max(1, len(tasks))), progress=progress)
        manifest = build_manifest(data_uri, listing, config, examples_in, results)
        check_manifest(manifest)
    except BaseException:
        remove_own_files(out_dir)
        raise
    for gap in manifest["missing_classes"]:
        log.warning("class %r has no example in %s (manifest: missing_classes): %s",
                    gap["class"], ", ".join(gap["splits"]), gap["reason"])
    write_json_atomically(os.path.join(out_dir, MANIFEST_NAME), manifest, allow_nan=False)
    os.remove(os.path.join(out_dir, _CLAIM_NAME))  # the manifest now names the shards
    return manifest


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
        "max_skipped_fraction": config.max_skipped_fraction,
        "splits": splits_out,
    }


def missing_classes(splits_out: dict[str, Any], files: dict[str, list[str]],
                    fractions: dict[str, float]) -> list[dict[str, Any]]:
    """Classes with no example in a split that was asked for (fraction > 0).

    A class of a few images rounds to no validation or test example, or loses the one
    it drew to an unreadable file: that split then says nothing about it (and with no
    train example the model never sees it). The splits stay usable for the other
    classes, so this is recorded and warned about, not refused.

    Args:
        splits_out: The manifest's splits, with their per-class counts.
        files: Class name to its listed files, in label order.
        fractions: Split name to share.

    Returns:
        `[{"class", "splits", "reason"}]`, in label order.
    """
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
    totals = Counter()
    for split in manifest["splits"].values():
        totals.update(split["class_counts"])
    empty = [name for name in manifest["classes"] if totals[name] == 0]
    if empty:
        raise ShardingError(
            f"class(es) {empty} have no usable image after skipping unreadable files "
            f"({reasons}{more}): fix or remove those files"
        )
    share = len(skipped) / examples_in if examples_in else 0.0
    if share > manifest["max_skipped_fraction"]:
        raise ShardingError(
            f"{len(skipped)} of {examples_in} files ({share:.1%}) are unusable, more than "
            f"max_skipped_fraction={manifest['max_skipped_fraction']}: {reasons}{more}. "
            "Fix the files or raise max_skipped_fraction."
        )
