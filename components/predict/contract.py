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

from components.formats.input_kinds import FolderKindError, folder_files, model_folder_kind

PREDICTIONS_FILE = "predictions.jsonl"
IMAGE, TEXT = "image", "text"


class PredictionError(ValueError):
    """Prediction cannot run as asked; the message says what to change."""


def model_family(model_dir: str, name: str = "") -> str:
    """"image" for a DenseNet model folder, "text" for a fastai or transformer one.

    Args:
        model_dir: The model folder (local).
        name: How messages name the folder (default: the folder's path).

    Raises:
        PredictionError: The folder is not a whole model folder of either family: the
            message names the file it lacks, or what it holds instead.
    """
    if not os.path.isdir(model_dir):
        raise PredictionError(f"model folder {model_dir!r} does not exist (or is a file): give "
                              "the training step's model output folder")
    try:
        kind = model_folder_kind(name or f"model folder {model_dir!r}", folder_files(model_dir))
    except FolderKindError as err:
        raise PredictionError(str(err)) from None
    return IMAGE if kind == "image" else TEXT


def read_predictions(path: str) -> list[dict[str, Any]]:
    """The lines of a predictions file, parsed."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
