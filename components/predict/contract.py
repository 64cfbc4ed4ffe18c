"""The prediction step's contract: which model a folder holds and what predictions look like
(`predictions.jsonl`, in input order: `{"input": <file URI or CSV row from 0>, "labels",
"scores": {<label>: <probability>}}`, `"truncated": true` for a long text, or `{"input",
"error"}`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from components.common.input_kinds import FolderKind, FolderKindError, folder_files
from components.common.storage import filesystem
from components.text_common.contract import (
    EXPORT_FILE,
    LABELS_FILE,
    MODEL_CONFIG_FILE,
    TOKENIZER_FILES,
    WEIGHTS_FILES,
)
from components.train_image.contract import MODEL_FILE, PREPROCESSING_FILE

PREDICTIONS_FILE = "predictions.jsonl"
IMAGE, TEXT = "image", "text"


class PredictionError(ValueError):
    """Prediction cannot run as asked; the message says what to change."""


_TRAINED = "the training step's model output"
# The trained model folders prediction, serving and evaluation read, one description each.
MODEL_FOLDERS = {
    "image": FolderKind(
        "an image model folder", marks=(MODEL_FILE, PREPROCESSING_FILE),
        required=((MODEL_FILE,), (LABELS_FILE,), (PREPROCESSING_FILE,)),
        made_by=f"{_TRAINED} (the image trainer)"),
    "fastai": FolderKind(
        "a fastai text model folder", marks=(EXPORT_FILE,),
        required=((EXPORT_FILE,), (LABELS_FILE,)), made_by=f"{_TRAINED} (the text trainer)"),
    "transformer": FolderKind(
        "a transformer text model folder", marks=(MODEL_CONFIG_FILE, *WEIGHTS_FILES),
        required=((MODEL_CONFIG_FILE,), WEIGHTS_FILES, TOKENIZER_FILES, (LABELS_FILE,)),
        made_by=f"{_TRAINED} (the transformer trainer)"),
}
# Folders of other kinds, told apart from a model folder by a file they hold.
_OTHER_FOLDERS = (
    ("lm_metrics.json", "language model assets (the LM step's lm_assets), which the text "
                        "pipeline starts from; they label nothing"),
    ("manifest.json", "the sharding or preparation step's dataset, not a trained model"),
    ("predictions.jsonl", "a prediction step's output, not a model"),
)


def model_folder_kind(name: str, files: Iterable[str]) -> str:
    """Which trained model folder `files` make: "image", "fastai" or "transformer" (one
    marked as a kind but lacking a file is named with that file, never taken for another).

    Args:
        name: The folder, as the message names it.
        files: The names of the files directly in it.

    Raises:
        FolderKindError: The kind it looks like and the file it lacks, or what it holds.
    """
    files, kinds = set(files), MODEL_FOLDERS
    for key, kind in kinds.items():
        if kind.marked(files) and not kind.missing(files):
            return key
    marked = [kind for kind in kinds.values() if kind.marked(files)]
    if marked:
        kind = max(marked, key=lambda k: len(k.marked(files)))
        raise FolderKindError(
            f"{name} looks like {kind.name} ({', '.join(kind.marked(files))} found) but has no "
            f"{' and no '.join(kind.missing(files))}; give {kind.made_by}, whole")
    for mark, what in _OTHER_FOLDERS:
        if mark in files:
            raise FolderKindError(f"{name} holds {mark}: it is {what}; give a trained "
                                  "model folder (the training step's model output)")
    found = ", ".join(sorted(files)[:8]) + (", ..." if len(files) > 8 else "") if files \
        else "nothing"
    wanted = "; ".join(f"{kind.name}: {', '.join(' or '.join(g) for g in kind.required)}"
                       for kind in kinds.values())
    raise FolderKindError(f"{name} is not a trained model folder: it holds {found}. "
                          f"Expected {wanted}; give the training step's model output")


def model_family(model_dir: str, name: str = "") -> str:
    """"image" for a DenseNet model folder, "text" for a fastai or transformer one.

    Args:
        model_dir: The model folder (local).
        name: How messages name the folder (default: the folder's path).

    Raises:
        PredictionError: Not a whole model folder of either family.
    """
    if not os.path.isdir(model_dir):
        raise PredictionError(f"model folder {model_dir!r} does not exist (or is a file): give "
                              "the training step's model output folder")
    try:
        kind = model_folder_kind(name or f"model folder {model_dir!r}", folder_files(model_dir))
    except FolderKindError as err:
        folders = sorted(entry.name for entry in os.scandir(model_dir) if entry.is_dir())
        inside = (f" Its sub-folders ({', '.join(folders[:8])}) are not read: a model folder "
                  "holds its files at its top; give the folder that holds them."
                  if folders else "")
        raise PredictionError(f"{err}{inside}") from None
    return IMAGE if kind == "image" else TEXT


def list_inputs(data_uri: str) -> tuple[list[str], list[str]]:
    """`(files, hidden)`: the sorted URIs under a folder (any depth) or the one file named,
    and the hidden files left out.

    Raises:
        PredictionError: Nothing there.
    """
    fs, root = filesystem(data_uri)
    if fs.isfile(root):
        return [data_uri], []
    if not fs.isdir(root):
        raise PredictionError(f"{data_uri!r} does not exist: give a folder of images or an "
                              "image file")
    prefix = data_uri.rstrip("/")
    files, hidden = [], []
    for path in sorted(fs.find(root)):
        relative = os.path.relpath(path, root.rstrip("/"))
        uri = f"{prefix}/{relative}"
        (hidden if any(p.startswith(".") for p in relative.split("/")) else files).append(uri)
    if not files:
        raise PredictionError(f"no files under {data_uri!r}"
                              + (f" ({len(hidden)} hidden ones left out)" if hidden else "")
                              + ": give a folder of images or an image file")
    return files, hidden


def read_predictions(path: str) -> list[dict[str, Any]]:
    """The lines of a predictions file, parsed."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
