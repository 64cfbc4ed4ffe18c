"""What the image trainer writes: the model artifact, its SavedModel, its metadata.

`serving_default` takes the files' bytes and does in the graph (`preprocess_batch`) what the
sharding step's PIL code does, within a few levels (tests/test_serving_signature.py); EXIF
orientation is not applied (send upright images) and CMYK JPEGs are not read.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
import tf_keras

from components.common.provenance import provenance
from components.common.storage import write_json_atomically
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

    The model saved is a float32 copy with plain variables (float16 is ~95x slower on CPUs).
    saved_model/ has `serving_default`: "image_bytes" -> "probabilities", "label" (the top
    class), and `serving_pixels`: "image" float32 RGB 0..255 -> "probabilities";
    `serving` False leaves it out (tracing takes ~20 s).
    """
    stored, classes = manifest["image"], manifest["classes"]  # how the shards hold images
    size = stored["height"]
    tf.io.gfile.makedirs(output_dir)
    with dtype_policy("float32"):
        lite = config.architecture == "efficientnet_lite0"
        model = build_model(len(classes), size, None, config.dropout,
                            frozen_batchnorm=config.pretrained,
                            layout=None if lite else dense_layout(snapshot),
                            architecture=config.architecture)
    load_snapshot(model, snapshot)
    compile_model(model, plan_phases(config)[-1].learning_rate)
    model.save(os.path.join(output_dir, MODEL_FILE))
    preprocessing = {
        "image_size": size,
        "input": "float32 RGB 0..255",
        "scaling": ("(x - 127) / 128, EfficientNet-Lite's, inside the model" if lite else
                    "DenseNet's preprocess_input (ImageNet mean and std) inside the model"),
        "resize_method": stored.get("resize_method"),
        "image_format": stored["format"],
        "jpeg_quality": stored.get("jpeg_quality"),
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
        method = stored.get("resize_method") or "crop"
        quality = stored.get("jpeg_quality") if stored["format"] == "jpeg" else None
        archive = tf_keras.export.ExportArchive()
        archive.track(model)
        names = tf.constant(list(classes))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=BYTES_INPUT_NAME)])
        def serve_bytes(image_bytes):
            probabilities = model(preprocess_batch(image_bytes, size, method, quality),
                                  training=False)
            return {OUTPUT_NAME: probabilities,
                    LABEL_OUTPUT_NAME: tf.gather(names, tf.argmax(probabilities, axis=1))}

        @tf.function(input_signature=[
            tf.TensorSpec([None, size, size, 3], tf.float32, name=INPUT_NAME)])
        def serve_pixels(image):
            return {OUTPUT_NAME: model(image, training=False)}

        archive.add_endpoint(SERVING_SIGNATURE, serve_bytes)
        archive.add_endpoint(PIXELS_SIGNATURE, serve_pixels)
        # write_out prints every variable to stdout unless interactive logging is off
        interactive = tf_keras.utils.is_interactive_logging_enabled()
        tf_keras.utils.disable_interactive_logging()
        try:
            archive.write_out(os.path.join(output_dir, SAVED_MODEL_DIR))
        finally:
            if interactive:
                tf_keras.utils.enable_interactive_logging()
    write_json_atomically(os.path.join(output_dir, LABELS_FILE), {"classes": classes})
    write_json_atomically(os.path.join(output_dir, PREPROCESSING_FILE), preprocessing)
    # Unsorted: the phases in the order they ran.
    write_json_atomically(os.path.join(output_dir, HISTORY_FILE), history, sort_keys=False)
    log.info("model written to %s", output_dir)


def model_metadata(result: Mapping[str, Any], config: TrainConfig, dataset_dir: str,
                   weights_fingerprint: str) -> dict[str, Any]:
    """The `Model` artifact's metadata: what the model takes, its training, its provenance.

    Args:
        result: What `training.train` returned.
        config: The run's settings.
        dataset_dir: The sharding step's folder (its manifest pins the data).
        weights_fingerprint: The preflight step's digest of the weights file.
    """
    return {
        **{k: result[k] for k in ("framework", "architecture", "classes", "num_classes",
                                  "image_size")},
        "input": "float32 RGB 0..255, preprocessing inside the model",
        "serving_signature": SERVING_SIGNATURE,
        **{k: result[k] for k in ("precision", "strategy", "replicas")},
        "weights_fingerprint": weights_fingerprint,
        **provenance(os.path.join(dataset_dir, MANIFEST_NAME), dataclasses.asdict(config)),
    }


def preprocess(data: tf.Tensor, size: int, method: str, jpeg_quality: int | None) -> tf.Tensor:
    """One image file's bytes -> uint8 (size, size, 3) pixels, close to the shards'.

    Args:
        data: Scalar string tensor: a JPEG, PNG, GIF or BMP file.
        size: The model's image size.
        method: "crop" (center crop) or "pad" (letterbox), the sharding step's resize method.
        jpeg_quality: The shards' JPEG quality, or None when they held raw pixels.
    """
    # float32 RGB 0..255, transparency on white
    def decoded(channels):  # GIF frames decode as RGB only
        return tf.cast(tf.io.decode_image(data, channels=channels, expand_animations=False),
                       tf.float32)

    def with_alpha():
        rgba = decoded(4)
        alpha = rgba[..., 3:] / 255.0
        return rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)

    is_gif = tf.equal(tf.strings.substr(data, 0, 4), "GIF8")
    image = tf.cond(
        tf.io.is_jpeg(data),
        lambda: tf.cast(tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE"),
                        tf.float32),
        lambda: tf.cond(is_gif, lambda: decoded(3), with_alpha))
    image = tf.ensure_shape(image, [None, None, 3])

    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    if method == "crop":
        # ImageOps.fit's centred fractional box: resize's antialiased kernel, shifted
        hw = tf.cast(tf.stack([height, width]), tf.float32)
        scale = size / tf.reduce_min(hw)
        shift = (hw - tf.reduce_min(hw)) / 2 * scale
        resized = tf.raw_ops.ScaleAndTranslate(
            images=image[tf.newaxis], size=[size, size], scale=tf.stack([scale, scale]),
            translation=-shift, kernel_type="triangle", antialias=True)[0]
    else:
        # ImageOps.pad's sizes and offsets (Python's round is half to even, as tf.round)
        ratio = tf.cast(width, tf.float64) / tf.cast(height, tf.float64)
        new_h = tf.cast(tf.where(width > height, tf.round(size / ratio), size), tf.int32)
        new_w = tf.cast(tf.where(width < height, tf.round(size * ratio), size), tf.int32)
        inner = tf.image.resize(image, tf.stack([new_h, new_w]), antialias=True)
        offset_y = tf.cast(tf.round(tf.cast(size - new_h, tf.float64) / 2), tf.int32)
        offset_x = tf.cast(tf.round(tf.cast(size - new_w, tf.float64) / 2), tf.int32)
        resized = tf.image.pad_to_bounding_box(inner, offset_y, offset_x, size, size)

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
