"""The sharding step's contract: its settings and what it writes, and how to read it.

Output: `<split>-NNNNN-of-MMMMM.tfrecord` files of `tf.train.Example`s (image bytes,
int64 label, source path; keys in `records`) and `manifest.json` (classes, image size
and format, per split its shards with record counts and sha256, skipped and ignored
files). Other steps import this module only, never the sharding logic. TensorFlow is
imported by the reader functions when called, so the settings stay light to import.

The reader interleaves across shard files and parses and decodes in parallel;
`deterministic=False` lets fast shards go first (training), `True` keeps a repeatable
order (evaluation, tests).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import TYPE_CHECKING, Any

from components.common.storage import filesystem
from components.shard import records

if TYPE_CHECKING:
    import tensorflow as tf

SPLITS = ("train", "validation", "test")
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


class ShardingError(ValueError):
    """The input cannot be sharded as asked; the message says what to change."""



@dataclasses.dataclass(frozen=True)
class ShardConfig:
    """How to shard.

    Attributes:
        image_size: Height and width of the stored images, in pixels.
        image_format: "jpeg" (small, decoded when read) or "raw" (uint8 HWC, no decode).
        jpeg_quality: JPEG quality 1-95 when `image_format` is "jpeg".
        resize_method: "crop" (center crop) or "pad" (letterbox with black).
        train_fraction: Share of each class that goes to the train split.
        validation_fraction: Share of each class that goes to the validation split.
        test_fraction: Share of each class that goes to the test split.
        seed: Seed of the split and of the order of examples in the shards.
        target_shard_mb: Aimed size of one shard in MB.
        min_shards_per_split: Fewest shards a split is written to (so readers can
            interleave), unless it has fewer examples than that.
        max_skipped_fraction: Fail when more than this share of the input is unusable.
        num_workers: Writer processes; 0 means one per CPU core.
    """

    image_size: int = 224
    image_format: str = "jpeg"
    jpeg_quality: int = 95
    resize_method: str = "crop"
    train_fraction: float = 0.8
    validation_fraction: float = 0.1
    test_fraction: float = 0.1
    seed: int = 42
    target_shard_mb: float = 100.0
    min_shards_per_split: int = 16
    max_skipped_fraction: float = 0.05
    num_workers: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.image_size < 8:
            problems.append(f"image_size must be at least 8, got {self.image_size}")
        if self.image_format not in ("jpeg", "raw"):
            problems.append(f"image_format must be 'jpeg' or 'raw', got {self.image_format!r}")
        if not 1 <= self.jpeg_quality <= 95:
            problems.append(f"jpeg_quality must be in 1..95, got {self.jpeg_quality}")
        if self.resize_method not in ("crop", "pad"):
            problems.append(f"resize_method must be 'crop' or 'pad', got {self.resize_method!r}")
        fractions = self.fractions.values()
        # Written so that NaN fails too (every comparison with NaN is false).
        if not all(f >= 0 for f in fractions) or not abs(sum(fractions) - 1.0) <= 1e-6:
            problems.append(f"split fractions must be >= 0 and sum to 1, got {self.fractions}")
        if not self.target_shard_mb > 0:
            problems.append(f"target_shard_mb must be positive, got {self.target_shard_mb}")
        if self.min_shards_per_split < 1:
            problems.append(f"min_shards_per_split must be >= 1, got {self.min_shards_per_split}")
        if not 0 <= self.max_skipped_fraction <= 1:
            problems.append("max_skipped_fraction must be in 0..1, got "
                            f"{self.max_skipped_fraction}")
        if self.num_workers < 0:
            problems.append(f"num_workers must be >= 0, got {self.num_workers}")
        if problems:
            raise ShardingError("; ".join(problems))

    @property
    def fractions(self) -> dict[str, float]:
        return {
            "train": self.train_fraction,
            "validation": self.validation_fraction,
            "test": self.test_fraction,
        }


# --------------------------------------------------------------------------- reading


def read_manifest(dataset_dir: str) -> dict[str, Any]:
    """Loads `manifest.json` from a sharded dataset folder.

    Args:
        dataset_dir: Folder written by the sharding step (local or /gcs/ path).

    Returns:
        The manifest as a dict.

    Raises:
        FileNotFoundError: The folder has no manifest, so it is not a complete dataset.
    """
    fs, path = filesystem(dataset_dir.rstrip("/") + "/" + MANIFEST_NAME)
    if not fs.exists(path):
        raise FileNotFoundError(
            f"{path} not found: {dataset_dir!r} is not a complete sharded dataset "
            "(run the sharding step, or point at its output folder)"
        )
    with fs.open(path) as f:
        return json.load(f)


def shard_files(dataset_dir: str, manifest: dict[str, Any], split: str) -> list[str]:
    """Paths of the non-empty shards of one split, in manifest order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [
        os.path.join(dataset_dir, shard["file"])
        for shard in manifest["splits"][split]["shards"]
        if shard["records"] > 0
    ]


