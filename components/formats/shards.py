"""The reader of the sharding step's TFRecords: one split as a `tf.data.Dataset`.

It interleaves across shard files and parses and decodes in parallel; `deterministic=False`
lets fast shards go first (training), `True` keeps a repeatable order (evaluation, tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from components.shard.contract import (
    IMAGE_KEY,
    KEY_KEY,
    LABEL_KEY,
    read_manifest,
    shard_files,
)

if TYPE_CHECKING:
    import tensorflow as tf

# Records parsed 64 at a time: far cheaper than one by one (bench/input_bench.py).
_PARSE_BATCH = 64


def make_dataset(
    dataset_dir: str,
    split: str,
    *,
    manifest: dict[str, Any] | None = None,
    shuffle_files: bool = False,
    seed: int | None = None,
    deterministic: bool = True,
    with_keys: bool = False,
) -> tf.data.Dataset:
    """A `tf.data.Dataset` of one split's examples, decoded.

    Args:
        dataset_dir: Folder written by the sharding step.
        split: "train", "validation" or "test".
        manifest: The dataset's manifest, if already loaded.
        shuffle_files: Shuffle the order of shard files (each epoch), seeded by `seed`.
        seed: Seed of the file shuffle.
        deterministic: Keep a repeatable element order; False is faster for training.
        with_keys: Also yield each example's source path (bytes).

    Returns:
        Unbatched `(image uint8 [H, W, 3], label int32[, key])`.
    """
    import tensorflow as tf

    manifest = manifest or read_manifest(dataset_dir)
    files = shard_files(dataset_dir, manifest, split)
    if not files:
        raise ValueError(f"split {split!r} of {dataset_dir!r} has no examples")
    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files:
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": deterministic}
    dataset = file_ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 16),
                                 **parallel)
    image = manifest["image"]
    shape, raw = (image["height"], image["width"], image["channels"]), image["format"] == "raw"
    keys = (IMAGE_KEY, LABEL_KEY, KEY_KEY) if with_keys else (IMAGE_KEY, LABEL_KEY)
    spec = {key: tf.io.FixedLenFeature([], tf.int64 if key == LABEL_KEY else tf.string)
            for key in keys}

    def parse(serialized):  # a batch of Examples to batched features, raw images reshaped
        features = tf.io.parse_example(serialized, spec)
        if raw:
            pixels = tf.io.decode_raw(features[IMAGE_KEY], tf.uint8)
            features[IMAGE_KEY] = tf.reshape(pixels, (-1, *shape))
        features[LABEL_KEY] = tf.cast(features[LABEL_KEY], tf.int32)
        return features

    def decode(features):  # one example's features to (image, label[, key])
        if not raw:
            features[IMAGE_KEY] = tf.ensure_shape(
                tf.io.decode_jpeg(features[IMAGE_KEY], channels=3), shape)
        return tuple(features[key] for key in keys)

    if raw:
        # Nothing left to decode per image: split the decoded batch straight into examples.
        return dataset.batch(_PARSE_BATCH).map(lambda s: decode(parse(s)), **parallel).unbatch()
    return dataset.batch(_PARSE_BATCH).map(parse, **parallel).unbatch().map(decode, **parallel)
