"""KFP face of the sharding step: the typed signature mapped onto `sharding.shard_dataset`."""

from kfp.dsl import Dataset, Output


# Defaults written by python -m tools.signatures from contract.ShardConfig (edit there).
def shard_images(
    data_uri: str,
    dataset: Output[Dataset],
    image_size: int = 224,
    image_format: str = "jpeg",
    jpeg_quality: int = 95,
    resize_method: str = "crop",
    train_fraction: float = 0.8,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 42,
    target_shard_mb: float = 100.0,
    min_shards_per_split: int = 16,
    max_skipped_fraction: float = 0.05,
    num_workers: int = 0,
    data_fingerprint: str = "",
):
    """Shards a folder of labelled images into train/validation/test TFRecords.

    Args:
        data_uri: Folder (gs://bucket/prefix or local path) with one sub-folder of images per class.
        dataset: Output folder: `<split>-NNNNN-of-MMMMM.tfrecord` shards and `manifest.json`.
        image_size: Height and width in pixels the images are resized to and stored at (the model is trained at this size).
        image_format: Shard image encoding: "jpeg" (about 4x smaller, decoded when read) or "raw" (uint8, no decode).
        jpeg_quality: JPEG quality 1-95 when image_format is "jpeg".
        resize_method: "crop" scales the shorter side to image_size and center-crops; "pad" scales the longer side and pads with black.
        train_fraction: Share of each class for training.
        validation_fraction: Share of each class for validation (early stopping, learning-rate schedule).
        test_fraction: Share of each class for the final test.
        seed: Seed of the split and of the order of examples; same inputs and seed give identical shards.
        target_shard_mb: Aimed shard size in MB (TensorFlow advises 10 MB+, ideally ~100 MB).
        min_shards_per_split: Fewest shards per split so readers can interleave (capped at the number of examples).
        max_skipped_fraction: Fail when more than this share of the files is unreadable.
        num_workers: Sharding processes; 0 uses every CPU core of the machine, fewer for a small dataset (one per 200 images).
        data_fingerprint: Digest of the input listing from the preflight step; not read, it only makes the cache key change when the data changes. Recorded in the dataset metadata.
    """
    from components.shard.sharding import ShardConfig, shard_dataset

    config = ShardConfig(
        image_size=image_size, image_format=image_format, jpeg_quality=jpeg_quality,
        resize_method=resize_method, train_fraction=train_fraction,
        validation_fraction=validation_fraction, test_fraction=test_fraction, seed=seed,
        target_shard_mb=target_shard_mb, min_shards_per_split=min_shards_per_split,
        max_skipped_fraction=max_skipped_fraction, num_workers=num_workers,
    )
    manifest = shard_dataset(data_uri, dataset.path, config)
    dataset.metadata.update({
        "examples_in": manifest["examples_in"],
        "written": manifest["written"],
        "skipped": len(manifest["skipped"]),
        "ignored": len(manifest["ignored"]),
        "missing_classes": len(manifest["missing_classes"]),
        "classes": manifest["classes"],
        **{f"{split}_examples": s["count"] for split, s in manifest["splits"].items()},
        "image_size": image_size,
        "image_format": image_format,
        "data_fingerprint": data_fingerprint,
    })
