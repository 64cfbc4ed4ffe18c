"""Load a labelled text CSV (gs:// or local), validate it and split it train/validation/test.

Labels come one-hot (0/1 or True/False columns) or as class names (one column, joined by
`label_delimiter`). Errors name the column and rows ("row N" counts data rows from 1).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from components.common.input_kinds import text_problem
from components.common.storage import filesystem, write_json_atomically
from components.prepare_text.contract import (
    AUTO_DELIMITER,
    MANIFEST,
    MULTI_LABEL,
    SINGLE_LABEL,
    SPLITS,
    PrepareConfig,
    TextDataError,
    read_text_csv,
    split_path,
)

# Share of 0/1 cells from which a single label column is read as one binary label.
_BINARY_SHARE = 0.9
_TRUE = frozenset({"1", "true", "1.0"})
_FALSE = frozenset({"0", "false", "0.0"})
_MAX_LISTED_ROWS = 100  # rows named in the manifest per kind of drop; the count is always exact
_MAX_ROWS_IN_ERROR = 5
# How tools write a missing value: pandas read_csv's default na_values, without the empty
# cell (which means "no label" here). Matched case-sensitively after stripping, as pandas does.
_MISSING = frozenset({"#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND",
                      "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
# Delimiters people join class names with; one in the cells but not the configured one
# means the setting does not match the file.
_COMMON_DELIMITERS = (",", ";", "|")


def read_bytes(uri: str) -> bytes:
    """The bytes of a local or gs:// file (TextDataError when absent or a folder)."""
    fs, path = filesystem(uri)
    if not fs.exists(path):
        raise TextDataError(f"{uri} does not exist")
    if fs.isdir(path):
        raise TextDataError(f"{uri} is a folder; give the CSV file inside it")
    with fs.open(path, "rb") as f:
        return f.read()


def read_csv(uri: str, data: bytes | None = None,
             config: PrepareConfig | None = None) -> pd.DataFrame:
    """Reads a CSV, every cell as a string ("" when empty; `read_text_csv`).

    Args:
        uri: Local path or gs:// URI of the CSV (named in errors).
        data: Its bytes, if already read.
        config: When given, its text and label columns must be in the header.

    Raises:
        TextDataError: Missing, empty, not text, not a CSV, or a refused header.
    """
    data = read_bytes(uri) if data is None else data
    columns = {} if config is None else {config.text_column: "text_column",
                                         **dict.fromkeys(config.label_columns, "label_columns")}
    return read_text_csv(data, f"data_uri {uri!r}", columns, TextDataError)


def _describe(values: pd.Series, positions: np.ndarray) -> str:
    shown = ", ".join(f"{values.iloc[p]!r} at row {p + 1}" for p in positions[:_MAX_ROWS_IN_ERROR])
    extra = len(positions) - _MAX_ROWS_IN_ERROR
    return shown + (f" and {extra} more" if extra > 0 else "")


def _bool_like(values: pd.Series) -> np.ndarray:
    """True where a cell reads as 0/1 or True/False."""
    lowered = values.str.strip().str.lower()
    return (lowered.isin(_TRUE) | lowered.isin(_FALSE)).to_numpy()


