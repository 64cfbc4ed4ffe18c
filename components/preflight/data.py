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
    """Refuses a corpus the language model step would refuse, from its listing and the
    first bytes of its files.

    Raises:
        PreflightError: The problem, naming the URI (and file) and what to give instead.
    """
    from components.train_lm.contract import CSV_SUFFIX, TEXT_SUFFIX

    fs, path = filesystem(uri)
    if not fs.exists(path):
        return  # data_fingerprint says so
    if fs.isdir(path):
        files = sorted(name for name in fs.find(path) if name.endswith(TEXT_SUFFIX))
        if not files:
            raise PreflightError(f"corpus_uri {uri!r} holds no {TEXT_SUFFIX} files; give a "
                                 f"folder of UTF-8 {TEXT_SUFFIX} files or a CSV file")
        sampled = files[:_SAMPLED_FILES]
        problems = list(filter(None, (_text_problem(_head(fs, f)[0],
                                                    f"file {os.path.relpath(f, path)!r}")
                                      for f in sampled)))
        if len(problems) * 2 > len(sampled):  # the LM step's rule: mostly not text
            raise PreflightError(f"corpus_uri {uri!r}: {len(problems)} of the first "
                                 f"{len(sampled)} {TEXT_SUFFIX} files are not text, e.g. "
                                 f"{problems[0]}")
    elif path.endswith(CSV_SUFFIX) or path.endswith(TEXT_SUFFIX):
        head = _head(fs, path)[0]
        problem = _text_problem(head, f"file {os.path.basename(path)!r}",
                                controls=path.endswith(TEXT_SUFFIX))
        if problem:
            raise PreflightError(f"corpus_uri {uri!r}: {problem}")
        if path.endswith(CSV_SUFFIX):
            try:
                csv_header(io.StringIO(head.decode("utf-8-sig", errors="replace")),
                           f"corpus_uri {uri!r}", {text_column: "text_column"})
            except InputKindError as err:
                raise PreflightError(str(err)) from None
    else:
        raise PreflightError(f"corpus_uri {uri!r} is neither a folder, a {TEXT_SUFFIX} nor a "
                             f"{CSV_SUFFIX} file")


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
