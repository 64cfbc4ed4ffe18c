"""A second real English corpus made offline: Debian's package descriptions and debtags.

    python -m tools.datamakers.debian_corpus OUT.csv [--packages FILE] [--by works-with|section]

Each row is the one-line description Debian maintainers wrote for a source package (its
first binary package that carries debtags), with one-hot label columns for the
`works-with::` debtags of any of its binaries among eight kinds of data (`LABELS`): terse
text by hundreds of people, multi-label (a media player works with audio and video). One
row per source package, so a `-dev`/`-doc` twin of a training text cannot land in the test
split. `--by section`: one label each, the archive section of the row's binary package,
the eight largest sections. The input is apt's package index (after `apt-get update`);
nothing is downloaded.
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

from components.common.commands import reports

# works-with:: tag -> label; sub-kinds (image:raster, software:source) fold into their kind.
LABELS = {"text": "plain_text", "audio": "audio", "image": "image", "image:raster": "image",
          "image:vector": "image", "mail": "mail", "db": "database",
          "software:source": "source_code", "video": "video", "archive": "archive"}
LABEL_NAMES = tuple(dict.fromkeys(LABELS.values()))
APT_LISTS = "/var/lib/apt/lists"
LABELINGS = ("works-with", "section")
SECTIONS = 8


def find_package_index(folder: str | None = None) -> str | None:
    """apt's largest main `Packages` index in `folder` (apt's lists by default), or None."""
    found = glob.glob(os.path.join(folder or APT_LISTS, "*_main_binary-*_Packages*"))
    return max(found, key=os.path.getsize) if found else None


def read_index(path: str | None = None) -> str:
    """The text of the apt `Packages` index at `path` (default: `find_package_index`),
    lz4-compressed as apt keeps it, or plain.

    Raises:
        FileNotFoundError: No path given and apt has no index here.
    """
    path = path or find_package_index()
    if not path:
        raise FileNotFoundError(f"no apt package index under {APT_LISTS}: run `apt-get update`"
                                " or pass --packages FILE")
    if path.endswith(".lz4"):
        return subprocess.run(["lz4", "-dc", path], check=True, capture_output=True,
                              text=True).stdout
    with open(path, encoding="utf-8") as f:
        return f.read()


def _records(text: str) -> Iterator[dict[str, str]]:
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            yield fields


def _source(fields: dict[str, str]) -> str:
    return fields.get("Source", fields.get("Package", "")).split()[0]


def _labels(fields: dict[str, str]) -> set[str]:
    tags = {t.strip() for t in fields["Tag"].split(",")}
    return {LABELS[t[len("works-with::"):]] for t in tags
            if t.startswith("works-with::") and t[len("works-with::"):] in LABELS}


def corpus_rows(index_text: str) -> list[dict[str, object]]:
    """One row per source package: its description and the labels of all its binaries."""
    by_source: dict[str, dict[str, object]] = {}
    for fields in _records(index_text):
        if "Tag" not in fields or "Description" not in fields:
            continue
        row = by_source.setdefault(_source(fields), {"text": fields["Description"],
                                                     "labels": set()})
        row["labels"] |= _labels(fields)
    return [{"description": row["text"],
             **{name: int(name in row["labels"]) for name in LABEL_NAMES}}
            for row in by_source.values() if row["labels"]]


def section_rows(index_text: str, sections: int = SECTIONS) -> tuple[list[dict], list[str]]:
    """The rows of `corpus_rows` labelled by archive section instead, one label each: that
    of the source's first binary with a works-with tag; (rows, the `sections` largest
    sections' names, ties alphabetical)."""
    by_source: dict[str, dict[str, str]] = {}
    for fields in _records(index_text):
        if "Tag" in fields and "Description" in fields and _labels(fields):
            by_source.setdefault(_source(fields), {
                "text": fields["Description"], "section": fields.get("Section", "")})
    sizes = Counter(row["section"] for row in by_source.values() if row["section"])
    names = sorted(sorted(sizes), key=lambda name: -sizes[name])[:sections]
    return [{"description": row["text"], **{n: int(n == row["section"]) for n in names}}
            for row in by_source.values() if row["section"] in names], names


def write_debian_corpus(path: str, index_path: str | None = None,
                        by: str = "works-with") -> dict[str, int]:
    """Writes the labelled CSV (`description` + one 0/1 column per label).

    Args:
        path: The CSV to write; its row count and rows per label are returned.
        index_path: An apt `Packages` index; default apt's own.
        by: `works-with` (multi-label) or `section` (one label each).

    Raises:
        FileNotFoundError: No package index is on this machine (run `apt-get update`).
        ValueError: `by` is neither.
    """
    if by not in LABELINGS:
        raise ValueError(f"by must be one of {LABELINGS}, got {by!r}")
    text = read_index(index_path)
    rows, names = section_rows(text) if by == "section" else (corpus_rows(text), LABEL_NAMES)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, ["description", *names])
        writer.writeheader()
        writer.writerows(rows)
    return {"rows": len(rows), **{name: sum(r[name] for r in rows) for name in names}}


def task_sources(index_text: str) -> set[str]:
    """The source packages of the labelled corpus's rows (both labellings cut the same)."""
    return {_source(f) for f in _records(index_text)
            if "Description" in f and "Tag" in f and _labels(f)}


def lm_corpus_texts(index_text: str) -> tuple[list[str], int]:
    """Every binary package's description once, for pretraining a language model, but
    those of the labelled task's source packages (their `-dev`, `-doc` twins too) and any
    equal to a row's text; (texts in index order, descriptions held out)."""
    records = [f for f in _records(index_text) if "Description" in f]
    task = task_sources(index_text)
    rows = {row["description"] for row in corpus_rows(index_text)}
    kept = [f["Description"] for f in records
            if _source(f) not in task and f["Description"] not in rows]
    return list(dict.fromkeys(kept)), len(records) - len(kept)


def write_lm_corpus(path: str, index_path: str | None = None) -> dict[str, int]:
    """Writes `lm_corpus_texts` as a CSV with one `text` column (the LM pipeline's corpus);
    `{"documents", "words", "held_out"}`."""
    texts, held_out = lm_corpus_texts(read_index(index_path))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text"])
        writer.writerows([t] for t in texts)
    return {"documents": len(texts), "words": sum(len(t.split()) for t in texts),
            "held_out": held_out}


@reports(FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.debian_corpus",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("output", help="CSV to write")
    parser.add_argument("--packages", help="an apt Packages index (default: apt's own)")
    parser.add_argument("--by", choices=LABELINGS, default="works-with",
                        help="labels: the works-with debtags (multi-label) or the archive "
                             "section (one label each)")
    args = parser.parse_args(argv)
    counts = write_debian_corpus(args.output, args.packages, args.by)
    print(f"{args.output}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
