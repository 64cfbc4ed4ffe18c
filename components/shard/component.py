"""KFP face of the sharding step: `shard_images` takes every field of `contract.ShardConfig`
(its type, default and help, written from the class by
`components.common.written.step_function`) between its input folder and its fingerprint."""

from kfp.dsl import Dataset, Output

from components.common.written import settings_from_step, step_function
from components.shard.contract import ShardConfig


def shard_step(values: dict) -> None:
    """The step's work: shards with the inputs' settings, then tags the dataset.

    Args:
        values: Every input of `shard_images`, by name.
    """
    from components.shard.sharding import shard_dataset

    config = settings_from_step(ShardConfig, values)
    dataset = values["dataset"]
    manifest = shard_dataset(values["data_uri"], dataset.path, config)
    dataset.metadata.update({
        "examples_in": manifest["examples_in"],
        "written": manifest["written"],
        "skipped": len(manifest["skipped"]),
        "ignored": len(manifest["ignored"]),
        "missing_classes": len(manifest["missing_classes"]),
        "classes": manifest["classes"],
        **{f"{split}_examples": s["count"] for split, s in manifest["splits"].items()},
        "image_size": config.image_size,
        "image_format": config.image_format,
        "data_fingerprint": values["data_fingerprint"],
    })


shard_images = step_function(
    "shard_images", ShardConfig,
    "Shards a folder of labelled images into train/validation/test TFRecords.",
    before=[
        ("data_uri", str, "Folder (gs://bucket/prefix or local path) with one sub-folder "
         "of images per class."),
        ("dataset", Output[Dataset], "Output folder: `<split>-NNNNN-of-MMMMM.tfrecord` "
         "shards and `manifest.json`."),
    ],
    after=[
        ("data_fingerprint", "", "Digest of the input listing from the preflight step; not "
         "read, it only makes the cache key change when the data changes. Recorded in the "
         "dataset metadata."),
    ],
    runs="components.shard.component:shard_step")
