"""Shard a folder of labelled images into train/validation/test TFRecords.

Input layout: `<data_uri>/<class name>/**/<image file>`, local or gs://.
Output: `<split>-NNNNN-of-MMMMM.tfrecord` files and `manifest.json` in one folder.

Images are resized with a center crop (`resize_method="crop"`: the shorter side is
scaled to `image_size` and the longer side is cropped symmetrically) or letterboxed
(`"pad"`: the longer side is scaled to `image_size` and the rest padded with black).
No random augmentation happens here: the trainer augments live, per epoch.

This module holds the entry point, `shard_dataset`, which runs the parts beside it in
turn: `listing` (the labelled files), `planning` (the split and the shard counts),
`output_folder` (claiming and clearing the output folder), `writing` (the shard
writers) and `manifest` (assembling and checking the manifest).
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

from components.common.storage import write_json_atomically
from components.shard.contract import MANIFEST_NAME, SPLITS, ShardConfig
from components.shard.listing import list_labelled_files
from components.shard.manifest import build_manifest, check_manifest
from components.shard.output_folder import (
    CLAIM_NAME,
    check_output_folder,
    claim_output,
    clear_output,
    remove_own_files,
)
from components.shard.planning import chunk, shard_count, stratified_split, worker_count
from components.shard.writing import ShardTask, estimate_record_bytes, run_tasks

log = logging.getLogger(__name__)

# Images encoded up front to estimate the bytes of a record: ~0.5% of the input, so
# the serial estimate stays small next to the parallel write, and 4..32 images.
_SIZE_SAMPLE_SHARE, _SIZE_SAMPLE_MIN, _SIZE_SAMPLE_MAX = 0.005, 4, 32


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
