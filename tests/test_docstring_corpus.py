"""The real-text corpus the text tests learn on: CPython's own docstrings, made offline."""

import csv

from pipelines import docstring_corpus


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
