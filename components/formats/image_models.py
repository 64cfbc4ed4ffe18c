"""The loader of the image trainer's `model.keras` (tf-keras), for steps that run it."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile


def load_keras_model(path: str, compile: bool = True):
    """Loads a tf-keras `.keras` file about 10x faster than `tf_keras.models.load_model`,
    whose seeks inside the zip re-read it (~80 s for DenseNet121): the weights go out first.

    Args:
        path: A `.keras` file written by tf-keras (local or gs://).
        compile: Restore the training configuration (loss, metrics, optimizer).

    Returns:
        The model.
    """
    import tensorflow as tf
    import tf_keras

    with tf.io.gfile.GFile(path, "rb") as f:
        archive = zipfile.ZipFile(io.BytesIO(f.read()))
    with archive, tempfile.TemporaryDirectory() as workdir:
        config = json.loads(archive.read("config.json"))
        if not compile:
            config["compile_config"] = None
        model = tf_keras.saving.deserialize_keras_object(config)
        model.load_weights(archive.extract("model.weights.h5", workdir))
    return model
