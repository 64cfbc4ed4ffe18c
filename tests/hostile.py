"""Generators of hostile inputs (issue 56 item 4) for tests/test_hostile_inputs.py: each
draws `Hostile(kind, data)`, so a failing example names its hostility; sizes scale with a
tier's `scale`. `undecodable`: no UTF-8; `not_text`: UTF-8 that is no text; `TEXTS`: text.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os
import pickle
import string
import zipfile

import hypothesis.strategies as st
import numpy as np
from PIL import Image


@dataclasses.dataclass(frozen=True)
class Hostile:
    """One hostile file content: `kind` says what is wrong, `data` is the bytes."""

    kind: str
    data: bytes

    def __repr__(self) -> str:  # short: a falsifying example is printed with it
        head = self.data[:40]
        return f"Hostile({self.kind!r}, {len(self.data)} bytes: {head!r}...)"


# ------------------------------------------------------------------------- valid parts

WORDS = st.text(alphabet=string.ascii_lowercase, min_size=2, max_size=8)
ACCENTED = ("café", "naïve", "über", "façade", "crème brûlée", "señor", "Ærøskøbing")
CP1252_ONLY = ("“quoted”", "it’s", "5 €", "—dash—", "…")  # not in Latin-1 either


def sentence(words: list[str]) -> str:
    return " ".join(words).capitalize() + "."


SENTENCES = st.lists(WORDS, min_size=3, max_size=12).map(sentence)
# Paragraphs of a .txt corpus: blank lines between them.
TEXTS = st.lists(SENTENCES, min_size=2, max_size=6).map(lambda s: "\n\n".join(s) + "\n")


def tiny_image(fmt: str = "PNG", seed: int = 0, size: int = 8) -> bytes:
    """An 8x8 noisy RGB image file (PNG or JPEG) of a few hundred bytes."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, fmt)
    return out.getvalue()


def csv_bytes(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode("utf-8")


# ------------------------------------------------------------------ undecodable bytes


@st.composite
def _random_binary(draw, scale: int) -> bytes:
    data = draw(st.binary(min_size=1, max_size=512 * scale))
    at = draw(st.integers(0, len(data)))
    return data[:at] + b"\xff" + data[at:]  # 0xff is never UTF-8


def undecodable(scale: int = 1) -> st.SearchStrategy[Hostile]:
    """Bytes that strict UTF-8 decoding refuses."""
    return st.one_of(
        st.builds(lambda t, a: Hostile("latin-1 with accents", f"{t} {a}".encode("latin-1")),
                  SENTENCES, st.sampled_from(ACCENTED)),
        st.builds(lambda t, a: Hostile("cp1252", f"{t} {a}".encode("cp1252")),
                  SENTENCES, st.sampled_from(CP1252_ONLY)),
        st.builds(lambda t: Hostile("UTF-16 with BOM", t.encode("utf-16")), TEXTS),
        # "é" is two bytes: the last one is cut
        st.builds(lambda t: Hostile("UTF-8 cut inside a character", (t + " été").encode()[:-1]),
                  TEXTS),
        st.builds(lambda b: Hostile("random binary", b), _random_binary(scale)),
        st.builds(lambda s: Hostile("a PNG", tiny_image("PNG", s)), st.integers(0, 99)),
        st.builds(lambda s: Hostile("a JPEG", tiny_image("JPEG", s)), st.integers(0, 99)),
        st.builds(lambda t: Hostile("a gzip of text", gzip.compress(t.encode(), mtime=0)),
                  TEXTS),
    )


# --------------------------------------------------- decodable bytes that are not text

# C0 controls other than tab, newline, carriage return and form feed.
CONTROLS = "".join(chr(c) for c in range(32) if chr(c) not in "\t\n\r\f") + "\x7f"


def not_text(scale: int = 1) -> st.SearchStrategy[Hostile]:
    """Bytes that decode as UTF-8 and yet are no text: most of their characters are NUL
    or other control characters (what a binary file or UTF-16 read as UTF-8 gives)."""
    return st.one_of(
        st.builds(lambda n: Hostile("NUL bytes", b"\0" * n), st.integers(16, 20_000 * scale)),
        st.builds(lambda t: Hostile("UTF-16-LE without BOM", t.encode("utf-16-le")), TEXTS),
        st.builds(lambda t: Hostile("UTF-16-BE without BOM", t.encode("utf-16-be")), TEXTS),
        st.builds(lambda t: Hostile("control characters", t.encode()),
                  st.text(alphabet=CONTROLS, min_size=16, max_size=2048 * scale)),
        st.builds(lambda t, n: Hostile("text with NUL runs", (t.replace(" ", "\0" * n)).encode()),
                  TEXTS, st.integers(8, 64)),
    )


def is_text(data: bytes, share: float = 0.01) -> bool:
    """The oracle: strict UTF-8 with at most `share` of its characters NUL or control."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    bad = sum(c in CONTROLS for c in text)
    return bad <= share * max(1, len(text))


# -------------------------------------------------------------------- CSV mutations


def cut(data: bytes, at: float) -> bytes:
    """`data` cut at the share `at` of its length (at least one byte kept)."""
    return data[:max(1, int(len(data) * at))]


# ------------------------------------------------ empty, plain text, JSON of no object

EMPTY = Hostile("empty", b"")
PLAIN_TEXT = st.builds(lambda t: Hostile("text", t.encode()), TEXTS)
DEEP_NESTING = Hostile("deep nesting", b"[" * 100_000 + b"]" * 100_000)


def no_json_object(valid: bytes, *more: Hostile) -> st.SearchStrategy[Hostile]:
    """JSON files that hold no whole object: `valid` (an object) cut in half, a list, a
    string, a number, an array of 200,001 numbers; and `more`."""
    return st.sampled_from([Hostile("truncated JSON", cut(valid, 0.5)),
                            Hostile("a JSON list", b"[1, 2]"), Hostile("a JSON string", b'"x"'),
                            Hostile("a JSON number", b"512"),
                            Hostile("huge array", b"[" + b"0," * 200_000 + b"0]"), *more])


def nested_folders(root: str, depth: int) -> str:
    """`root/d/d/.../d` (`depth` folders), made; returns the deepest."""
    path = os.path.join(root, *(["d"] * depth))
    os.makedirs(path, exist_ok=True)
    return path


def write(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({}))
    return buffer.getvalue()


# Language model asset files whose first and last bytes are those of their kinds (a
# pickle, a torch.save zip archive), for checks that read no more than that.
LM_FILE_BYTES = {"config.json": b'{"arch": "AWD_LSTM"}', "vocab.pkl": pickle.dumps(["xxunk"]),
                 "weights.pth": _zip_bytes()}
