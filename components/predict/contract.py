"""The prediction step's contract: which model a folder holds and what predictions look like.

Output: one JSON object per line (`predictions.jsonl`), one per input, in input order:
`{"input": <file URI or CSV row index>, "labels": [...], "scores": {<label>: <probability>}}`,
or `{"input": ..., "error": <reason>}` when the input cannot be read. A text over
`MAX_TEXT_CHARS` characters (`components.text_common.contract`) is read up to it, and its line adds
`"truncated": true`. Image inputs are files (any depth under a folder); text inputs are
the rows of a CSV, numbered from 0 as data rows (the header is not a row). Nothing here
imports TensorFlow, torch or fastai.
"""

from __future__ import annotations

import json
import os
from typing import Any

from components.text_common.contract import EXPORT_FILE
from components.text_common.models import is_text_model_folder
from components.train_image.contract import MODEL_FILE

PREDICTIONS_FILE = "predictions.jsonl"
IMAGE, TEXT = "image", "text"


class PredictionError(ValueError):
    """Prediction cannot run as asked; the message says what to change."""


def model_family(model_dir: str) -> str:
    """"image" for a DenseNet model folder, "text" for a fastai or transformer one.

    Raises:
        PredictionError: The folder holds neither (the message names what was looked for).
    """
    if is_text_model_folder(model_dir):
        return TEXT
    if os.path.isfile(os.path.join(model_dir, MODEL_FILE)):
        return IMAGE
    raise PredictionError(f"{model_dir!r} is not a trained model folder: it has neither "
                          f"{MODEL_FILE} (image model) nor {EXPORT_FILE} or config.json (text "
                          "model); give the training step's model output")


def read_predictions(path: str) -> list[dict[str, Any]]:
    """The lines of a predictions file, parsed."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
