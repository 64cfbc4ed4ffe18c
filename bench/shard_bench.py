"""Sharding writer efficiency and scaling, measured side by side in one run.

    python bench/shard_bench.py [--images 1500] [--repeats 2]

On the same generated 500x375 JPEGs (resized to 224):
  efficiency(w) = sharding img/s / bare decode->resize->encode img/s, both with w processes
  speed-up      = sharding img/s with 2 workers / with 1 worker
Targets: efficiency >= 0.9, speed-up >= 1.8. The bare loop uses the same image function
and the same process pool, so the ratio isolates what sharding adds: listing, split,
size estimate, Example encoding, CRCs, sha256 and file writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.shard import sharding  # noqa: E402
from components.shard.sharding import ShardConfig, ShardTask, list_labelled_files  # noqa: E402

CLASSES = 5


def make_images(root: str, count: int, seed: int = 0) -> None:
    """Photo-like JPEGs: smooth colour fields plus noise, ~40-60 kB at 500x375."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    for i in range(count):
        folder = os.path.join(root, f"class_{i % CLASSES}")
        os.makedirs(folder, exist_ok=True)
        phase = rng.uniform(0, 6.28, 3)
        freq = rng.uniform(0.005, 0.03, 3)
        base = np.stack([127 + 100 * np.sin(freq[c] * (x + y * (c + 1)) + phase[c])
                         for c in range(3)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)


def bare_worker(task: ShardTask) -> dict:
    """Decode, resize and encode each image of the task; write nothing."""
    for _ in sharding.encoded_images(task.data_uri, [p for p, _ in task.items], task.config):
        pass
    return {"file": task.filename}


def bare_rate(root: str, workers: int, config: ShardConfig) -> float:
    listing = list_labelled_files(root)
    paths = [(p, 0) for files in listing.files.values() for p in files]
    # the same number of tasks as the sharder writes shards
    tasks = [ShardTask(root, "", f"t{i}", items, config)
             for i, items in enumerate(sharding.chunk(paths, 3 * config.min_shards_per_split))]
    start = time.perf_counter()
    sharding.run_tasks(tasks, workers, worker_fn=bare_worker, progress=False)
    return len(paths) / (time.perf_counter() - start)


def shard_rate(root: str, out: str, workers: int, config: ShardConfig) -> float:
    config = dataclasses.replace(config, num_workers=workers)
    start = time.perf_counter()
    manifest = sharding.shard_dataset(root, out, config, progress=False)
    return manifest["examples_in"] / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=2, help="best of N for each measurement")
    args = parser.parse_args()
    config = ShardConfig(image_size=224, min_shards_per_split=4, max_skipped_fraction=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "images")
        make_images(root, args.images)
        print(f"{args.images} JPEGs 500x375 -> 224 JPEG q95, {os.cpu_count()} cores")
        rates = {}
        for workers in (1, 2):
            # interleave the two so drift of the machine hits both alike
            bare, shard = [], []
            for _ in range(args.repeats):
                bare.append(bare_rate(root, workers, config))
                shard.append(shard_rate(root, os.path.join(tmp, "out"), workers, config))
            rates[workers] = (max(bare), max(shard))
            print(f"workers={workers}: bare {max(bare):7.1f} img/s  sharding {max(shard):7.1f} "
                  f"img/s  efficiency {max(shard) / max(bare):.3f}  (target >= 0.9)")
        print(f"speed-up 1->2 workers: sharding {rates[2][1] / rates[1][1]:.2f}x "
              f"(target >= 1.8), bare {rates[2][0] / rates[1][0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
