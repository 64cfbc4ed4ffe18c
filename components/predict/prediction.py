"""Batch prediction with a trained model: a folder of images or a CSV of texts -> JSON lines.

Images are decoded as the sharding step does (and JPEG round-tripped when the shards held
JPEG), so a test-split file scores as its shard did; the output appears whole or not at all.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import numpy as np
from tqdm import tqdm

from components.common.images import BadImage, decode_image, encode_image, resize
from components.common.input_kinds import InputKindError, csv_header, text_problem
from components.common.storage import TMP_PREFIX, filesystem, is_remote, read_json
from components.predict.contract import IMAGE, PredictionError, list_inputs, model_family
from components.text_common.contract import MAX_TEXT_CHARS

log = logging.getLogger(__name__)

_CSV_CHUNK_ROWS = 4096  # rows read from the CSV at a time


def prediction_line(scores: np.ndarray, labels: Sequence[str],
                    threshold: float | None) -> dict[str, Any]:
    """One output record less its input: every label's probability and the labels predicted,
    with a (multi-label) threshold every label at or over it (maybe none), with None the
    most probable one."""
    chosen = ([labels[int(np.argmax(scores))]] if threshold is None
              else [label for label, p in zip(labels, scores) if p >= threshold])
    return {"labels": chosen,
            "scores": {label: round(float(p), 6) for label, p in zip(labels, scores)}}


def text_predictions(texts: Sequence[str], problems: Sequence[str], probabilities_of,
                     labels: Sequence[str], threshold: float | None) -> list[dict[str, Any]]:
    """Per text, its prediction line without "input", or `{"error": its problem}`.

    Args:
        texts: The texts (one over `MAX_TEXT_CHARS` is cut there: `"truncated": true`).
        problems: Per text, why it cannot be scored; "" when it can.
        probabilities_of: The scorable texts -> their probabilities (n, labels); called once.
        labels: Label names in column order.
        threshold: Multi-label threshold; None for single-label (see `prediction_line`).
    """
    usable = [i for i, problem in enumerate(problems) if not problem]
    scored = dict(zip(usable, probabilities_of([texts[i] for i in usable]) if usable else []))
    lines = []
    for i, text in enumerate(texts):
        if i not in scored:
            lines.append({"error": problems[i]})
            continue
        line = prediction_line(scored[i], labels, threshold)
        if len(text) > MAX_TEXT_CHARS:
            line["truncated"] = True
        lines.append(line)
    return lines


@contextlib.contextmanager
def _whole_or_nothing(output: str) -> Iterator[TextIO]:
    """A local temporary file to write lines to, moved or uploaded to `output` (local or
    gs://) in one piece on success; on failure nothing is left at `output`."""
    fs, path = filesystem(output)
    parent = os.path.dirname(path) if not is_remote(output) else None
    if parent:
        os.makedirs(parent, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".jsonl", dir=parent)
    try:
        with os.fdopen(handle, "w") as f:
            yield f
        if parent is not None:
            os.replace(temporary, path)
        else:
            fs.put_file(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def preprocess_image(data: bytes, preprocessing: dict[str, Any]) -> np.ndarray:
    """Image file bytes -> uint8 (size, size, 3) pixels, as the trainer's shards held them.

    Args:
        data: The file's bytes.
        preprocessing: The model's `preprocessing.json`.

    Raises:
        BadImage: Not a readable image (the message says why).
    """
    size = preprocessing["image_size"]
    image = resize(decode_image(data, size), size, preprocessing.get("resize_method") or "crop")
    if preprocessing.get("image_format") == "jpeg":
        import tensorflow as tf

        encoded = encode_image(image, "jpeg", preprocessing["jpeg_quality"])
        return tf.io.decode_jpeg(encoded, channels=3).numpy()
    return np.asarray(image, dtype=np.uint8)


def _predict_images(model_dir: str, data_uri: str, out: TextIO, batch_size: int,
                    progress: bool) -> dict[str, Any]:
    from components.formats.image_models import load_keras_model
    from components.train_image.contract import MODEL_FILE, PREPROCESSING_FILE, load_class_names

    files, hidden = list_inputs(data_uri)
    classes = load_class_names(model_dir)
    preprocessing = read_json(os.path.join(model_dir, PREPROCESSING_FILE))
    model = load_keras_model(os.path.join(model_dir, MODEL_FILE), compile=False)
    fs, _ = filesystem(data_uri)
    counts = {"inputs": len(files), "predicted": 0, "errors": 0,
              "hidden_left_out": len(hidden), "hidden_examples": hidden[:5]}
    with tqdm(total=len(files), unit="img", desc="predicting", disable=not progress,
              mininterval=2.0) as bar:
        for start in range(0, len(files), batch_size):
            batch = files[start:start + batch_size]
            # one request, fetched concurrently; cat_ranges, as cat expands "[", "*" and "?"
            paths = [filesystem(uri)[1] for uri in batch]
            contents = fs.cat_ranges(paths, [None] * len(paths), [None] * len(paths),
                                     on_error="return")
            errors: list[dict[str, Any] | None] = []  # None: preprocessed into pixels
            pixels = []
            for uri, data in zip(batch, contents):
                try:
                    if isinstance(data, Exception):
                        raise BadImage(f"unreadable file: {data}")
                    pixels.append(preprocess_image(data, preprocessing))
                    errors.append(None)
                except BadImage as err:
                    errors.append({"input": uri, "error": str(err)})
            probs = iter(model.predict_on_batch(np.stack(pixels).astype(np.float32))
                         if pixels else [])
            for uri, error in zip(batch, errors):
                counts["predicted" if error is None else "errors"] += 1
                line = error or {"input": uri, **prediction_line(next(probs), classes, None)}
                out.write(json.dumps(line) + "\n")
            bar.update(len(batch))
    return counts


def _read_csv_chunks(data_uri: str, column: str) -> Iterator[Any]:
    import pandas as pd

    fs, path = filesystem(data_uri)
    if not fs.isfile(path):
        raise PredictionError(f"{data_uri!r} is not a file: give a CSV with a text column")
    with fs.open(path, "rb") as raw, io.TextIOWrapper(raw, encoding="utf-8-sig") as f:
        try:
            csv_header(f, repr(data_uri), {column: "text_column"})
            f.seek(0)
            yield from pd.read_csv(f, chunksize=_CSV_CHUNK_ROWS, dtype=str,
                                   keep_default_na=False)
        except InputKindError as err:
            raise PredictionError(str(err)) from None
        except UnicodeDecodeError as err:
            raise PredictionError(f"{data_uri!r} is not UTF-8 text ({err}); save the CSV as "
                                  "UTF-8") from err
        except pd.errors.ParserError as err:
            raise PredictionError(f"{data_uri!r} is not a readable CSV: {err}") from err


def decision_threshold(labels_info: dict[str, Any]) -> float | None:
    """`prediction_line`'s threshold for a text model's `labels.json`: the trained one, or None."""
    return labels_info["threshold"] if labels_info["task"] == "multi_label" else None


def _predict_texts(model_dir: str, data_uri: str, out: TextIO, batch_size: int,
                   progress: bool, text_column: str) -> dict[str, Any]:
    from components.text_common.models import load_text_model

    model = load_text_model(model_dir)
    labels, threshold = model.info["labels"], decision_threshold(model.info)
    column = text_column or model.info.get("text_column") or "text"
    counts = {"inputs": 0, "predicted": 0, "errors": 0, "truncated": 0,
              "max_text_chars": MAX_TEXT_CHARS, "text_column": column}
    row = 0
    with tqdm(unit="row", desc="predicting", disable=not progress, mininterval=2.0) as bar:
        for chunk in _read_csv_chunks(data_uri, column):
            texts = [str(t) for t in chunk[column]]
            problems = [text_problem(t) if t.strip() else f"empty text in column {column!r}"
                        for t in texts]
            lines = text_predictions(texts, problems,
                                     lambda usable: model.probabilities(usable, batch_size),
                                     labels, threshold)
            for i, line in enumerate(lines):
                counts["errors" if "error" in line else "predicted"] += 1
                counts["truncated"] += bool(line.get("truncated"))
                out.write(json.dumps({"input": row + i, **line}) + "\n")
            row += len(texts)
            bar.update(len(texts))
    counts["inputs"] = row
    if not row:
        raise PredictionError(f"{data_uri!r} has no data rows")
    if counts["truncated"]:
        log.warning("%d text(s) over %d characters: each read up to its first %d (marked "
                    '"truncated" in the output)', counts["truncated"], MAX_TEXT_CHARS,
                    MAX_TEXT_CHARS)
    return counts


def same_file(data_uri: str, output: str) -> bool:
    """Whether `output` names the input itself (local paths resolved, gs:// as strings)."""
    if is_remote(data_uri) or is_remote(output):
        return data_uri == output
    return os.path.realpath(data_uri) == os.path.realpath(output)


def predict_to_file(model_dir: str, data_uri: str, output: str, batch_size: int = 64,
                    progress: bool = False, text_column: str = "",
                    model_uri: str = "") -> dict[str, Any]:
    """Predicts every input with a trained model and writes one JSON line per input.

    Args:
        model_dir: A trainer's model folder (local; image or text, told by its files).
        data_uri: A folder of images (any depth) or one image; a CSV for a text model.
        output: The JSON lines file to write (local or gs://), written whole at the end.
        batch_size: Inputs per forward pass.
        progress: Show a progress bar on stderr.
        text_column: The CSV's text column; empty uses the model's training one.
        model_uri: Where `model_dir` was copied from, for messages.

    Returns:
        `{"family", "inputs", "predicted", "errors", "output", ...}`; text models add
        `truncated`, the texts read up to `max_text_chars` only.

    Raises:
        PredictionError: Not a model folder, no input, a CSV without the column, every
            input unreadable, or the output naming the input itself.
    """
    if batch_size < 1:
        raise PredictionError(f"batch_size must be >= 1, got {batch_size}")
    if same_file(data_uri, output):
        raise PredictionError(f"the output {output!r} is the same file as the input "
                              f"{data_uri!r}: writing it would replace the input; choose "
                              "another output file")
    family = model_family(model_dir, f"model folder {model_uri or model_dir!r}")
    with _whole_or_nothing(output) as out:
        if family == IMAGE:
            counts = _predict_images(model_dir, data_uri, out, batch_size, progress)
        else:
            counts = _predict_texts(model_dir, data_uri, out, batch_size, progress, text_column)
        if counts["predicted"] == 0:
            raise PredictionError(f"none of the {counts['inputs']} inputs under {data_uri!r} "
                                  f"could be read as {'images' if family == IMAGE else 'texts'}"
                                  "; nothing written")
    log.info("%d predicted, %d unreadable, written to %s", counts["predicted"],
             counts["errors"], output)
    return {"family": family, **counts, "output": output}


def copy_model_locally(model_uri: str, workdir: str) -> str:
    """A local copy of a gs:// model folder (a local folder is returned as it is)."""
    if not is_remote(model_uri):
        return model_uri
    fs, path = filesystem(model_uri)
    target = os.path.join(workdir, "model")
    shutil.rmtree(target, ignore_errors=True)
    fs.get(path.rstrip("/") + "/", target, recursive=True)
    return target