def _one_hot(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """0/1 label columns from 0/1 or True/False cells; anything else is an error."""
    out = {}
    for column in columns:
        values = frame[column].astype(str)
        bad = np.flatnonzero(~_bool_like(values))
        if bad.size:
            raise TextDataError(
                f"label column {column!r} holds values other than 0/1 or True/False: "
                f"{_describe(values, bad)} ({bad.size} rows)")
        out[column] = values.str.strip().str.lower().isin(_TRUE).to_numpy().astype(np.int64)
    return pd.DataFrame(out, index=frame.index)


def label_delimiter_of(values: pd.Series, column: str, delimiter: str) -> str:
    """The delimiter that joins class names in a class-name column, as `delimiter` says:
    "auto" is "," and refuses a cell holding ";" or "|" (a file mixing them would make
    "delivery;price" a class); "" keeps each cell one class name.

    Raises:
        TextDataError: "auto" with cells holding ";" or "|" (the rows named, with the
            settings that read them), or a declared delimiter in no cell while another
            common one is.
    """
    holding = {d: np.flatnonzero(values.str.contains(d, regex=False).to_numpy())
               for d in _COMMON_DELIMITERS}
    if delimiter == AUTO_DELIMITER:
        others = {d: rows for d, rows in holding.items() if d != "," and rows.size}
        if others:
            held = "; ".join(f"{rows.size} value(s) hold {d!r}: {_describe(values, rows)}"
                             for d, rows in others.items())
            first = next(iter(others))
            raise TextDataError(
                f"label column {column!r}: {held} ({holding[','].size} hold ','): "
                f"set label_delimiter={first!r} if it separates the labels of a row, "
                f"label_delimiter=',' if ',' does and {first!r} is part of class names, or "
                "label_delimiter='' to keep each cell one class name")
        return ","
    other = next((d for d, rows in holding.items() if d != delimiter and rows.size), None)
    if delimiter and other and not values.str.contains(delimiter, regex=False).any():
        raise TextDataError(
            f"label column {column!r}: {holding[other].size} value(s) hold {other!r} and none "
            f"the label delimiter {delimiter!r}: {_describe(values, holding[other])}; set "
            f"label_delimiter={other!r} if these are several labels per row, or "
            f"label_delimiter='' if {other!r} is part of the class names")
    return delimiter


def _from_class_names(values: pd.Series, delimiter: str) -> pd.DataFrame:
    """0/1 label columns (sorted class names) from a column of delimited class names."""
    names_per_row = [
        sorted({part.strip() for part in (cell.split(delimiter) if delimiter else [cell])
                if part.strip()})
        for cell in values.astype(str)
    ]
    classes = sorted({name for names in names_per_row for name in names})
    matrix = np.zeros((len(values), len(classes)), dtype=np.int64)
    index = {name: i for i, name in enumerate(classes)}
    for row, names in enumerate(names_per_row):
        for name in names:
            matrix[row, index[name]] = 1
    return pd.DataFrame(matrix, columns=classes, index=values.index)


def normalize(frame: pd.DataFrame, config: PrepareConfig) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Validates a CSV's frame and turns its labels into 0/1 columns.

    Args:
        frame: The CSV as `read_csv` gives it.
        config: Column names and label handling.

    Returns:
        `(data, info)`: the kept rows (text, then one 0/1 column per label; indexed by CSV
        position) and the manifest's facts (`task`, `labels`, `dropped`, ...).

    Raises:
        TextDataError: A label cell is not 0/1 or True/False, class names are joined by
            another delimiter than `label_delimiter`, or no usable row remains.
    """
    text = config.text_column
    label_columns = _label_columns([str(c) for c in frame.columns], config)
    frame = frame.reset_index(drop=True)
    labels, missing, label_source, delimiter = _labels(frame, label_columns,
                                                       config.label_delimiter)
    texts = frame[text].astype(str)
    dropped, given_other = _drops(labels, texts, missing, config.other_label.strip())

    keep = np.ones(len(frame), dtype=bool)
    for positions in dropped.values():
        keep[positions] = False
    if not keep.any():
        raise TextDataError(
            f"no usable row: {len(frame)} rows in, "
            + ", ".join(f"{len(p)} dropped for {kind.replace('_', ' ')}"
                        for kind, p in dropped.items()))
    data = pd.concat([texts.rename(text), labels], axis=1)[keep]
    # Labels nobody carries after the drops teach nothing and break the loss' shape.
    present = [c for c in labels.columns if data[c].sum() > 0]
    data = data[[text, *present]]
    multi = bool((data[present].sum(axis=1) > 1).any())
    info = {
        "task": MULTI_LABEL if multi else SINGLE_LABEL,
        "labels": present,
        "unused_labels": [c for c in labels.columns if c not in present],
        "label_source": label_source,
        "label_delimiter_used": delimiter,
        "rows_in": int(len(frame)),
        "dropped": {kind: {"count": int(len(p)), "rows": [int(r) + 1 for r in p[:_MAX_LISTED_ROWS]]}
                    for kind, p in dropped.items()},
        "given_other": given_other,
    }
    return data, info


def _label_columns(columns: list[str], config: PrepareConfig) -> list[str]:
    """The label columns `config` names, else every column but the text."""
    text = config.text_column
    if text in config.label_columns:
        raise TextDataError(f"column {text!r} cannot be both the text and a label column")
    label_columns = list(dict.fromkeys(config.label_columns)) or [c for c in columns if c != text]
    if not label_columns:
        raise TextDataError(f"the CSV has no label column besides the text column {text!r}")
    return label_columns


def _labels(frame: pd.DataFrame, label_columns: list[str],
            delimiter: str) -> tuple[pd.DataFrame, np.ndarray, str, str | None]:
    """`(labels, missing, label_source, delimiter)`: 0/1 label columns of every row, which
    rows have no label cell (class names only: a missing 0/1 cell is an error), "one_hot"
    or "class_names", and the delimiter class names were split on (None: one-hot)."""
    values = frame[label_columns[0]].astype(str)
    # Missing-value markers (not empty cells), in a class-name column only.
    missing = values.str.strip().isin(_MISSING).to_numpy() if len(label_columns) == 1 else \
        np.zeros(len(frame), dtype=bool)
    known = values[~missing]
    # A single column that is almost all 0/1 (missing cells aside) is one binary label
    # with typos, not the class names "0", "1", "2", "yes": _one_hot then names the bad rows.
    if len(label_columns) == 1 and \
            (_bool_like(known).mean() if len(known) else 0.0) < _BINARY_SHARE:
        delimiter = label_delimiter_of(values[~missing], label_columns[0], delimiter)
        return (_from_class_names(values.where(~missing, ""), delimiter), missing,
                "class_names", delimiter)
    # _one_hot names missing 0/1 cells
    return (_one_hot(frame, label_columns), np.zeros(len(frame), dtype=bool), "one_hot",
            None)


def _drops(labels: pd.DataFrame, texts: pd.Series, missing: np.ndarray,
           other: str) -> tuple[dict[str, np.ndarray], int]:
    """`(dropped, given_other)`: the positions of the rows dropped, by why, and how many
    rows with no label were given the `other` label instead (set in `labels`, which gains
    that column when it needs it; "" drops them)."""
    # A cell of control characters reads as text to pandas; the row is dropped, counted.
    not_text = texts.map(lambda t: bool(text_problem(t))).to_numpy(dtype=bool)
    empty_text = (texts.str.strip() == "") | not_text
    no_label = (labels.sum(axis=1) == 0).to_numpy() & ~missing
    dropped = {"empty_text": np.flatnonzero(empty_text.to_numpy() & ~not_text)}
    if not_text.any():
        dropped["not_text"] = np.flatnonzero(not_text)
    if missing.any():
        dropped["missing_label"] = np.flatnonzero(missing & ~empty_text.to_numpy())
    given_other = 0
    if other:
        given = no_label & ~empty_text.to_numpy()
        given_other = int(given.sum())
        if given_other:
            if other not in labels.columns:
                labels[other] = 0
            labels.loc[given, other] = 1
    else:
        dropped["no_label"] = np.flatnonzero(no_label & ~empty_text.to_numpy())
    return dropped, given_other


# The rule that assigns rows to splits, recorded in the manifest: a change of it is a
# change of every split. 2: rows of one text stay together (1 split row by row).
SPLIT_RULE = {"version": 2, "rule": "stratified by class (single-label) or at random "
              "(multi-label); rows whose texts are equal once whitespace is collapsed and "
              "case folded go to one split together"}


def text_groups(texts: pd.Series) -> np.ndarray:
    """Each row's group, numbered in order: rows of one text (`SPLIT_RULE`) share one."""
    keys = texts.astype(str).map(lambda t: " ".join(t.split()).casefold())
    return pd.factorize(keys)[0]


def split_rows(data: pd.DataFrame, labels: Sequence[str], task: str,
               config: PrepareConfig) -> dict[str, np.ndarray]:
    """Assigns every row to train, validation or test (`SPLIT_RULE`): test takes
    `test_fraction` of the rows, validation `validation_fraction` of the rest, class by
    class (single-label) or at random; rows of one text (`text_groups`) move together.

    Returns:
        Split name to the sorted positions (0-based, in `data`) of its rows.

    Raises:
        TextDataError: Train or validation would be empty.
    """
    rng = np.random.default_rng(config.seed)
    groups = text_groups(data[config.text_column])
    firsts = np.unique(groups, return_index=True)[1]  # each group's first row
    sizes = np.bincount(groups)
    if task == SINGLE_LABEL:
        klass = data[list(labels)].to_numpy().argmax(axis=1)[firsts]
        strata = [np.flatnonzero(klass == k) for k in range(len(labels))]
    else:
        strata = [np.arange(len(firsts))]
    chosen: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for stratum in strata:
        order = rng.permutation(stratum)
        rows_before = np.concatenate([[0], np.cumsum(sizes[order])[:-1]])
        n_test = int(round(sizes[order].sum() * config.test_fraction))
        n_valid = int(round((sizes[order].sum() - n_test) * config.validation_fraction))
        test = rows_before < n_test
        valid = ~test & (rows_before < n_test + n_valid)
        chosen["test"].append(order[test])
        chosen["validation"].append(order[valid])
        chosen["train"].append(order[~test & ~valid])
    splits = {s: np.flatnonzero(np.isin(groups, np.concatenate(g))).astype(np.int64)
              for s, g in chosen.items()}
    for needed in ("train", "validation"):
        if splits[needed].size == 0:
            raise TextDataError(
                f"the {needed} split is empty: {len(data)} usable rows, "
                f"validation_fraction={config.validation_fraction}, "
                f"test_fraction={config.test_fraction}; give more rows or change the fractions")
    return splits


def duplicate_texts(data: pd.DataFrame, labels: Sequence[str],
                    text_column: str) -> dict[str, Any]:
    """The manifest's count of rows sharing a text (`text_groups`), and of those whose
    copies carry different labels (rows numbered from 1 without the header)."""
    groups = text_groups(data[text_column])
    repeated = np.bincount(groups)[groups] > 1
    frame = pd.DataFrame(data[list(labels)].to_numpy()[repeated], index=groups[repeated])
    conflicting = frame.groupby(level=0).nunique().max(axis=1) > 1 if len(frame) else \
        pd.Series(dtype=bool)
    clashing = np.flatnonzero(repeated & np.isin(groups, conflicting.index[conflicting]))
    rows = (data.index.to_numpy()[clashing] + 1).tolist()
    return {"rows": int(repeated.sum()),
            "texts": int(len(np.unique(groups[repeated]))),
            "conflicting_labels": {"count": len(rows), "rows": rows[:_MAX_LISTED_ROWS]}}


def prepare_text_dataset(data_uri: str, out_dir: str, config: PrepareConfig) -> dict[str, Any]:
    """Reads, validates and splits a labelled CSV into a prepared dataset folder.

    Args:
        data_uri: The CSV, a local path or gs:// URI.
        out_dir: Folder written: `train.csv`, `validation.csv`, `test.csv`, `manifest.json`.
        config: Columns, label handling and split.

    Returns:
        The manifest: source, labels, task, dropped rows (at most 100 listed per kind),
        label counts, `splits` ({split: {rows, label_counts}}) and the split settings.

    Raises:
        TextDataError: The CSV cannot be used; the message says why and where.
    """
    raw = read_bytes(data_uri)  # read once: what is parsed is what is hashed
    frame = read_csv(data_uri, raw, config)
    data, info = normalize(frame, config)
    labels = info["labels"]
    if len(labels) < 2 and info["task"] == SINGLE_LABEL:
        raise TextDataError(
            f"only one class ({labels}) among the usable rows: a classifier needs two or more")
    splits = split_rows(data, labels, info["task"], config)
    os.makedirs(out_dir, exist_ok=True)
    split_info = {}
    for name, positions in splits.items():
        part = data.iloc[positions]
        part.to_csv(split_path(out_dir, name), index=False)
        split_info[name] = {
            "rows": int(len(part)),
            "label_counts": {label: int(part[label].sum()) for label in labels},
        }
    manifest = {
        "source": data_uri,
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "text_column": config.text_column,
        **info,
        "other_label": config.other_label,
        "label_delimiter": config.label_delimiter,
        "rows_kept": int(len(data)),
        "label_counts": {label: int(data[label].sum()) for label in labels},
        "splits": split_info,
        "split_rule": SPLIT_RULE,
        "duplicate_texts": duplicate_texts(data, labels, config.text_column),
        "validation_fraction": config.validation_fraction,
        "test_fraction": config.test_fraction,
        "seed": config.seed,
    }
    write_json_atomically(os.path.join(out_dir, MANIFEST), manifest, sort_keys=False,
                          allow_nan=False)
    return manifest
