"""What the image trainer writes: the model artifact, its SavedModel, its metadata.

The artifact: model.keras, saved_model/ (the serving signatures), labels.json,
preprocessing.json, history.json.

The bytes-in serving signature: TF Serving (Vertex's prebuilt TensorFlow prediction
images) decodes `{"b64": ...}` into a string tensor and calls `serving_default`;
everything between those bytes and the model runs in the graph (`preprocess_batch`),
with plain TensorFlow ops doing what `components.common.images` (PIL, the sharding step)
does, not bit for bit:

- decode: JPEG (libjpeg's accurate DCT, as PIL), PNG and BMP (transparency on white),
  GIF (first frame), all at full size; PIL lets libjpeg shrink big JPEGs while decoding.
- center crop on whole pixels (PIL: a fractional box) or letterbox with PIL's sizes and
  offsets, then `tf.image.resize` (bilinear, antialiased) in float, rounded to uint8.
- when the shards held JPEG, the same JPEG round trip at the manifest's quality.

What differs from the shards' pixels: EXIF orientation is not applied (send upright
images: a sideways phone photo is served sideways), CMYK JPEGs are not read, and the
pixels differ by a few levels (`tests/test_serving_signature.py` bounds it per file
type and resize method); measured not to move the demo model's accuracy beyond seed noise.
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
    and "label" (the top class name), decoding and resizing in the graph much as the
    sharding step did (`preprocess_batch`): what Vertex endpoints call with `{"b64": ...}`.
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


def decode(data: tf.Tensor) -> tf.Tensor:
    """One image file's bytes -> float32 RGB (H, W, 3) 0..255, transparency on white."""
    def jpeg():
        return tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE")

    def gif():  # TF decodes GIF frames as RGB only
        return tf.io.decode_image(data, channels=3, expand_animations=False)

    def with_alpha():
        rgba = tf.cast(tf.io.decode_image(data, channels=4, expand_animations=False),
                       tf.float32)
        alpha = rgba[..., 3:] / 255.0
        return rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)

    is_gif = tf.equal(tf.strings.substr(data, 0, 4), "GIF8")
    image = tf.cond(tf.io.is_jpeg(data), lambda: tf.cast(jpeg(), tf.float32),
                    lambda: tf.cond(is_gif, lambda: tf.cast(gif(), tf.float32), with_alpha))
    return tf.ensure_shape(image, [None, None, 3])


def resize(image: tf.Tensor, size: int, method: str) -> tf.Tensor:
    """`images.resize`: size x size by center crop ("crop") or letterbox ("pad"); float."""
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    if method == "crop":
        # ImageOps.fit's centred square box, fractional as PIL's: tf.image.resize's own
        # antialiased kernel, scaled and shifted
        hw = tf.cast(tf.stack([height, width]), tf.float32)
        scale = size / tf.reduce_min(hw)
        shift = (hw - tf.reduce_min(hw)) / 2 * scale
        return tf.raw_ops.ScaleAndTranslate(
            images=image[tf.newaxis], size=[size, size], scale=tf.stack([scale, scale]),
            translation=-shift, kernel_type="triangle", antialias=True)[0]
    # ImageOps.pad's sizes and offsets (Python's round is half to even, as tf.round)
    ratio = tf.cast(width, tf.float64) / tf.cast(height, tf.float64)
    new_h = tf.where(width > height, tf.round(size / ratio), size)
    new_w = tf.where(width < height, tf.round(size * ratio), size)
    new_h, new_w = tf.cast(new_h, tf.int32), tf.cast(new_w, tf.int32)
    inner = tf.image.resize(image, tf.stack([new_h, new_w]), antialias=True)
    offset_y = tf.cast(tf.round(tf.cast(size - new_h, tf.float64) / 2), tf.int32)
    offset_x = tf.cast(tf.round(tf.cast(size - new_w, tf.float64) / 2), tf.int32)
    return tf.image.pad_to_bounding_box(inner, offset_y, offset_x, size, size)


def preprocess(data: tf.Tensor, size: int, method: str, jpeg_quality: int | None) -> tf.Tensor:
    """One image file's bytes -> uint8 (size, size, 3) pixels, close to the shards'.

    Args:
        data: Scalar string tensor: a JPEG, PNG, GIF or BMP file.
        size: The model's image size.
        method: "crop" or "pad", the sharding step's resize method.
        jpeg_quality: The shards' JPEG quality, or None when they held raw pixels.
    """
    resized = resize(decode(data), size, method)
    pixels = tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)
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
