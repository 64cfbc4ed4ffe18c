"""What the image trainer writes: the model artifact, its SavedModel, its metadata.

The artifact: model.keras, saved_model/ (the serving signatures), labels.json,
preprocessing.json, history.json.

The bytes-in serving signature: TF Serving (Vertex's prebuilt TensorFlow prediction
images) decodes `{"b64": ...}` into a string tensor and calls `serving_default`;
everything between those bytes and the model runs in the graph (`preprocess_batch`),
mirroring `components.common.images` (what sharding did to the training images) step
by step:

- JPEG: decoded at libjpeg's 1/2, 1/4 or 1/8 scale while both sides stay >= the model
  size, like PIL's `draft`, with the same (accurate integer) DCT; the EXIF orientation is
  read from the APP1 segment and applied. PNG, GIF (first frame) and BMP: decoded whole;
  transparency composited on white.
- center crop (PIL `ImageOps.fit`, a fractional box) or letterbox (`ImageOps.pad`) with
  PIL's antialiased bilinear filter, its fixed-point weights and rounding included.
- when the shards held JPEG, the same JPEG round trip at the manifest's quality.

The resize reproduces PIL's integer arithmetic (weights, rounding, the 8-bit result of
each pass, in `images._bilinear`'s fixed order) and the decoders are the same libraries
(libjpeg-turbo, libpng), so a file gives the PIL path's pixels bit for bit; tests check it
for each file type, EXIF orientation and resize method.
Not covered: CMYK JPEGs and EXIF orientation outside JPEG (PIL handles both).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
import tf_keras

from components.common.provenance import provenance
from components.common.storage import write_json_atomically as _write_json
from components.shard.contract import MANIFEST_NAME
from components.train_image.contract import (
    BYTES_INPUT_NAME,
    HISTORY_FILE,
    LABEL_OUTPUT_NAME,
    LABELS_FILE,
    MODEL_FILE,
    PIXELS_SIGNATURE,
    PREPROCESSING_FILE,
    SAVED_MODEL_DIR,
    SERVING_SIGNATURE,
    TrainConfig,
    dense_layout,
)
from components.train_image.model import (
    INPUT_NAME,
    OUTPUT_NAME,
    build_model,
    compile_model,
    dtype_policy,
    load_snapshot,
    plan_phases,
)

log = logging.getLogger(__name__)


def write_artifact(output_dir: str, snapshot, manifest: dict[str, Any], config: TrainConfig,
                   history: dict[str, list], metrics: dict[str, Any],
                   serving: bool = True) -> None:
    """Writes model.keras, saved_model/, labels.json, preprocessing.json, history.json.

    The saved model is a float32 copy, whatever the training precision: float16
    on a CPU (a likely place for evaluation or serving) is ~95x slower, and the
    weights are float32 anyway. It is built outside any strategy scope, so it holds
    plain variables. `serving` False leaves saved_model/ out (tracing its signatures
    takes ~20 s for a DenseNet121): a model kept for its weights alone.
    """
    image_size = manifest["image"]["height"]
    classes = manifest["classes"]
    tf.io.gfile.makedirs(output_dir)
    with dtype_policy("float32"):
        model = build_model(len(classes), image_size, None, config.dropout,
                            frozen_batchnorm=config.pretrained, layout=dense_layout(snapshot))
    load_snapshot(model, snapshot)
    last_lr = plan_phases(config)[-1].learning_rate
    compile_model(model, last_lr)
    model.save(os.path.join(output_dir, MODEL_FILE))
    preprocessing = {
        "image_size": image_size,
        "input": "float32 RGB 0..255",
        "scaling": "DenseNet's preprocess_input (ImageNet mean and std) inside the model",
        "resize_method": manifest["image"].get("resize_method"),
        # how the shards stored the pixels: prediction repeats the JPEG round trip
        "image_format": manifest["image"]["format"],
        "jpeg_quality": manifest["image"].get("jpeg_quality"),
        "serving_signature": SERVING_SIGNATURE,
        "serving_input": f"{BYTES_INPUT_NAME}: encoded image files (JSON {{\"b64\": ...}})",
        "serving_outputs": [OUTPUT_NAME, LABEL_OUTPUT_NAME],
        "pixels_signature": PIXELS_SIGNATURE,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "dtype": "float32",
        "training_precision": metrics.get("precision"),
    }
    if serving:
        export_saved_model(model, os.path.join(output_dir, SAVED_MODEL_DIR), preprocessing,
                           classes)
    _write_json(os.path.join(output_dir, LABELS_FILE), {"classes": classes})
    _write_json(os.path.join(output_dir, PREPROCESSING_FILE), preprocessing)
    # Unsorted: the phases in the order they ran, as the report and the tracker draw them
    # (sorted, fine_tune came before head).
    _write_json(os.path.join(output_dir, HISTORY_FILE), history, sort_keys=False)
    log.info("model written to %s", output_dir)


def model_metadata(result: Mapping[str, Any], config: TrainConfig, dataset_dir: str,
                   weights_fingerprint: str) -> dict[str, Any]:
    """The `Model` artifact's metadata: what the model is and takes, how it was trained,
    and its provenance (code, the sharded dataset's manifest, `config`).

    Args:
        result: What `training.train` returned.
        config: The run's settings.
        dataset_dir: The sharding step's folder (its manifest pins the data).
        weights_fingerprint: The preflight step's digest of the pretrained weights file.
    """
    return {
        "framework": result["framework"],
        "architecture": result["architecture"],
        "classes": result["classes"],
        "num_classes": result["num_classes"],
        "image_size": result["image_size"],
        "input": "float32 RGB 0..255, preprocessing inside the model",
        "serving_signature": SERVING_SIGNATURE,
        "precision": result["precision"],
        "strategy": result["strategy"],
        "replicas": result["replicas"],
        "weights_fingerprint": weights_fingerprint,
        **provenance(os.path.join(dataset_dir, MANIFEST_NAME), dataclasses.asdict(config)),
    }


def export_saved_model(model: tf_keras.Model, path: str, preprocessing: Mapping[str, Any],
                       classes: Sequence[str]) -> None:
    """Exports a SavedModel with two signatures.

    `serving_default`: "image_bytes" (a batch of JPEG/PNG/GIF/BMP files) -> "probabilities"
    and "label" (the top class name), decoding and resizing in the graph as the sharding
    step did (`preprocess_batch`): what Vertex endpoints call with `{"b64": ...}`.
    `serving_pixels`: "image" float32 RGB 0..255 at the model's size -> "probabilities".

    Uses tf-keras's ExportArchive: it saves the forward pass and the variables, not
    the Keras object graph, so loading needs neither Keras nor this package.
    """
    size = preprocessing["image_size"]
    method = preprocessing.get("resize_method") or "crop"
    quality = preprocessing.get("jpeg_quality") if preprocessing.get("image_format") == "jpeg" \
        else None
    archive = tf_keras.export.ExportArchive()
    archive.track(model)
    names = tf.constant(list(classes))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=BYTES_INPUT_NAME)])
    def serve_bytes(image_bytes):
        pixels = preprocess_batch(image_bytes, size, method, quality)
        probabilities = model(pixels, training=False)
        return {OUTPUT_NAME: probabilities,
                LABEL_OUTPUT_NAME: tf.gather(names, tf.argmax(probabilities, axis=1))}

    @tf.function(input_signature=[
        tf.TensorSpec([None, size, size, 3], tf.float32, name=INPUT_NAME)])
    def serve_pixels(image):
        return {OUTPUT_NAME: model(image, training=False)}

    archive.add_endpoint(SERVING_SIGNATURE, serve_bytes)
    archive.add_endpoint(PIXELS_SIGNATURE, serve_pixels)
    # write_out prints every captured variable to stdout unless interactive
    # logging is off; it then goes to the logging module instead.
    interactive = tf_keras.utils.is_interactive_logging_enabled()
    tf_keras.utils.disable_interactive_logging()
    try:
        archive.write_out(path)
    finally:
        if interactive:
            tf_keras.utils.enable_interactive_logging()


# --------------------------------------------------------------------------- serving signature


_JPEG_SCALES = (8, 4, 2, 1)
_EXIF_SCAN_BYTES = 1 << 17  # the APP1 (EXIF) segment is at most 64 KB, near the start
_EXIF_MAX_ENTRIES = 512  # IFD0 entries looked at


def _read_uint(data: tf.Tensor, offsets: tf.Tensor, width: int, little: tf.Tensor) -> tf.Tensor:
    """Unsigned integers of `width` bytes at `offsets` (0 past the end), either byte order."""
    size = tf.size(data)
    value = tf.zeros_like(offsets)
    for i in range(width):
        index = offsets + i
        byte = tf.where(index < size, tf.gather(data, tf.clip_by_value(index, 0, size - 1)), 0)
        shift = tf.where(little, 8 * i, 8 * (width - 1 - i))
        value += tf.bitwise.left_shift(byte, shift)
    return value


def _ifd0_orientation(data: tf.Tensor, tiff: tf.Tensor) -> tf.Tensor:
    """Tag 0x0112 of the TIFF structure starting at `tiff` (1 when absent or out of range)."""
    little = tf.equal(_read_uint(data, tiff, 2, tf.constant(False)), 0x4949)  # "II"
    ifd = tiff + _read_uint(data, tiff + 4, 4, little)
    count = tf.minimum(_read_uint(data, ifd, 2, little), _EXIF_MAX_ENTRIES)
    entries = ifd + 2 + 12 * tf.range(count)
    tags = _read_uint(data, entries, 2, little)
    values = _read_uint(data, entries + 8, 2, little)
    found = tf.boolean_mask(values, tf.equal(tags, 0x0112))
    orientation = tf.cond(tf.size(found) > 0, lambda: found[0], lambda: tf.constant(1))
    return tf.where((orientation >= 1) & (orientation <= 8), orientation, 1)


def exif_orientation(jpeg: tf.Tensor) -> tf.Tensor:
    """The EXIF orientation (1-8) of a JPEG file's bytes; 1 without one.

    Walks the marker segments from the start up to the image data (SOS), as a reader
    does, and reads IFD0 of the first "Exif" APP1 segment.
    """
    data = tf.cast(tf.io.decode_raw(tf.strings.substr(jpeg, 0, _EXIF_SCAN_BYTES), tf.uint8),
                   tf.int32)
    size = tf.size(data)
    exif_header = tf.constant([0x45, 0x78, 0x69, 0x66, 0, 0])  # "Exif\0\0"

    def keep_walking(pos, orientation, done):
        return tf.logical_not(done) & (pos + 4 <= size)

    def segment(pos, orientation, done):
        marker = _read_uint(data, pos, 2, tf.constant(False))
        length = _read_uint(data, pos + 2, 2, tf.constant(False))
        header = _read_uint(data, pos + 4 + tf.range(6), 1, tf.constant(False))
        is_exif = tf.equal(marker, 0xFFE1) & tf.reduce_all(tf.equal(header, exif_header))
        orientation = tf.cond(is_exif, lambda: _ifd0_orientation(data, pos + 10),
                              lambda: orientation)
        # not a marker, start of scan, end of image: no EXIF before the pixels
        stop = (is_exif | (tf.bitwise.right_shift(marker, 8) != 0xFF)
                | tf.equal(marker, 0xFFDA) | tf.equal(marker, 0xFFD9) | (length < 2))
        return pos + 2 + length, orientation, stop

    _, orientation, _ = tf.while_loop(keep_walking, segment,
                                      (tf.constant(2), tf.constant(1), tf.constant(False)))
    return orientation


def apply_orientation(image: tf.Tensor, orientation: tf.Tensor) -> tf.Tensor:
    """Turns stored pixels upright as EXIF orientation 1-8 says (PIL's `exif_transpose`)."""
    branches = [
        lambda: image,
        lambda: tf.image.flip_left_right(image),
        lambda: tf.image.rot90(image, 2),
        lambda: tf.image.flip_up_down(image),
        lambda: tf.image.transpose(image),
        lambda: tf.image.rot90(image, 3),
        lambda: tf.image.rot90(tf.image.transpose(image), 2),
        lambda: tf.image.rot90(image, 1),
    ]
    return tf.switch_case(orientation - 1, branches)


def _decode_jpeg(data: tf.Tensor, size: int) -> tf.Tensor:
    """Decodes at the largest libjpeg scale keeping both sides >= size, then upright."""
    shape = tf.io.extract_jpeg_shape(data)
    fit = tf.minimum(shape[0] // size, shape[1] // size)
    branch = tf.reduce_min(tf.where(fit >= tf.constant(_JPEG_SCALES), tf.range(4), 3))

    def decoder(ratio):
        return lambda: tf.io.decode_jpeg(data, channels=3, ratio=ratio,
                                         dct_method="INTEGER_ACCURATE")

    image = tf.switch_case(branch, [decoder(ratio) for ratio in _JPEG_SCALES])
    return apply_orientation(image, exif_orientation(data))


def _decode_other(data: tf.Tensor) -> tf.Tensor:
    """PNG, BMP (transparency on white) or GIF (first frame) -> uint8 RGB."""
    def gif():
        return tf.io.decode_image(data, channels=3, expand_animations=False)

    def with_alpha():
        rgba = tf.cast(tf.io.decode_image(data, channels=4, expand_animations=False),
                       tf.float32)
        alpha = rgba[..., 3:] / 255.0
        rgb = rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)
        return tf.cast(tf.clip_by_value(tf.round(rgb), 0, 255), tf.uint8)

    is_gif = tf.equal(tf.strings.substr(data, 0, 4), "GIF8")
    return tf.cond(is_gif, gif, with_alpha)


def decode(data: tf.Tensor, size: int) -> tf.Tensor:
    """One image file's bytes -> upright uint8 RGB (H, W, 3), as `images.decode_image`."""
    image = tf.cond(tf.io.is_jpeg(data), lambda: _decode_jpeg(data, size),
                    lambda: _decode_other(data))
    return tf.ensure_shape(image, [None, None, 3])


_PRECISION_BITS = 22  # PIL's fixed-point filter weights for 8-bit images


def _filter_weights(in_size: tf.Tensor, start: tf.Tensor, end: tf.Tensor,
                    out_size) -> tf.Tensor:
    """PIL's bilinear weights (`precompute_coeffs` + `normalize_coeffs_8bpc`) as a dense
    (out_size, in_size) float64 matrix of integers scaled by 2**22."""
    scale = (end - start) / tf.cast(out_size, tf.float64)
    support = tf.maximum(scale, 1.0)  # bilinear support 1, widened when shrinking
    centers = start + (tf.range(out_size, dtype=tf.float64) + 0.5) * scale
    first = tf.maximum(tf.floor(centers - support + 0.5), 0.0)[:, tf.newaxis]
    last = tf.minimum(tf.floor(centers + support + 0.5),
                      tf.cast(in_size, tf.float64))[:, tf.newaxis]
    taps = tf.range(in_size, dtype=tf.float64)[tf.newaxis]
    distance = tf.abs((taps - centers[:, tf.newaxis] + 0.5) / support)
    weights = tf.where((taps >= first) & (taps < last), tf.maximum(1.0 - distance, 0.0), 0.0)
    total = tf.reduce_sum(weights, axis=1, keepdims=True)
    weights = tf.math.divide_no_nan(weights, total)
    return tf.floor(0.5 + weights * 2.0 ** _PRECISION_BITS)


def _fixed_point(sums: tf.Tensor) -> tf.Tensor:
    """PIL's `clip8`: fixed-point sums (exact in float64) -> 8-bit values, half up."""
    levels = tf.floor((sums + 2.0 ** (_PRECISION_BITS - 1)) / 2.0 ** _PRECISION_BITS)
    return tf.clip_by_value(levels, 0.0, 255.0)


def _resample(image: tf.Tensor, out_hw, box) -> tf.Tensor:
    """PIL's `resize(out, BILINEAR, box=(left, top, right, bottom))` of uint8 pixels: its
    weights, its horizontal-then-vertical passes, each rounded to 8 bits.

    Dense weight matrices keep it simple; JPEGs arrive pre-shrunk to < 2x the model
    size by the scaled decode, so the matrices stay small except for huge PNGs.
    """
    out_h, out_w = out_hw
    left, top, right, bottom = box
    shape = tf.shape(image)
    horizontal = _filter_weights(shape[1], left, right, out_w)
    vertical = _filter_weights(shape[0], top, bottom, out_h)
    rows = _fixed_point(tf.einsum("hwc,ow->hoc", tf.cast(image, tf.float64), horizontal))
    pixels = _fixed_point(tf.einsum("hwc,oh->owc", rows, vertical))
    return tf.cast(pixels, tf.uint8)


def resize(image: tf.Tensor, size: int, method: str) -> tf.Tensor:
    """`images.resize`: size x size by center crop ("crop") or letterbox ("pad"); uint8."""
    shape = tf.shape(image)
    height, width = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
    zero = tf.constant(0.0, tf.float64)
    if method == "crop":
        # ImageOps.fit: the largest centred box of the output's (square) shape
        side = tf.minimum(width, height)
        left, top = (width - side) * 0.5, (height - side) * 0.5
        return _resample(image, (size, size), (left, top, left + side, top + side))
    # ImageOps.pad: fit inside (Python's round, half to even, as tf.round), then centre
    new_h = tf.where(width > height, tf.round(height / width * size), size)
    new_w = tf.where(width < height, tf.round(width / height * size), size)
    new_h, new_w = tf.cast(new_h, tf.int32), tf.cast(new_w, tf.int32)
    inner = _resample(image, (new_h, new_w), (zero, zero, width, height))
    offset_y = tf.cast(tf.round(tf.cast(size - new_h, tf.float64) * 0.5), tf.int32)
    offset_x = tf.cast(tf.round(tf.cast(size - new_w, tf.float64) * 0.5), tf.int32)
    return tf.image.pad_to_bounding_box(inner, offset_y, offset_x, size, size)


def preprocess(data: tf.Tensor, size: int, method: str, jpeg_quality: int | None) -> tf.Tensor:
    """One image file's bytes -> the uint8 (size, size, 3) pixels the shards would hold.

    Args:
        data: Scalar string tensor: a JPEG, PNG, GIF or BMP file.
        size: The model's image size.
        method: "crop" or "pad", the sharding step's resize method.
        jpeg_quality: The shards' JPEG quality, or None when they held raw pixels.
    """
    pixels = resize(decode(data, size), size, method)
    if jpeg_quality is not None:
        # the shards' JPEG round trip, decoded as the training reader decodes it
        pixels = tf.io.decode_jpeg(tf.io.encode_jpeg(pixels, quality=jpeg_quality), channels=3)
    return tf.ensure_shape(pixels, [size, size, 3])


def preprocess_batch(files: tf.Tensor, size: int, method: str,
                     jpeg_quality: int | None) -> tf.Tensor:
    """A batch of image files' bytes (shape [N]) -> float32 (N, size, size, 3) pixels."""
    pixels = tf.map_fn(lambda data: preprocess(data, size, method, jpeg_quality), files,
                       fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8))
    return tf.cast(pixels, tf.float32)
