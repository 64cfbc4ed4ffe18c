"""The sharding step's contract: its settings, how its input is listed, what it writes
(other steps import this, never the sharding logic; it stays light to import)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from components.common.storage import filesystem
from components.common.written import check_settings, setting

SPLITS = ("train", "validation", "test")
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
# Feature keys of each tf.train.Example, shared by the writer (sharding) and the reader.
IMAGE_KEY = "image"
LABEL_KEY = "label"
KEY_KEY = "key"


class ShardingError(ValueError):
    """The input cannot be sharded as asked; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """How to shard: each field's help is the sharding step's input help (the console's)."""

    image_size: int = setting(224, "Height and width in pixels the images are resized to and "
                              "stored at (the model is trained at this size).", ge=8)
    image_format: str = setting("jpeg", 'Shard image encoding: "jpeg" (about 4x smaller, decoded'
                                ' when read) or "raw" (uint8, no decode).', choices=("jpeg", "raw"))
    jpeg_quality: int = setting(95, 'JPEG quality 1-95 when image_format is "jpeg".', ge=1, le=95)
    resize_method: str = setting("crop", '"crop" scales the shorter side to image_size and '
                                 'center-crops; "pad" scales the longer side and pads with '
                                 "black.", choices=("crop", "pad"))
    train_fraction: float = setting(0.8, "Share of each class for training.", ge=0)
    validation_fraction: float = setting(0.1, "Share of each class for validation (early "
                                         "stopping, learning-rate schedule).", ge=0)
    test_fraction: float = setting(0.1, "Share of each class for the final test.", ge=0)
    seed: int = setting(42, "Seed of the split and of the order of examples; same inputs and "
                        "seed give identical shards.")
    target_shard_mb: float = setting(100.0, "Aimed shard size in MB (TensorFlow advises 10 MB+, "
                                     "ideally ~100 MB).", gt=0)
    min_shards_per_split: int = setting(16, "Fewest shards per split so readers can interleave "
                                        "(capped at the number of examples).", ge=1)
    max_skipped_fraction: float = setting(0.05, "Fail when more than this share of the files is "
                                          "unreadable.", ge=0, le=1)
    num_workers: int = setting(0, "Sharding processes; 0 uses every CPU core of the machine, "
                               "fewer for a small dataset (one per 200 images).", ge=0)

    def __post_init__(self) -> None:
        problems = []
        if not abs(sum(self.fractions.values()) - 1) <= 1e-6:  # NaN fails too
            problems.append(f"split fractions must sum to 1, got {self.fractions}")
        check_settings(self, ShardingError, *problems)

    @property
    def fractions(self) -> dict[str, float]:
        return {split: getattr(self, f"{split}_fraction") for split in SPLITS}


def find_following_links(fs, top: str, listed: set[str], ignored: list[dict[str, str]],
                         root: str) -> dict[str, dict[str, Any]]:
    """The files under `top`: `find`'s entries, entering symbolic links to folders, but not
    one that holds the link (a loop) or overlaps a folder listed already (`ignored` says so).

    Args:
        fs: The filesystem of `top` (`storage.filesystem`).
        top: The folder to list.
        listed: The real paths of the folders listed already; grows with each one entered.
        ignored: Gets a {"path", "reason"} per link not entered, relative to `root`.
        root: The input's folder.

    Returns:
        Each file's listing entry, sorted by path.
    """
    found, pending = {}, [top]
    while pending:
        for path, info in sorted(fs.find(pending.pop(), detail=True).items()):
            hidden = any(p.startswith(".") for p in path[len(root):].split("/"))
            if not (info.get("islink") and fs.isdir(path)) or hidden:
                found[path] = info
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
    return dict(sorted(found.items()))


def read_manifest(dataset_dir: str) -> dict[str, Any]:
    """Loads `manifest.json` from a sharded dataset folder (local or /gcs/ path).

    Raises:
        FileNotFoundError: The folder has no manifest, so it is not a complete dataset.
    """
    fs, path = filesystem(dataset_dir.rstrip("/") + "/" + MANIFEST_NAME)
    if not fs.exists(path):
        raise FileNotFoundError(f"{path} not found: {dataset_dir!r} is not a complete sharded "
                                "dataset (run the sharding step, or point at its output folder)")
    with fs.open(path) as f:
        return json.load(f)


def shard_files(dataset_dir: str, manifest: dict[str, Any], split: str) -> list[str]:
    """Paths of the non-empty shards of one split, in manifest order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [os.path.join(dataset_dir, shard["file"])
            for shard in manifest["splits"][split]["shards"] if shard["records"] > 0]

