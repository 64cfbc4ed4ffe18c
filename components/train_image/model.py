"""The classifier: building it (under a dtype policy), its phases, its weights, its inputs.

tf-keras (Keras 2), never `tf.keras`: Keras 3 fails `model.fit` under
MultiWorkerMirroredStrategy (keras-team/keras#20585). The model: float32 RGB 0..255 ->
scaling -> base (a DenseNet or EfficientNet-Lite0) -> pool -> dropout -> float32 softmax.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

# Keras' builder of any DenseNet layout (it exports only 121/169/201).
from tf_keras.src.applications.densenet import DenseNet as keras_densenet

# dtype_policy(name): the global tf-keras dtype policy for a block, the old one restored after.
from tf_keras.src.mixed_precision.policy import policy_scope as dtype_policy  # noqa: F401

from components.formats.shards import make_dataset
from components.train_image import efficientnet_lite
from components.train_image.contract import (
    ARCHITECTURES,
    DENSENET121,
    IMAGENET_MEAN,
    IMAGENET_STD,
    LITE_INPUT_OFFSET,
    LITE_INPUT_SCALE,
    TrainConfig,
    architecture_name,
    network_name,
    normalize_weights,
    weights_file_layout,
)

BASE_PREFIXES = ("densenet", "efficientnet_lite")
INPUT_NAME = "image"
OUTPUT_NAME = "probabilities"
PHASES = ("head", "fine_tune", "full")


def build_model(num_classes: int, image_size: int, weights: str | None = None,
                dropout: float = 0.2, frozen_batchnorm: bool | None = None,
                layout: Sequence[int] | None = None,
                architecture: str = "densenet121") -> tf_keras.Model:
    """Builds the classifier under the current dtype policy and strategy scope.

    Args:
        num_classes, image_size: Output classes; input height and width (at least 32).
        weights: "imagenet", a local no-top `.h5` file of the architecture, or None/"none".
        dropout: Dropout rate before the classification layer.
        frozen_batchnorm: Call the base with `training=False`; default: when pretrained.
        layout: Dense blocks per stage of a DenseNet built without a weights file.
        architecture: "densenet121" or "efficientnet_lite0".

    Returns:
        An uncompiled model: input "image" (float32 0..255), output "probabilities".

    Raises:
        ValueError: Bad sizes, or a weights file of another network.
    """
    if num_classes < 2:
        raise ValueError(f"need at least 2 classes, got {num_classes}")
    if image_size < 32:
        raise ValueError(f"{architecture} needs images of at least 32x32, got {image_size}")
    weights = normalize_weights(weights)
    if weights == "imagenet" and architecture == "efficientnet_lite0":
        weights = efficientnet_lite.imagenet_weights()
    if weights not in (None, "imagenet"):
        layout = weights_file_layout(weights, architecture)
    shape = (image_size, image_size, 3)
    inputs = tf_keras.Input(shape=shape, dtype="float32", name=INPUT_NAME)
    # float32 scaling: cheap, and its precision matters
    if architecture == "efficientnet_lite0":
        scaled = tf_keras.layers.Rescaling(1.0 / LITE_INPUT_SCALE,
                                           offset=-LITE_INPUT_OFFSET / LITE_INPUT_SCALE,
                                           dtype="float32", name="lite_preprocess")(inputs)
        base = efficientnet_lite.efficientnet_lite0(shape)
        if weights is not None:
            base.load_weights(weights)
    else:
        scaled = tf_keras.layers.Normalization(
            mean=[255.0 * m for m in IMAGENET_MEAN],
            variance=[(255.0 * s) ** 2 for s in IMAGENET_STD],
            dtype="float32", name="densenet_preprocess",
        )(inputs)
        layout = tuple(layout or DENSENET121)
        if weights == "imagenet" and layout != DENSENET121:
            raise ValueError("weights='imagenet' is DenseNet121's; give another DenseNet's "
                             "weights as a file")
        try:
            base = keras_densenet(list(layout), include_top=False, weights=weights,
                                  input_shape=shape)
        except ValueError as err:
            raise ValueError(
                f"cannot load {architecture_name(layout)} weights {weights!r} (expected a "
                "no-top file such as 'densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5'"
                f"): {err}") from err
    if frozen_batchnorm is None:
        frozen_batchnorm = weights is not None
    # training=False pins BatchNorm to inference mode (see set_trainable)
    features = base(scaled, training=False) if frozen_batchnorm else base(scaled)
    x = tf_keras.layers.GlobalAveragePooling2D(name="avg_pool")(features)
    x = tf_keras.layers.Dropout(dropout, name="dropout")(x)
    outputs = tf_keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                    name=OUTPUT_NAME)(x)
    return tf_keras.Model(inputs, outputs, name=f"{base.name}_classifier")


def get_base(model: tf_keras.Model) -> tf_keras.Model:
    """The DenseNet or EfficientNet-Lite inside the classifier (or `model`, a base)."""
    nested = [layer for layer in model.layers if isinstance(layer, tf_keras.Model)
              and layer.name.startswith(BASE_PREFIXES)]
    if len(nested) == 1:
        return nested[0]
    if not nested and model.name.startswith(BASE_PREFIXES) \
            and not model.name.endswith("_classifier"):
        return model
    raise ValueError(f"model {model.name!r} holds no DenseNet or EfficientNet-Lite base")


def architecture(model: tf_keras.Model) -> str:
    """The name of the classifier's network (`network_name`): "DenseNet121", ..."""
    return network_name(layer.name for layer in get_base(model).layers)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One `model.fit` with its own trainable set and optimizer."""

    name: str  # "head", "fine_tune" or "full"; also the set_trainable phase
    epochs: int
    learning_rate: float  # for one replica


def plan_phases(config: TrainConfig) -> list[Phase]:
    """The phases to run, leaving out those with zero epochs."""
    if not config.pretrained:
        phases = [Phase("full", config.epochs + config.fine_tune_epochs, config.learning_rate)]
    else:
        phases = [Phase("head", config.epochs, config.learning_rate),
                  Phase("fine_tune", config.fine_tune_epochs, config.fine_tune_learning_rate)]
    return [p for p in phases if p.epochs > 0]


def set_trainable(model: tf_keras.Model, phase: str, unfreeze_blocks: int = 1) -> list[str]:
    """Freezes and unfreezes layers for a training phase (recompile afterwards); BatchNorm
    stays frozen in fine-tuning (small batches would shift the head's features).

    Args:
        model: The classifier from `build_model`, or its base.
        phase: "head" (base frozen), "fine_tune" (the top `unfreeze_blocks` dense blocks or
            MBConv stages, with what follows them) or "full" (everything).
        unfreeze_blocks: 1-4 for a DenseNet, 1-7 for EfficientNet-Lite0; the stem stays frozen.

    Returns:
        Names of the base layers that are trainable and hold weights.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    base = get_base(model)
    lite = base.name.startswith("efficientnet_lite")
    limit = ARCHITECTURES["efficientnet_lite0" if lite else "densenet121"]
    if phase == "fine_tune" and not 1 <= unfreeze_blocks <= limit:
        raise ValueError(f"unfreeze_blocks must be in 1..{limit}, got {unfreeze_blocks}")
    model.trainable = True  # the head always trains; also resets nested flags
    if phase == "head":
        base.trainable = False
    elif phase == "fine_tune":
        stage_of = _lite_stage if lite else _dense_stage
        first_stage = limit + 2 - unfreeze_blocks  # 1 block -> the last stage
        for layer in base.layers:
            layer.trainable = (stage_of(layer.name) >= first_stage and
                               not isinstance(layer, tf_keras.layers.BatchNormalization))
    return [layer.name for layer in base.layers if layer.trainable and layer.trainable_weights]


def _dense_stage(name: str) -> int:
    """DenseNet: 1 the stem, 2-5 convN with the poolN after it, 6 the final "bn"/"relu"."""
    match = re.match(r"^(conv|pool)(\d)[_/]", name + "_")
    return int(match.group(2)) if match else 6 if name in ("bn", "relu") else 1


def _lite_stage(name: str) -> int:
    """EfficientNet-Lite: 1 the stem, 2-8 blockN (N + 1), 9 the head conv (top_*)."""
    match = re.match(r"^block(\d)", name)
    return int(match.group(1)) + 1 if match else 9 if name.startswith("top_") else 1


def compile_model(model, learning_rate: float) -> None:
    """Compiles `model` for training: Adam at `learning_rate`, sparse cross-entropy, accuracy."""
    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate=learning_rate),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def _variables(layer) -> dict[str, tf.Variable]:
    """Every variable of the leaf layers under `layer`, keyed `<layer name>/<index>`."""
    if not getattr(layer, "layers", None):
        return {f"{layer.name}/{i}": v for i, v in enumerate(layer.weights)}
    return {key: v for sub in layer.layers for key, v in _variables(sub).items()}


