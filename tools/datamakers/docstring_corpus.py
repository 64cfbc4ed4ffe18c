"""Real English text made offline: the Python standard library's own docstrings.

    python -m tools.datamakers.docstring_corpus OUT.csv
    python -m tools.datamakers.docstring_corpus --lm-corpus OUT_FOLDER

Each row is the first paragraph (40 to 400 characters) of the docstring of a public class,
function or method of one of seven standard-library packages (`LABELS`), one-hot labelled
by the packages whose public API shows it (an inherited class can carry two: about 770
rows, 25 with two labels). Prose written by people, on every machine that has CPython.

`--lm-corpus` writes the unlabelled counterpart for pretraining a language model: the rest
of the standard library's docstrings (read with `ast`, nothing imported), one .txt file per
module; the seven labelled packages are left out.
"""

from __future__ import annotations

import argparse
import ast
import csv
import hashlib
import importlib
import inspect
import os
import pkgutil
import re
import sys
import sysconfig
import warnings
from collections.abc import Sequence

LABELS = ("asyncio", "email", "http", "logging", "multiprocessing", "unittest", "xml")
MIN_CHARS, MAX_CHARS = 40, 400
# Left out of the language model corpus besides LABELS: tests, GUI demos, vendored copies.
_NOT_PROSE = ("test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip",
              "pydoc_data", "site-packages", "dist-packages")


def first_paragraph(doc: str) -> str:
    """The first paragraph of a docstring, on one line."""
    return " ".join(re.split(r"\n\s*\n", inspect.cleandoc(doc).strip(), maxsplit=1)[0].split())


def _modules(package: str) -> list:
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(getattr(root, "__path__", []), package + "."):
        if any(part.startswith("_") or part in ("test", "tests")
               for part in info.name.split(".")[1:]):
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # a platform-specific module (e.g. asyncio.windows_events)
            continue
    return modules


def collect(packages: Sequence[str] = LABELS) -> dict[str, set[str]]:
    """{text: the packages whose public API shows it}, for objects defined in `packages`."""
    texts: dict[str, set[str]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules announce themselves on import
        for package in packages:
            for module in _modules(package):
                for name in dir(module):
                    if name.startswith("_"):
                        continue
                    obj = getattr(module, name, None)
                    members = [obj]
                    if inspect.isclass(obj):
                        members += [getattr(obj, a, None) for a in dir(obj)
                                    if not a.startswith("_")]
                    for member in members:
                        if not (inspect.isfunction(member) or inspect.isclass(member)):
                            continue
                        home = (getattr(member, "__module__", "") or "").split(".")[0]
                        doc = member.__doc__
                        if home not in packages or not isinstance(doc, str):
                            continue
                        text = first_paragraph(doc)
                        if MIN_CHARS <= len(text) <= MAX_CHARS:
                            texts.setdefault(text, set()).add(package)
    return texts


def write_docstring_corpus(path: str, packages: Sequence[str] = LABELS) -> dict[str, int]:
    """Writes the corpus CSV (`text` plus one 0/1 column per package of `packages`), rows
    in a fixed order (the text's hash); `{"rows", "two_labels", <label>: rows with it}`."""
    texts = collect(packages)
    rows = sorted(texts.items(), key=lambda item: hashlib.sha256(item[0].encode()).hexdigest())
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", *packages])
        for text, labels in rows:
            writer.writerow([text, *(int(p in labels) for p in packages)])
    counts = {"rows": len(rows), "two_labels": sum(len(labels) > 1 for _, labels in rows)}
    counts.update({p: sum(p in labels for _, labels in rows) for p in packages})
    return counts


def _module_docstrings(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []  # e.g. a lib2to3 fixture in Python 2 syntax
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = (ast.get_docstring(node) for node in ast.walk(tree) if isinstance(node, kinds))
    return [doc for doc in docs if doc and len(doc) >= MIN_CHARS]


def _source_files(root: str, skipped: set[str], prefix: str) -> list[tuple[str, str]]:
    """(path, output name) of each .py file under `root` outside the skipped folders."""
    found = []
    for directory, subfolders, files in os.walk(root):
        parts = os.path.relpath(directory, root).split(os.sep)
        if skipped & set(parts) or any(p.startswith(("config-", "__")) for p in parts):
            subfolders[:] = []
            continue
        subfolders.sort()
        for name in sorted(files):
            if not name.endswith(".py") or (parts == ["."] and name[:-3] in skipped):
                continue
            relative = os.path.join(*[p for p in parts if p != "."], name[:-3])
            found.append((os.path.join(directory, name),
                          prefix + relative.replace(os.sep, ".") + ".txt"))
    return found


def write_source_corpus(folder: str, exclude: Sequence[str] = (),
                        hold_out: Sequence[str] = (), roots: Sequence[str] = (),
                        max_characters: int = 0, stdlib: str = "") -> dict[str, int]:
    """Writes Python docstrings as .txt files, for language model pretraining.

    Args:
        folder: Output folder: `<module path>.txt` per source file with docstrings
            (`<root folder name>.<module path>.txt` for files of `roots`).
        exclude: Top-level packages left out.
        hold_out: Paragraphs never written (compared with white space collapsed).
        roots: More source trees read after the standard library.
        max_characters: Stop once this many are written (0: no limit); the files of `roots`
            in the order of their output names' SHA-256 (a fixed sample).
        stdlib: The standard library's folder; "" for this interpreter's.

    Returns:
        `{"files", "docstrings", "characters", "held_out": paragraphs dropped}`.
    """
    skipped = set(exclude) | set(_NOT_PROSE)
    more = [found for root in roots for found in
            _source_files(root, skipped, os.path.basename(os.path.normpath(root)) + ".")]
    if max_characters:
        more.sort(key=lambda item: hashlib.sha256(item[1].encode()).hexdigest())
    files = _source_files(stdlib or sysconfig.get_paths()["stdlib"], skipped, "") + more
    held = set(hold_out)
    counts = {"files": 0, "docstrings": 0, "characters": 0, "held_out": 0}
    for path, target in files:
        if max_characters and counts["characters"] >= max_characters:
            break
        docs = []
        for doc in _module_docstrings(path):
            kept = [p for p in re.split(r"\n\s*\n", doc) if " ".join(p.split()) not in held]
            counts["held_out"] += len(re.split(r"\n\s*\n", doc)) - len(kept)
            if kept:
                docs.append("\n\n".join(kept))
        if not docs:
            continue
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, target), "w", encoding="utf-8") as out:
            out.write("\n\n".join(docs) + "\n")
        counts["files"] += 1
        counts["docstrings"] += len(docs)
        counts["characters"] += sum(map(len, docs))
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.docstring_corpus",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="CSV file to write (a folder with --lm-corpus)")
    parser.add_argument("--lm-corpus", action="store_true",
                        help="write the unlabelled language model corpus instead")
    args = parser.parse_args(argv)
    if args.lm_corpus:
        print(write_source_corpus(args.path))
    else:
        print(write_docstring_corpus(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
