"""The checks of what a run reads by URI, and the data fingerprint (from the listing)."""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import os

from components.common.input_kinds import (
    InputKindError,
    NotTextError,
    csv_header,
    decode_text,
    text_problem,
)
from components.common.storage import filesystem
from components.predict.contract import PredictionError, list_inputs
from components.preflight.parameters import PreflightError
from components.shard.contract import find_following_links

# Corpus files whose first bytes preflight reads (the LM step reads them all).
_SAMPLED_FILES = 16


def check_corpus(uri: str, text_column: str) -> None:
    """Refuses a corpus the language model step would refuse, by the step's rules
    (`train_lm.contract`) on its listing and the first bytes of its first files.

    Raises:
        PreflightError: The problem, naming the URI (and file) and what to give instead.
    """
    from components.train_lm.contract import LMTrainingError, check_mostly_text, corpus_files

    fs, path = filesystem(uri)
    try:
        kind, files, _ = corpus_files(uri)
        if kind == "txt":
            sampled = files[:_SAMPLED_FILES]
            names = (os.path.relpath(f, path) if f != path else os.path.basename(f)
                     for f in sampled)
            problems = (_text_problem(_head(fs, f)[0], f"corpus file {name!r}")
                        for f, name in zip(sampled, names))
            check_mostly_text(uri, list(filter(None, problems)), len(sampled), len(files))
        else:  # read_text_csv's reading, up to the header
            name = f"corpus {uri!r}"
            head = decode_text(_head(fs, path)[0], name, controls=False)
            csv_header(io.StringIO(head), name, {text_column: "text_column"})
    except (LMTrainingError, InputKindError) as err:
        raise PreflightError(str(err)) from None


def _text_problem(head: bytes, name: str, controls: bool = True) -> str:
    """Why a file's head is not text (`input_kinds.decode_text`); ""."""
    try:
        decode_text(head, name, controls)
    except NotTextError as err:
        return str(err)
    return ""


def data_fingerprint(uri: str, parameter: str = "data_uri") -> str:
    """A digest of the listing at `uri`: each file's relative name, size and version.

    Raises:
        PreflightError: Nothing is there.
    """
    fs, path = filesystem(uri)
    if not fs.exists(path):
        raise PreflightError(f"{parameter} {uri!r} does not exist")
    ignored: list[dict[str, str]] = []  # links not entered: the manifest records them
    if fs.isdir(path):  # listed as sharding lists, linked folders entered
        entries = find_following_links(fs, path, {os.path.realpath(path)}, ignored, path)
    else:
        entries = {path: fs.info(path)}
    if not entries:
        raise PreflightError(f"{parameter} {uri!r} is an empty folder")
    listing = []
    for name, info in sorted(entries.items()):
        version = info.get("generation") or info.get("mtime") or info.get("updated") \
            or info.get("md5Hash") or info.get("crc32c")
        listing.append([os.path.relpath(name, path) if name != path else os.path.basename(name),
                        info.get("size"), str(version)])
    listing += [[link["path"], None, link["reason"]] for link in ignored]
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    return f"sha256:{digest}:{len(listing)}"


def check_predict_uri(uri: str, kind: str, text_column: str = "text") -> None:
    """Refuses a `predict_uri` (empty: no prediction) the prediction step could not label:
    a folder with no image (images), or no CSV with `text_column` and a row of text.

    Raises:
        PreflightError: Naming the URI and what it should be.
    """
    if not uri:
        return
    if kind == "image":
        try:  # the prediction step's own listing
            list_inputs(uri)
        except PredictionError as err:
            raise PreflightError(f"predict_uri: {err}, or leave predict_uri empty") from None
        return
    fs, path = filesystem(uri)
    if not fs.isfile(path):
        raise PreflightError(f"predict_uri {uri!r} is not a file: give the CSV of texts "
                             "to label (with the training text column), or leave it empty")
    _check_predict_csv(uri, *_head(fs, path), text_column)


# Enough of a CSV to read its header and first rows.
_HEAD_BYTES = 1 << 16


def _head(fs, path: str) -> tuple[bytes, bool]:
    """A file's first `_HEAD_BYTES` (less a UTF-8 character they cut short), and whether
    they may end before the file does."""
    with fs.open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    if len(head) < _HEAD_BYTES:
        return head, False
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(head[-4:])  # what it keeps back is a character cut short
    return head[:len(head) - len(decoder.getstate()[0])], True


def _check_predict_csv(uri: str, head: bytes, cut: bool, text_column: str) -> None:
    """Refuses a CSV of texts to label from its head (`_head`: a row cut at its end aside)."""
    problem = _text_problem(head, f"predict_uri {uri!r}", controls=False)
    if problem:
        raise PreflightError(problem)
    text = head.decode("utf-8-sig")
    try:
        # strict: a quote never closed is an error (the file is read whole when not cut)
        rows = [r for r in csv.reader(io.StringIO(text), strict=not cut)
                if any(c.strip() for c in r)]
    except csv.Error as err:
        raise PreflightError(f"predict_uri {uri!r} is not a readable CSV ({err}); check its "
                             "quotes, or save it again as CSV") from None
    if cut and len(rows) > 1:
        rows = rows[:-1]  # the last one may be cut short
    if not rows:
        raise PreflightError(f"predict_uri {uri!r} is empty: give a CSV with a header row "
                             f"naming the text column ({text_column!r}) and a row per text, "
                             "or leave predict_uri empty")
    try:
        header = csv_header(io.StringIO(text), f"predict_uri {uri!r}", {text_column: "text_column"})
    except InputKindError as err:
        raise PreflightError(str(err)) from None
    wide = next((number for number, r in enumerate(rows[1:], 1) if len(r) > len(header)), 0)
    if wide:  # pandas, which prediction reads with, refuses a row wider than the header
        raise PreflightError(f"predict_uri {uri!r} has data row {wide} of "
                             f"{len(rows[wide])} cells, its header {len(header)}; quote the "
                             "cells that hold a comma, or save it again as CSV")
    index = header.index(text_column)
    texts = [r[index] for r in rows[1:] if len(r) > index and r[index].strip()]
    not_text = [problem for problem in map(text_problem, texts) if problem]
    if len(not_text) * 2 > len(texts):  # prediction would answer most rows with an error
        raise PreflightError(f"predict_uri {uri!r} holds {len(not_text)} texts that are not "
                             f"text in its first {len(texts)} rows (the first: {not_text[0]}); "
                             "save the CSV as UTF-8 text")
    if not texts:
        raise PreflightError(f"predict_uri {uri!r} has no text in column {text_column!r} in "
                             f"its first rows ({len(rows) - 1} rows read): nothing to label")