# Records are parsed 64 at a time: one vectorised parse_example per batch costs far
# less than one parse_single_example per record (measured in bench/input_bench.py).
_PARSE_BATCH = 64


def parse_fn(manifest: dict[str, Any], with_keys: bool = False):
    """A function from a batch of serialized Examples to a dict of batched features.

    Raw images are decoded here, in the batch (a reshape); JPEGs stay encoded for
    `decode_fn`, which decodes them one by one in parallel.
    """
    import tensorflow as tf

    image = manifest["image"]
    shape = (image["height"], image["width"], image["channels"])
    spec = {
        records.IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        records.LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
    }
    if with_keys:
        spec[records.KEY_KEY] = tf.io.FixedLenFeature([], tf.string)
    raw = image["format"] == "raw"

    def parse(serialized):
        features = tf.io.parse_example(serialized, spec)
        if raw:
            pixels = tf.io.decode_raw(features[records.IMAGE_KEY], tf.uint8)
            features[records.IMAGE_KEY] = tf.reshape(pixels, (-1, *shape))
        features[records.LABEL_KEY] = tf.cast(features[records.LABEL_KEY], tf.int32)
        return features

    return parse


def decode_fn(manifest: dict[str, Any], with_keys: bool = False):
    """A function from one parsed example to `(image uint8 HxWx3, label int32[, key])`."""
    import tensorflow as tf

    image = manifest["image"]
    shape = (image["height"], image["width"], image["channels"])
    jpeg = image["format"] == "jpeg"

    def decode(features):
        pixels = features[records.IMAGE_KEY]
        if jpeg:
            pixels = tf.ensure_shape(tf.io.decode_jpeg(pixels, channels=3), shape)
        if with_keys:
            return pixels, features[records.LABEL_KEY], features[records.KEY_KEY]
        return pixels, features[records.LABEL_KEY]

    return decode


def make_dataset(
    dataset_dir: str,
    split: str,
    *,
    manifest: dict[str, Any] | None = None,
    shuffle_files: bool = False,
    seed: int | None = None,
    deterministic: bool = True,
    with_keys: bool = False,
    cycle_length: int | None = None,
) -> tf.data.Dataset:
    """A `tf.data.Dataset` of one split's examples, decoded.

    Args:
        dataset_dir: Folder written by the sharding step.
        split: "train", "validation" or "test".
        manifest: The dataset's manifest, if already loaded.
        shuffle_files: Shuffle the order of shard files (each epoch).
        seed: Seed of the file shuffle.
        deterministic: Keep a repeatable element order; False is faster for training.
        with_keys: Also yield each example's source path (bytes).
        cycle_length: Shards read at once; default: all of them up to 16.

    Returns:
        Elements `(image uint8 [H, W, 3], label int32)`, plus `key` with `with_keys`.
        Not batched, shuffled or repeated: the caller decides.
    """
    import tensorflow as tf

    manifest = manifest or read_manifest(dataset_dir)
    files = shard_files(dataset_dir, manifest, split)
    if not files:
        raise ValueError(f"split {split!r} of {dataset_dir!r} has no examples")
    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files:
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = file_ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=cycle_length or min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    parse, decode = parse_fn(manifest, with_keys), decode_fn(manifest, with_keys)
    if manifest["image"]["format"] == "raw":
        # Nothing left to decode per image: split the decoded batch straight into examples.
        return dataset.batch(_PARSE_BATCH).map(
            lambda serialized: decode(parse(serialized)),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic,
        ).unbatch()
    dataset = dataset.batch(_PARSE_BATCH).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic).unbatch()
    return dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
