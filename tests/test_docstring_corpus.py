"""The real-text corpus the text tests learn on: CPython's own docstrings, made offline."""

import csv
import os

import pytest

from tools.datamakers import docstring_corpus


def test_corpus_is_real_prose_with_one_hot_labels_some_rows_two(tmp_path):
    path = tmp_path / "docs.csv"
    counts = docstring_corpus.write_docstring_corpus(str(path))
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    labels = docstring_corpus.LABELS
    assert len(rows) == counts["rows"] >= 500
    assert len({r["text"] for r in rows}) == len(rows)  # each text once, labels merged
    per_row = [sum(int(r[label]) for label in labels) for r in rows]
    assert min(per_row) == 1 and max(per_row) == 2
    assert per_row.count(2) == counts["two_labels"] > 0
    for label in labels:  # no label is a token minority
        assert counts[label] == sum(int(r[label]) for r in rows) >= 0.08 * len(rows)
    for r in rows:
        assert docstring_corpus.MIN_CHARS <= len(r["text"]) <= docstring_corpus.MAX_CHARS
    # an inherited class shows the same text in two packages
    assert any(r["email"] == r["http"] == "1" for r in rows)
    # written twice, the same file
    again = tmp_path / "again.csv"
    docstring_corpus.write_docstring_corpus(str(again))
    assert again.read_bytes() == path.read_bytes()


def test_the_lm_corpus_takes_more_source_trees_up_to_a_size_task_texts_held_out(tmp_path):
    root = tmp_path / "site-packages"
    (root / "pkg").mkdir(parents=True)
    held = "The first paragraph of a classifier's text, never pretrained on."
    (root / "pkg" / "a.py").write_text(f'"""{held}\n\nA second paragraph that stays."""\n')
    (root / "pkg" / "b.py").write_text('def f():\n    """Another module\'s docstring, long '
                                       'enough to be kept."""\n')
    (root / "tests").mkdir()
    (root / "tests" / "t.py").write_text('"""A test module\'s docstring, which is left out."""\n')
    # a standard library of two modules (the real one takes ~8 s to read)
    lib = tmp_path / "lib"
    (lib / "json").mkdir(parents=True)
    (lib / "json" / "decoder.py").write_text('"""Decodes JSON text into Python objects, one '
                                             'value at a time."""\n')
    (lib / "shlex.py").write_text('"""A lexical analyzer class for simple shell-like '
                                  'syntaxes."""\n')
    whole = docstring_corpus.write_source_corpus(str(tmp_path / "all"), roots=[str(root)],
                                                 hold_out=[held], stdlib=str(lib))
    files = sorted(os.listdir(tmp_path / "all"))
    assert "site-packages.pkg.a.txt" in files and "site-packages.pkg.b.txt" in files
    assert not any("tests" in name for name in files)
    text = (tmp_path / "all" / "site-packages.pkg.a.txt").read_text()
    assert held not in text and "A second paragraph that stays." in text
    # the standard library alone, as before, then the extra tree on top of it
    stdlib = docstring_corpus.write_source_corpus(str(tmp_path / "stdlib"), stdlib=str(lib))
    assert stdlib["files"] == 2
    assert whole["files"] == stdlib["files"] + 2 and whole["held_out"] == stdlib["held_out"] + 1
    # a size limit keeps the whole standard library and stops in the extra tree
    capped = docstring_corpus.write_source_corpus(
        str(tmp_path / "capped"), roots=[str(root)], max_characters=stdlib["characters"] + 1,
        stdlib=str(lib))
    assert capped["files"] == stdlib["files"] + 1


@pytest.mark.slow
def test_the_real_standard_library_gives_a_corpus_of_prose_only(tmp_path):
    """The interpreter's own standard library (~8 s to read): its tests, GUI demos and
    Python 2 fixtures left out, every other module with docstrings one file."""
    counts = docstring_corpus.write_source_corpus(str(tmp_path / "stdlib"))
    names = os.listdir(tmp_path / "stdlib")
    assert counts["files"] == len(names) > 400 and counts["characters"] > 1_000_000
    assert "json.decoder.txt" in names and "email.message.txt" in names
    skipped = ("test.", "tkinter.", "idlelib.", "lib2to3.", "turtledemo.", "site-packages.")
    assert not [name for name in names if name.startswith(skipped)]
