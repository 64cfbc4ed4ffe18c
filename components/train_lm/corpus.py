"""Reads a language model's corpus: a CSV column, a .txt file or a folder of .txt files
(cut into documents at blank lines); what is not text is skipped and counted."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Any

from components.common.input_kinds import NotTextError, decode_text, text_problem
from components.common.storage import filesystem
from components.prepare_text.contract import read_text_csv
from components.train_lm.contract import (
    TEXT_SUFFIX,
    LMTrainingError,
    check_mostly_text,
    corpus_files,
)

_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n")
_EXAMPLES = 5  # names kept per skip reason
NOT_TEXT = "not text"


@dataclasses.dataclass
class Corpus:
    """A corpus's documents (files by name, then paragraphs; CSV rows) and its report
    (`uri`, `kind`, `files`, `documents`, `characters`, `sha256`, `skipped`)."""

    documents: list[str]
    report: dict[str, Any]


def paragraphs(text: str) -> list[str]:
    """The non-empty paragraphs of a text, each on one line."""
    return [" ".join(p.split()) for p in _PARAGRAPH.split(text) if p.strip()]


def _skip(skips: dict[str, dict[str, Any]], reason: str, name: str) -> None:
    """Counts `name` as skipped for `reason` in the report's `skipped` (a few kept by name)."""
    entry = skips.setdefault(reason, {"count": 0, "examples": []})
    entry["count"] += 1
    if len(entry["examples"]) < _EXAMPLES:
        entry["examples"].append(name)


def _read_csv(fs, path: str, uri: str, column: str, skips: dict) -> list[str]:
    with fs.open(path, "rb") as f:
        frame = read_text_csv(f.read(), f"corpus {uri!r}", {column: "text_column"},
                              LMTrainingError)
    documents, not_text = [], 0
    for row, text in enumerate(frame[column], start=2):  # line 1 is the header
        problem = text_problem(str(text))
        text = " ".join(str(text).split())
        if problem:
            not_text += 1
            _skip(skips, NOT_TEXT, f"{uri} line {row}: {problem}")
        elif text:
            documents.append(text)
        else:
            _skip(skips, "empty text", f"{uri} line {row}")
    if not_text > len(documents):
        raise LMTrainingError(f"corpus {uri!r}: {not_text} of its rows in column {column!r} are "
                              f"not text ({skips[NOT_TEXT]['examples'][0]}); give a CSV "
                              "of texts")
    return documents


def _read_texts(fs, files: list[str], root: str, uri: str, skips: dict) -> list[str]:
    documents, not_text = [], []
    for path in files:
        name = os.path.relpath(path, root) if path != root else os.path.basename(path)
        with fs.open(path, "rb") as f:
            raw = f.read()
        try:
            text = decode_text(raw, f"corpus file {name!r}")
        except NotTextError as err:
            not_text.append(str(err))
            _skip(skips, NOT_TEXT, str(err))
            continue
        found = paragraphs(text)
        if not found:
            _skip(skips, "empty file", name)
        documents += found
    check_mostly_text(uri, not_text, len(files), len(files))
    return documents


def read_corpus(uri: str, text_column: str = "text") -> Corpus:
    """Reads every document of a corpus.

    Args:
        uri: Local path or gs:// URI of a CSV file, a .txt file, or a folder whose .txt
            files (at any depth) make the corpus.
        text_column: The CSV column holding the texts.

    Returns:
        The documents and the report of what was read and skipped.

    Raises:
        LMTrainingError: Nothing at `uri`, a folder without .txt files, a CSV without the
            column, or fewer than two documents in all.
    """
    kind, files, others = corpus_files(uri)
    fs, path = filesystem(uri)
    skips: dict[str, dict[str, Any]] = {}
    for other in others:
        _skip(skips, f"not a {TEXT_SUFFIX} file", os.path.relpath(other, path))
    documents = _read_csv(fs, path, uri, text_column, skips) if kind == "csv" else \
        _read_texts(fs, files, path, uri, skips)
    if len(documents) < 2:
        raise LMTrainingError(
            f"corpus {uri!r} gave {len(documents)} document(s) (skipped: "
            f"{ {r: s['count'] for r, s in skips.items()} }); a language model needs "
            "texts to learn from and others to measure perplexity on: at least two "
            "paragraphs or rows")
    digest = hashlib.sha256()
    for document in documents:
        digest.update(document.encode("utf-8") + b"\0")
    return Corpus(documents=documents, report={
        "uri": uri, "kind": kind, "files": len(files), "documents": len(documents),
        "characters": sum(map(len, documents)), "sha256": digest.hexdigest(),
        "skipped": skips,
    })
