"""Achieved training FLOP/s of a Keras model: its forward FLOPs counted from its layers, and
the dense peak of the accelerators Vertex offers (bench/gpu_bench.py reports both)."""

from __future__ import annotations

# A training step (forward, gradients for activations and weights) is ~3x the forward's FLOPs.
TRAIN_PER_FORWARD = 3

# Dense (no sparsity) peak TFLOP/s: (16-bit tensor cores, float32 as Keras runs it:
# TF32 tensor cores on Ampere and newer, else plain FP32), from NVIDIA's data sheets.
# Matched on the device name; the first key found wins, so longer names come first.
PEAK_TFLOPS = {
    "H100 PCIe": (756.0, 378.0),
    "H100": (989.4, 494.7),
    "H200": (989.4, 494.7),
    "A100": (312.0, 156.0),
    "L4": (121.0, 60.0),
    "A10": (125.0, 62.5),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
    "P100": (18.7, 9.3),
}


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The device's dense peak for `precision` ("mixed_float16" or "float32"), if known."""
    for key, (half, single) in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower():
            return half if precision == "mixed_float16" else single
    return None


def forward_flops(model) -> int:
    """FLOPs of one image's forward pass: 2 x the multiply-adds of every Conv2D,
    DepthwiseConv2D and Dense layer (on 2-D inputs, each called once), nested models
    included, Keras 2 or 3. BatchNorm, pooling and activations (a few percent) are not
    counted, as in the usual figures."""
    total = 0
    for layer in _leaf_layers(model):
        kind = type(layer).__name__
        if kind == "Conv2D":
            height, width, channels_out = layer.output.shape[1:]
            kernel_height, kernel_width, channels_in, _ = layer.kernel.shape
            total += 2 * height * width * channels_out * kernel_height * kernel_width * (
                channels_in)
        elif kind == "DepthwiseConv2D":  # one filter per input channel
            height, width, channels_out = layer.output.shape[1:]
            kernel_height, kernel_width = layer.depthwise_kernel.shape[:2]
            total += 2 * height * width * channels_out * kernel_height * kernel_width
        elif kind == "Dense":
            total += 2 * int(layer.kernel.shape[0]) * int(layer.kernel.shape[1])
    return int(total)


def _leaf_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers"):  # a nested model, e.g. the DenseNet base
            yield from _leaf_layers(layer)
        else:
            yield layer


def train_tflops(images_per_second: float, forward_flops_per_image: int) -> float:
    """Achieved training TFLOP/s at `images_per_second` (TRAIN_PER_FORWARD passes a step)."""
    return images_per_second * TRAIN_PER_FORWARD * forward_flops_per_image / 1e12
