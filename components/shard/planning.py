"""The split plan: which file goes to which split, and how many shards each split gets.

Pure functions of the listing, the fractions, the seed and the estimated record size.
"""

from __future__ import annotations

import math
import random

from components.shard.contract import SPLITS

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


# A writer process takes ~0.4 s to start (a fresh interpreter: writing.run_tasks) and
# ~1 s to write 200 images at 224 px: when the count is left to the step, each worker
# gets at least this many images.
IMAGES_PER_WORKER = 200


def worker_count(num_workers: int, n_images: int, n_shards: int, cpus: int) -> int:
    """How many processes write `n_shards` shards of `n_images` images.

    `num_workers` when set; when 0, one per CPU core but no more than one per
    IMAGES_PER_WORKER images (a small dataset is written in the step's own process).
    Never more than there are shards.
    """
    wanted = num_workers or min(cpus, n_images // IMAGES_PER_WORKER)
    return max(1, min(wanted, n_shards))


def chunk(items: list, n_chunks: int) -> list[list]:
    """Cuts `items` into `n_chunks` contiguous runs whose lengths differ by at most one."""
    n = len(items)
    return [items[i * n // n_chunks:(i + 1) * n // n_chunks] for i in range(n_chunks)]