def weight_snapshot(model: tf_keras.Model) -> dict[str, np.ndarray]:
    """All weights keyed by `<layer name>/<index>`, trainable or not; under a multi-worker
    strategy every worker must call it (all-reduce)."""
    return {key: np.asarray(v.numpy()) for key, v in _variables(model).items()}


def load_snapshot(model: tf_keras.Model, snapshot: dict[str, np.ndarray]) -> None:
    """Assigns a `weight_snapshot` to a model of the same architecture.

    Raises:
        ValueError: The snapshot does not match the model's weights.
    """
    expected = _variables(model)
    if expected.keys() != snapshot.keys():
        missing = sorted(expected.keys() - snapshot.keys())[:5]
        extra = sorted(snapshot.keys() - expected.keys())[:5]
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {extra}")
    for key, variable in expected.items():
        variable.assign(snapshot[key].astype(variable.dtype.as_numpy_dtype))


def augment_images(images: tf.Tensor, seed, flip: bool, rotation: float,
                   zoom: float) -> tf.Tensor:
    """Randomly flips, rotates and zooms a float32 batch [N, H, W, 3] in one projective
    transform per image, borders filled by reflection (no black corners to learn).

    Args:
        images, seed: The batch, and a shape [2] int seed of the stateless random ops.
        flip: Mirror left-right with probability 1/2.
        rotation: Rotate by up to +-rotation of a full turn.
        zoom: Scale by a factor in [1 - zoom, 1 + zoom].
    """
    if not flip and rotation == 0 and zoom == 0:
        return images
    height, width = images.shape[1], images.shape[2]
    seeds = tf.random.experimental.stateless_split(seed, 3)
    shape = tf.reshape(tf.shape(images)[0], [1])
    ones = tf.ones(shape, tf.float32)
    sign = ones
    if flip:
        sign = tf.where(tf.random.stateless_uniform(shape, seeds[0]) < 0.5, -ones, ones)
    angle = tf.random.stateless_uniform(shape, seeds[1], -rotation, rotation) * 2.0 * math.pi
    scale = tf.random.stateless_uniform(shape, seeds[2], 1.0 - zoom, 1.0 + zoom)
    cos, sin = tf.cos(angle), tf.sin(angle)
    # output -> input: input = scale * R(angle) @ diag(sign, 1) @ (output - center) + center
    a0, a1 = scale * cos * sign, -scale * sin
    b0, b1 = scale * sin * sign, scale * cos
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    zeros = tf.zeros_like(ones)
    transforms = tf.stack([a0, a1, cx - a0 * cx - a1 * cy, b0, b1, cy - b0 * cx - b1 * cy,
                           zeros, zeros], axis=1)
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms, output_shape=tf.constant([height, width]),
        fill_value=0.0, interpolation="BILINEAR", fill_mode="REFLECT")


