"""The input pipelines of the image trainer: live augmentation, training and validation data.

Training batches are endless, shuffled and augmented one batch at a time; validation
batches hold every example once, in order, never augmented.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from components.formats.shards import make_dataset
from components.train_image.contract import TrainConfig


def random_affine(batch_size, height: int, width: int, seed, flip: bool, rotation: float,
                  zoom: float) -> tf.Tensor:
    """Per-image random flip/rotation/zoom as projective transforms (output -> input).

    One transform per image combines all three, so each image is resampled once.

    Args:
        batch_size: Number of images (scalar tensor).
        height: Image height.
        width: Image width.
        seed: Shape [2] int seed for the stateless random ops.
        flip: Mirror left-right with probability 1/2.
        rotation: Rotate by up to +-rotation of a full turn.
        zoom: Scale by a factor in [1 - zoom, 1 + zoom] (> 1 shows more: zoom out).

    Returns:
        [batch_size, 8] float32 transforms for `ImageProjectiveTransformV3`.
    """
    seeds = tf.random.experimental.stateless_split(seed, 3)
    shape = tf.reshape(batch_size, [1])
    ones = tf.ones(shape, tf.float32)
    sign = ones
    if flip:
        sign = tf.where(tf.random.stateless_uniform(shape, seeds[0]) < 0.5, -ones, ones)
    angle = tf.random.stateless_uniform(shape, seeds[1], -rotation, rotation) * 2.0 * math.pi
    scale = tf.random.stateless_uniform(shape, seeds[2], 1.0 - zoom, 1.0 + zoom)
    cos, sin = tf.cos(angle), tf.sin(angle)
    # input = scale * R(angle) @ diag(sign, 1) @ (output - center) + center
    a0, a1 = scale * cos * sign, -scale * sin
    b0, b1 = scale * sin * sign, scale * cos
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    a2 = cx - a0 * cx - a1 * cy
    b2 = cy - b0 * cx - b1 * cy
    zeros = tf.zeros_like(ones)
    return tf.stack([a0, a1, a2, b0, b1, b2, zeros, zeros], axis=1)


def augment_images(images: tf.Tensor, seed, flip: bool, rotation: float,
                   zoom: float) -> tf.Tensor:
    """Randomly flips, rotates and zooms a float32 batch [N, H, W, 3].

    Borders are filled by reflection, so no black corners teach the model a shortcut.
    """
    if not flip and rotation == 0 and zoom == 0:
        return images
    height, width = images.shape[1], images.shape[2]
    transforms = random_affine(tf.shape(images)[0], height, width, seed, flip, rotation, zoom)
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms, output_shape=tf.constant([height, width]),
        fill_value=0.0, interpolation="BILINEAR", fill_mode="REFLECT")


def _to_float(images, labels):
    return tf.cast(images, tf.float32), labels


def train_input(dataset_dir: str, manifest: dict[str, Any], config: TrainConfig,
                global_batch: int) -> tf.data.Dataset:
    """The training pipeline: endless, shuffled, live-augmented batches.

    Files are read in shuffled, interleaved, non-deterministic order; examples are
    shuffled, batched, then augmented one batch at a time (one vectorised op per
    batch is much cheaper than one per image) with fresh randomness every epoch.
    Under MultiWorkerMirroredStrategy, Keras shards the files across workers.
    """
    count = manifest["splits"]["train"]["count"]
    dataset = make_dataset(dataset_dir, "train", manifest=manifest, shuffle_files=True,
                           seed=config.seed, deterministic=False)
    dataset = dataset.shuffle(min(config.shuffle_buffer, max(count, 1)), seed=config.seed,
                              reshuffle_each_iteration=True)
    # Endless, with steps_per_epoch fixed, so every worker runs the same number of
    # steps even when their file shards hold different numbers of examples.
    dataset = dataset.repeat().batch(global_batch, drop_remainder=True)
    # A generator (not stateful ops with a seed, which replay the same numbers each
    # epoch, nor a zipped Dataset.random, which defeats file-level auto-sharding).
    with tf.device("/cpu:0"):
        generator = tf.random.Generator.from_seed(config.seed)

    def augment(images, labels):
        images = tf.cast(images, tf.float32)
        seed = generator.make_seeds(1)[:, 0]
        return augment_images(images, seed, config.flip, config.rotation, config.zoom), labels

    dataset = dataset.map(augment, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return dataset.prefetch(tf.data.AUTOTUNE)


def validation_input(dataset_dir: str, manifest: dict[str, Any], config: TrainConfig,
                     global_batch: int, even_batches: bool = False) -> tf.data.Dataset:
    """The validation pipeline: every example once, in order, never augmented.

    Args:
        dataset_dir: Folder written by the sharding step.
        manifest: Its manifest.
        config: How to train (validation_steps).
        global_batch: Examples per step over all replicas.
        even_batches: Only whole global batches, and every worker reads all of them.
            Needed with several CPU replicas: a replica handed an empty batch (the
            tail of an uneven split) makes oneDNN's Conv2D return its input unchanged
            and BatchNorm then fails on the channel count (TF 2.21). Drops up to
            global_batch - 1 examples; metrics stay exact means. GPUs are not affected.
    """
    dataset = make_dataset(dataset_dir, "validation", manifest=manifest)
    dataset = dataset.batch(global_batch, drop_remainder=even_batches)
    dataset = dataset.map(_to_float, num_parallel_calls=tf.data.AUTOTUNE)
    if even_batches:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
    if config.validation_steps:
        dataset = dataset.take(config.validation_steps)
    return dataset.prefetch(tf.data.AUTOTUNE)
