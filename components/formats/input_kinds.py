"""What a valid input of each kind is, written once: the checks of preflight, the steps,
`pipelines.predict` and `pipelines.serve` go through these descriptions.

- **Text** (LM corpora, CSV cells, rows to label, request texts): UTF-8 (a BOM is
  allowed), with no more control characters than a stray one in `CONTROL_SHARE` (tabs,
  newlines, carriage returns, form and vertical feeds are text). A NUL byte, bytes that do
  not decode, or control characters beyond that share say the file is of another kind
  (binary, UTF-16, Latin-1): `text_problem` names the first bad offset and what the bytes
  look like (`looks_like`).
- **Model folders** (`MODEL_FOLDERS`): each kind's required files, and the files that
  mark a folder as meant to be that kind, so a folder missing one file is told which file
  of which kind is missing (`model_folder_kind`), never guessed at as another kind.

Every error names the input (a parameter, a URI, a file), what is wrong or missing, what
was found instead, and what to do. Nothing here imports a framework.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable

# ------------------------------------------------------------------------------ text

TEXT_ENCODING = "utf-8-sig"  # UTF-8; a byte-order mark at the start is dropped
# Characters of category Cc that text holds: tab, newline, vertical tab, form feed (man
# pages and books carry page breaks), carriage return. Any other (NUL, escape, backspace,
# the C1 controls) in more than this share of the characters is not text.
_CONTROLS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")  # Cc but \t \n \v \f \r
CONTROL_SHARE = 0.01
# The first bytes of files that are often given where text belongs, by what they are.
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


class NotTextError(ValueError):
    """An input that should be text is not; the message names it, the first bad offset
    and what to do."""


def looks_like(head: bytes) -> str:
    """What a file that should be text is, from its first bytes ("" when unknown)."""
    for signature, what in _SIGNATURES:
        if head.startswith(signature):
            return what
    if len(head) >= 4 and head[1:4:2] == b"\0\0" and head[0] and head[2]:
        return "UTF-16 text without a byte-order mark: re-save it as UTF-8"
    return ""


def control_problem(text: str) -> str:
    """Why a decoded text is not text: control characters beyond `CONTROL_SHARE` (a NUL
    counts too), naming the first one's character offset; "" when it is text."""
    first = _CONTROLS.search(text)
    if first is None:
        return ""
    bad = len(_CONTROLS.findall(text))
    if bad <= CONTROL_SHARE * len(text):
        return ""
    first = first.start()
    return (f"{bad} of its {len(text)} characters are control characters (the first, "
            f"{text[first]!r}, at character {first}); text holds at most "
            f"{CONTROL_SHARE:.1%} of them")


def decode_text(raw: bytes, name: str) -> str:
    """`raw` as text, by `TEXT_ENCODING` and the control-character rule.

    Args:
        raw: The file's bytes (or a whole cell's, a request's).
        name: The input, named in the message (a parameter and URI, a file, a row).

    Returns:
        The decoded text.

    Raises:
        NotTextError: Bytes that do not decode, or too many control characters: naming
            `name`, the first bad byte offset and, where its first bytes tell, what the
            file is instead.
    """
    try:
        text = raw.decode(TEXT_ENCODING)
    except UnicodeDecodeError as err:
        what = looks_like(raw[:8])
        raise NotTextError(
            f"{name} is not UTF-8 text: byte {raw[err.start]:#04x} at offset {err.start} does "
            f"not decode ({err.reason})" + (f"; it looks like {what}" if what
                                            else "; re-save it as UTF-8")) from None
    problem = control_problem(text)
    if problem:
        what = looks_like(raw[:8])
        first = _CONTROLS.search(text).start()
        offset = len(text[:first].encode("utf-8"))
        raise NotTextError(f"{name} is not text: {problem} (byte offset {offset})"
                           + (f"; it looks like {what}" if what else "; give a text file"))
    return text


def text_problem(text: str) -> str:
    """Why one decoded text (a CSV cell, a request's text) is not text; "" when it is.

    The row-level form of `decode_text`'s rule, for inputs whose contract counts a bad
    row as skipped (or answers it with an error line) instead of refusing the file.
    """
    if "\0" in text:
        return f"not text: a NUL character at character {text.index(chr(0))}"
    problem = control_problem(text)
    return f"not text: {problem}" if problem else ""