def train_input(dataset_dir: str, manifest: dict[str, Any], config: TrainConfig,
                global_batch: int) -> tf.data.Dataset:
    """The training pipeline: endless, shuffled batches, augmented a batch at a time with
    fresh randomness every epoch; Keras shards the files across workers."""
    count = manifest["splits"]["train"]["count"]
    dataset = make_dataset(dataset_dir, "train", manifest=manifest, shuffle_files=True,
                           seed=config.seed, deterministic=False)
    dataset = dataset.shuffle(min(config.shuffle_buffer, max(count, 1)), seed=config.seed,
                              reshuffle_each_iteration=True)
    # Endless: every worker runs steps_per_epoch whatever its shards hold.
    dataset = dataset.repeat().batch(global_batch, drop_remainder=True)
    # A generator: seeded ops replay each epoch, a zipped Dataset.random defeats sharding.
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
        config: How to train (validation_steps).
        global_batch: Examples per step over all replicas.
        even_batches: Whole global batches only, read by every worker (several CPU
            replicas fail on an empty batch: oneDNN Conv2D).
    """
    dataset = make_dataset(dataset_dir, "validation", manifest=manifest)
    dataset = dataset.batch(global_batch, drop_remainder=even_batches)
    dataset = dataset.map(lambda images, labels: (tf.cast(images, tf.float32), labels),
                          num_parallel_calls=tf.data.AUTOTUNE)
    if even_batches:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
    if config.validation_steps:
        dataset = dataset.take(config.validation_steps)
    return dataset.prefetch(tf.data.AUTOTUNE)
