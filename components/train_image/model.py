"""The DenseNet classifier: building it (and the dtype policy it is built under),
freezing and unfreezing it, moving its weights.

The base is DenseNet121 unless a weights file holds another DenseNet: Keras' DenseNet169
and 201, or any other count of dense blocks per stage, read from the file's layer names.

Keras choice: this trainer uses tf-keras (Keras 2, `import tf_keras`) everywhere and
never `tf.keras`. In TF 2.21 `tf.keras` is Keras 3, whose `model.fit` fails under
`MultiWorkerMirroredStrategy` (keras-team/keras#20585, tensorflow/tensorflow#72388);
tf-keras 2.21 trains on several workers with `BackupAndRestore`. Mixing the two in one
model does not work, so every layer, callback and saver here comes from `tf_keras`.

The model takes float32 RGB pixels in 0..255 (what `components.formats.shards.make_dataset`
yields, cast to float) and does DenseNet's own input scaling inside, so serving needs no
preprocessing code: image -> scaling -> DenseNet (no top) -> global average pool
-> dropout -> dense softmax (float32 even under mixed precision).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tf_keras

# Keras exports DenseNet121/169/201 as fixed layouts only; its builder takes any layout,
# which a weights file of another DenseNet needs.
from tf_keras.src.applications.densenet import DenseNet as keras_densenet

from components.train_image.contract import (
    DENSENET121,
    IMAGENET_MEAN,
    IMAGENET_STD,
    architecture_name,
    dense_layout,
    normalize_weights,
    weights_file_layout,
)

BASE_PREFIX = "densenet"  # Keras names the base densenet121, densenet169, ... or densenet
INPUT_NAME = "image"
OUTPUT_NAME = "probabilities"
DENSE_BLOCKS = ("conv2", "conv3", "conv4", "conv5")
PHASES = ("head", "fine_tune", "full")


def build_model(num_classes: int, image_size: int, weights: str | None = None,
                dropout: float = 0.2, frozen_batchnorm: bool | None = None,
                layout: Sequence[int] | None = None) -> tf_keras.Model:
    """Builds the classifier under the current dtype policy and strategy scope.

    Args:
        num_classes: Number of output classes.
        image_size: Height and width of the input images (at least 32).
        weights: "imagenet" (DenseNet121's, downloaded), a local path to a no-top
            DenseNet weights `.h5` file (its layout is read from it), or None/"none"
            for random initialisation.
        dropout: Dropout rate before the classification layer.
        frozen_batchnorm: Call the base with `training=False`; default: when
            `weights` is pretrained. (A copy of a fine-tuned model is built with
            weights=None and frozen_batchnorm=True.)
        layout: Dense blocks per stage (`dense_layout`) of a model built without a
            weights file, e.g. a copy of a trained one; default DenseNet121's.

    Returns:
        An uncompiled `tf_keras.Model` with input "image" (float32, [N, H, W, 3],
        0..255) and output "probabilities" (float32 softmax). With pretrained weights
        the base is called with `training=False`, so its BatchNormalization layers
        always use their ImageNet statistics; from scratch they train normally.

    Raises:
        ValueError: Bad sizes, or a weights file that is no DenseNet's (no top).
    """
    if num_classes < 2:
        raise ValueError(f"need at least 2 classes, got {num_classes}")
    if image_size < 32:
        raise ValueError(f"DenseNet needs images of at least 32x32, got {image_size}")
    weights = normalize_weights(weights)
    if weights not in (None, "imagenet"):
        if not tf.io.gfile.exists(weights):
            raise ValueError(f"weights file {weights!r} does not exist")
        layout = weights_file_layout(weights)
    layout = tuple(layout or DENSENET121)
    if weights == "imagenet" and layout != DENSENET121:
        raise ValueError("weights='imagenet' is DenseNet121's; give another DenseNet's "
                         "weights as a file")
    shape = (image_size, image_size, 3)
    inputs = tf_keras.Input(shape=shape, dtype="float32", name=INPUT_NAME)
    # float32 on purpose: the scaling is cheap and its precision matters; the base
    # casts to float16 itself under mixed precision.
    scaled = tf_keras.layers.Normalization(
        mean=[255.0 * m for m in IMAGENET_MEAN],
        variance=[(255.0 * s) ** 2 for s in IMAGENET_STD],
        dtype="float32", name="densenet_preprocess",
    )(inputs)
    try:
        base = keras_densenet(list(layout), include_top=False, weights=weights,
                              input_shape=shape)
    except ValueError as err:
        raise ValueError(
            f"cannot load {architecture_name(layout)} weights {weights!r} (expected a no-top "
            f"file such as 'densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5'): {err}"
        ) from err
    if frozen_batchnorm is None:
        frozen_batchnorm = weights is not None
    # With pretrained weights, training=False pins BatchNorm to inference mode for
    # good (see set_trainable); from scratch BatchNorm must learn its statistics.
    features = base(scaled, training=False) if frozen_batchnorm else base(scaled)
    x = tf_keras.layers.GlobalAveragePooling2D(name="avg_pool")(features)
    x = tf_keras.layers.Dropout(dropout, name="dropout")(x)
    # float32 output: a float16 softmax loses precision and can overflow the loss.
    outputs = tf_keras.layers.Dense(num_classes, activation="softmax", dtype="float32",
                                    name=OUTPUT_NAME)(x)
    return tf_keras.Model(inputs, outputs, name=f"{base.name}_classifier")


def get_base(model: tf_keras.Model) -> tf_keras.Model:
    """The DenseNet inside the classifier (or `model` itself if it is the base)."""
    nested = [layer for layer in model.layers if isinstance(layer, tf_keras.Model)
              and layer.name.startswith(BASE_PREFIX)]
    if len(nested) == 1:
        return nested[0]
    if not nested and model.name.startswith(BASE_PREFIX) \
            and not model.name.endswith("_classifier"):
        return model
    raise ValueError(f"model {model.name!r} holds no DenseNet base")


def architecture(model: tf_keras.Model) -> str:
    """The name of the classifier's DenseNet (`architecture_name`)."""
    return architecture_name(dense_layout(layer.name for layer in get_base(model).layers))


def layer_stage(name: str) -> int:
    """Position of a DenseNet layer: 1 stem, 2-5 dense block convN and the
    transition poolN that follows it, 6 the final "bn"/"relu"."""
    match = re.match(r"^(conv|pool)(\d)[_/]", name + "_")
    if match:
        return int(match.group(2))
    if name in ("bn", "relu"):
        return 6
    return 1


def set_trainable(model: tf_keras.Model, phase: str, unfreeze_blocks: int = 1) -> list[str]:
    """Freezes and unfreezes layers for a training phase (recompile afterwards).

    Args:
        model: The classifier from `build_model`, or its DenseNet base.
        phase: "head": the whole base is frozen, only the new top trains.
            "fine_tune": the top `unfreeze_blocks` dense blocks train (conv5 is the
            last; each with the transition layer after it), up to the base's output;
            their BatchNormalization layers, the final "bn" included, stay frozen.
            "full": everything trains (used when training from scratch).
        unfreeze_blocks: 1 to 4 dense blocks to unfreeze in "fine_tune". The stem
            (conv1, pool1) stays frozen even with 4.

    Returns:
        Names of the base layers that are trainable and hold weights.

    BatchNormalization stays frozen in fine-tuning: its statistics come from
    ImageNet-sized batches; re-estimating them from small, differently distributed
    fine-tuning batches shifts every feature the new head was just trained on and
    usually wrecks accuracy (the Keras transfer-learning guide does the same). The
    base is also called with `training=False`, so BN runs in inference mode.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if phase == "fine_tune" and not 1 <= unfreeze_blocks <= len(DENSE_BLOCKS):
        raise ValueError(f"unfreeze_blocks must be in 1..{len(DENSE_BLOCKS)}, "
                         f"got {unfreeze_blocks}")
    base = get_base(model)
    model.trainable = True  # the head always trains; also resets nested flags
    if phase == "head":
        base.trainable = False
    elif phase == "fine_tune":
        first_stage = len(DENSE_BLOCKS) + 2 - unfreeze_blocks  # 1 block -> conv5 (stage 5)
        for layer in base.layers:
            layer.trainable = (
                layer_stage(layer.name) >= first_stage
                and not isinstance(layer, tf_keras.layers.BatchNormalization)
            )
    return [layer.name for layer in base.layers if layer.trainable and layer.trainable_weights]


def _leaf_layers(layer):
    sublayers = getattr(layer, "layers", None)
    if not sublayers:
        yield layer
        return
    for sub in sublayers:
        yield from _leaf_layers(sub)


def weight_snapshot(model: tf_keras.Model) -> dict[str, np.ndarray]:
    """All weights keyed by `<layer name>/<index>`.

    Keys do not depend on which layers are trainable (the order of `get_weights`
    does), so a snapshot taken in one phase loads into a model set up for another,
    or into a copy built under another dtype policy. Under a multi-worker strategy
    every worker must call this (reading synchronised variables may all-reduce).
    """
    snapshot = {}
    for layer in _leaf_layers(model):
        for index, variable in enumerate(layer.weights):
            snapshot[f"{layer.name}/{index}"] = np.asarray(variable.numpy())
    return snapshot


def load_snapshot(model: tf_keras.Model, snapshot: dict[str, np.ndarray]) -> None:
    """Assigns a `weight_snapshot` to a model of the same architecture.

    Raises:
        ValueError: The snapshot does not match the model's weights.
    """
    expected = {f"{layer.name}/{i}": v for layer in _leaf_layers(model)
                for i, v in enumerate(layer.weights)}
    if expected.keys() != snapshot.keys():
        missing = sorted(expected.keys() - snapshot.keys())[:5]
        extra = sorted(snapshot.keys() - expected.keys())[:5]
        raise ValueError(f"weights do not match the model: missing {missing}, unexpected {extra}")
    for key, variable in expected.items():
        variable.assign(snapshot[key].astype(variable.dtype.as_numpy_dtype))


def save_snapshot(snapshot: dict[str, np.ndarray], path: str) -> None:
    """Writes a snapshot as .npz (local or gs://), atomically where the filesystem allows."""
    buffer = io.BytesIO()
    np.savez(buffer, **snapshot)
    temporary = path + ".tmp"
    with tf.io.gfile.GFile(temporary, "wb") as f:
        f.write(buffer.getvalue())
    tf.io.gfile.rename(temporary, path, overwrite=True)


def read_snapshot(path: str) -> dict[str, np.ndarray]:
    """Reads a snapshot written by `save_snapshot`."""
    with tf.io.gfile.GFile(path, "rb") as f:
        with np.load(io.BytesIO(f.read()), allow_pickle=False) as data:
            return {key: data[key] for key in data.files}


@contextlib.contextmanager
def dtype_policy(name: str):
    """Sets the global tf-keras dtype policy for the block, restoring the old one."""
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)
