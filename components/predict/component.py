"""KFP face of batch prediction: `predict_to_file` for both families, each pipeline
building it in its own image (TensorFlow for images, fastai for texts)."""

from kfp.dsl import Artifact, Input, Model, Output


def predict(
    model: Input[Model],
    data_uri: str,
    predictions: Output[Artifact],
    batch_size: int = 64,
    data_fingerprint: str = "",
):
    """Labels new data with the trained model: one JSON line per input, unreadable ones included.

    Args:
        model: Folder from the training step (image: model.keras; text: export.pkl).
        data_uri: gs:// URI (or local path) of what to label: a folder of images (any depth) for the image model, a CSV with the training text column for the text model.
        predictions: Folder holding `predictions.jsonl`: {"input", "labels", "scores"} per input, or {"input", "error"} for one that cannot be read; counts in the metadata.
        batch_size: Inputs per forward pass.
        data_fingerprint: Digest of data_uri's listing from the preflight step; not read, it only makes the cache key change when the files to label do (new images under the same folder). Recorded in the metadata.
    """
    import logging
    import os

    from components.predict.contract import PREDICTIONS_FILE
    from components.predict.prediction import predict_to_file

    logging.basicConfig(level=logging.INFO)
    os.makedirs(predictions.path, exist_ok=True)
    counts = predict_to_file(model.path, data_uri,
                             os.path.join(predictions.path, PREDICTIONS_FILE), batch_size)
    predictions.metadata.update({**counts, "output": PREDICTIONS_FILE, "data_uri": data_uri,
                                 "data_fingerprint": data_fingerprint})