# --------------------------------------------------------------------- model folders


@dataclasses.dataclass(frozen=True)
class FolderKind:
    """One kind of folder an input may be.

    Attributes:
        name: What it is, as a message says it ("a transformer text model folder").
        marks: Files whose presence says a folder is meant to be this kind.
        required: Groups of files; each group needs one of its files (alternatives).
        made_by: What writes such a folder, for the message's "give ...".
    """

    name: str
    marks: tuple[str, ...]
    required: tuple[tuple[str, ...], ...]
    made_by: str

    def missing(self, files: set[str]) -> list[str]:
        """The required groups none of whose files is in `files`, each spelled "a or b"."""
        return [" or ".join(group) for group in self.required
                if not any(name in files or f"{name}.index.json" in files for name in group)]

    def marked(self, files: set[str]) -> list[str]:
        """The marks of this kind found in `files`."""
        return [name for name in self.marks if name in files]


def _model_folder_kinds() -> dict[str, FolderKind]:
    from components.text_common.contract import (
        EXPORT_FILE,
        LABELS_FILE,
        MODEL_CONFIG_FILE,
        TOKENIZER_FILES,
        WEIGHTS_FILES,
    )
    from components.train_image.contract import MODEL_FILE, PREPROCESSING_FILE

    trained = "the training step's model output"
    return {
        "image": FolderKind(
            "an image model folder", marks=(MODEL_FILE, PREPROCESSING_FILE),
            required=((MODEL_FILE,), (LABELS_FILE,), (PREPROCESSING_FILE,)),
            made_by=f"{trained} (the image trainer)"),
        "fastai": FolderKind(
            "a fastai text model folder", marks=(EXPORT_FILE,),
            required=((EXPORT_FILE,), (LABELS_FILE,)),
            made_by=f"{trained} (the text trainer)"),
        "transformer": FolderKind(
            "a transformer text model folder", marks=(MODEL_CONFIG_FILE, *WEIGHTS_FILES),
            required=((MODEL_CONFIG_FILE,), WEIGHTS_FILES, TOKENIZER_FILES, (LABELS_FILE,)),
            made_by=f"{trained} (the transformer trainer)"),
    }


def base_transformer_folder() -> FolderKind:
    """A transformer to start training from, as `save_pretrained` writes it with its
    tokenizer: the `model_name` folder the transformer trainer and preflight check."""
    from components.text_common.contract import MODEL_CONFIG_FILE, TOKENIZER_FILES, WEIGHTS_FILES

    return FolderKind(
        "a transformer model folder", marks=(MODEL_CONFIG_FILE, *WEIGHTS_FILES),
        required=((MODEL_CONFIG_FILE,), WEIGHTS_FILES, TOKENIZER_FILES),
        made_by="a folder written by model.save_pretrained(folder) and "
                "tokenizer.save_pretrained(folder)")


# Folders of other kinds, told apart from a model folder by a file they hold.
_OTHER_FOLDERS = (
    ("lm_metrics.json", "language model assets (the LM step's lm_assets), which the text "
                        "pipeline starts from; they label nothing"),
    ("manifest.json", "the sharding or preparation step's dataset, not a trained model"),
    ("predictions.jsonl", "a prediction step's output, not a model"),
)


def folder_files(path: str) -> set[str]:
    """Names of the files directly in a local folder (empty when it is not one)."""
    return set(os.listdir(path)) if os.path.isdir(path) else set()


class FolderKindError(ValueError):
    """A folder is not the kind it was given as; the message says which file is missing
    or what the folder is instead."""


def model_folder_kind(name: str, files: Iterable[str]) -> str:
    """Which trained model folder `files` make: "image", "fastai" or "transformer".

    The folder is taken to be the kind whose marks it holds; a kind it is marked as but
    lacks a required file of is named with that file, never guessed at as another kind.

    Args:
        name: The folder, as the message names it (a parameter and URI).
        files: The names of the files directly in it.

    Raises:
        FolderKindError: Naming `name`, the kind it looks like and the file it lacks, or
            what it holds instead of a model.
    """
    files = set(files)
    kinds = _model_folder_kinds()
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
