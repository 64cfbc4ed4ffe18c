"""Input kinds: what text is (`decode_text`: UTF-8, a BOM allowed, at most `CONTROL_SHARE`
control characters), a CSV's header (`csv_header`), and what a folder of a kind holds
(`FolderKind`, declared by the contract of the step that reads it)."""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from components.common.storage import filesystem

TEXT_ENCODING = "utf-8-sig"  # UTF-8; a byte-order mark at the start is dropped
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")  # Cc but \t \n \v \f \r
CONTROL_SHARE = 0.01
_SIGNATURES = (
    (b"\xff\xfe", "UTF-16 (little-endian) text: re-save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 (big-endian) text: re-save it as UTF-8"),
    (b"\x1f\x8b", "a gzip archive: decompress it first"),
    (b"PK\x03\x04", "a ZIP archive (or an .xlsx/.docx): extract or export it as text first"),
    (b"%PDF", "a PDF document: extract its text first"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"BZh", "a bzip2 archive: decompress it first"),
    (b"\xfd7zXZ", "an xz archive: decompress it first"),
    (b"\x80", "a Python pickle"),
)


class InputKindError(ValueError):
    """An input is not of its kind; the message says what is wrong and what to do."""


class NotTextError(InputKindError):
    """An input that should be text is not."""


def control_problem(text: str) -> str:
    """Why a decoded text has too many control characters ("" when it is text)."""
    bad = len(_CONTROLS.findall(text))
    if bad <= CONTROL_SHARE * len(text):  # none at all too
        return ""
    first = _CONTROLS.search(text).start()
    return (f"{bad} of its {len(text)} characters are control characters (the first, "
            f"{text[first]!r}, at character {first}); text holds at most "
            f"{CONTROL_SHARE:.1%} of them")


def decode_text(raw: bytes, name: str, controls: bool = True) -> str:
    """A file's bytes as text, by `TEXT_ENCODING` and (with `controls`; else the caller's,
    cell by cell) the control-character rule; the message names the input `name`.

    Raises:
        NotTextError: Bytes that do not decode, or too many control characters.
    """
    what = next((what for signature, what in _SIGNATURES if raw.startswith(signature)), "")
    if not what and len(raw) >= 4 and raw[1:4:2] == b"\0\0" and raw[0] and raw[2]:
        what = "UTF-16 text without a byte-order mark: re-save it as UTF-8"
    looks = f"; it looks like {what}" if what else ""
    try:
        text = raw.decode(TEXT_ENCODING)
    except UnicodeDecodeError as err:
        raise NotTextError(
            f"{name} is not UTF-8 text: byte {raw[err.start]:#04x} at offset {err.start} does "
            f"not decode ({err.reason})" + (looks or "; re-save it as UTF-8")) from None
    problem = control_problem(text) if controls else ""
    if problem:
        offset = len(text[:_CONTROLS.search(text).start()].encode("utf-8"))
        raise NotTextError(f"{name} is not text: {problem} (byte offset {offset})"
                           + (looks or "; give a text file"))
    return text


def text_problem(text: str) -> str:
    """Why one decoded text (a CSV cell, a request's text) is not text; "" when it is."""
    if "\0" in text:
        return f"not text: a NUL character at character {text.index(chr(0))}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate, e.g. JSON's "\ud800"
        return f"not text: a lone surrogate at character {err.start} (no Unicode character)"
    problem = control_problem(text)
    return f"not text: {problem}" if problem else ""


def csv_header(lines: Iterable[str], name: str, columns: Mapping[str, str]) -> list[str]:
    """A CSV's header, its first row with a non-blank cell, checked for every reader.

    Args:
        lines: The CSV's lines, read up to the header row only.
        name: The file, as the messages name it.
        columns: The columns the reader needs, each to the parameter that names it.

    Returns:
        The header's cells.

    Raises:
        InputKindError: No row, a column name twice, or a needed column missing.
    """
    header = next((row for row in csv.reader(lines) if "".join(row).strip()), [])
    if not header:
        naming = f" naming {', '.join(map(repr, columns))}" if columns else ""
        raise InputKindError(f"{name} is empty: give a CSV with a header row{naming} and a row "
                             "per text")
    counts = collections.Counter(cell.strip() for cell in header)  # linear: wide CSVs exist
    repeated = sorted(cell for cell, count in counts.items() if count > 1)
    if repeated:
        raise InputKindError(f"{name}: column name(s) {repeated} appear more than once in the "
                             "header; rename them so each column has its own name")
    missing = [column for column in columns if column not in header]
    if missing:
        hint = next((f" It looks separated by {said}, not commas: save it as a comma-separated "
                     "CSV." for separator, said in (("\t", "tabs"), (";", "';'"), ("|", "'|'"))
                     if len(header) == 1 and separator in header[0]), "")
        parameters = " and ".join(dict.fromkeys(columns[column] for column in missing))
        raise InputKindError(f"{name} has no column {', '.join(map(repr, missing))} (its header: "
                             f"{header[:20]}); give a CSV that has it, or set {parameters} to "
                             "one of its columns." + hint)
    return header


@dataclasses.dataclass(frozen=True)
class FolderKind:
    """One kind of folder an input may be."""

    name: str  # as a message says it ("a transformer text model folder")
    marks: tuple[str, ...]  # files whose presence says a folder is meant to be this kind
    required: tuple[tuple[str, ...], ...]  # groups of files; each needs one of its files
    made_by: str  # what writes such a folder, for the message's "give ..."

    def missing(self, files: set[str]) -> list[str]:
        """The required groups none of whose files is in `files`, each spelled "a or b"."""
        return [" or ".join(group) for group in self.required
                if not any(name in files or f"{name}.index.json" in files for name in group)]

    def marked(self, files: set[str]) -> list[str]:
        """The marks of this kind found in `files`."""
        return [name for name in self.marks if name in files]


class FolderKindError(InputKindError):
    """A folder is not the kind it was given as; the message says which file is missing
    or what the folder is instead."""


def folder_files(uri: str) -> set[str]:
    """Names of the files (links to files too) directly in a folder, local, gs:// or s3://;
    empty when it is not one."""
    fs, path = filesystem(uri)
    fs.invalidate_cache(path)  # gcsfs keeps listings: the folder may have changed since
    if not fs.isdir(path):
        return set()
    return {os.path.basename(entry["name"].rstrip("/")) for entry in fs.ls(path, detail=True)
            if entry["type"] == "file" or (entry.get("islink") and fs.isfile(entry["name"]))}


def read_json_object(raw: bytes, name: str, remedy: str = "write it again") -> dict[str, Any]:
    """A JSON file that must hold an object (labels.json, config.json, ...), read as text.

    Raises:
        InputKindError: Not text, not JSON, nested too deeply, or not an object; the
            message names the file `name` and ends with `remedy`.
    """
    text = decode_text(raw, name)
    try:
        value = json.loads(text)
    except ValueError as err:
        raise InputKindError(f"{name} is not JSON ({err}); {remedy}") from None
    except RecursionError:
        raise InputKindError(f"{name} is JSON nested too deeply to read; {remedy}") from None
    if not isinstance(value, dict):
        raise InputKindError(f"{name} must hold a JSON object, found a "
                             f"{type(value).__name__}; {remedy}")
    return value
