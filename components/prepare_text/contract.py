"""The text preparation step's contract: its settings and the dataset folder it writes.

Dataset folder: `train.csv`, `validation.csv`, `test.csv` (the text column, then one 0/1
column per label) and `manifest.json` (text column, labels, task, dropped rows, split
counts, source sha256). Other steps import this module only, never the preparation.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from components.common.input_kinds import InputKindError, csv_header, decode_text
from components.common.written import check_settings, setting

if TYPE_CHECKING:
    import pandas as pd

MANIFEST = "manifest.json"
# The same split names as the image shards.
SPLITS = ("train", "validation", "test")
MULTI_LABEL = "multi_label"
SINGLE_LABEL = "single_label"


# The label_delimiter that reads "," and refuses the other common delimiters in a cell.
AUTO_DELIMITER = "auto"


class TextDataError(ValueError):
    """The CSV cannot be used as given; the message names the column and rows."""


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """How to read and split the CSV: each field's help is the preparation step's input help
    (the console's), where a step input gives label_columns as comma-separated text."""

    text_column: str = setting("text", "Name of the column holding the texts.")
    label_columns: tuple[str, ...] = setting((), "Comma-separated label column names; empty uses"
                                             " every column but the text.")
    label_delimiter: str = setting("auto", "Separates several class names inside one cell of a "
                                   'class-name column: "auto" reads "," and refuses a cell '
                                   'holding ";" or "|" (one file mixing them would make "a;b" '
                                   'a class); "," declares ";" and "|" part of class names; '
                                   '";" or "|" separate with that; empty keeps each cell one '
                                   "class name.")
    other_label: str = setting("other", "Label given to rows with no label set; empty drops "
                               "those rows instead.")
    validation_fraction: float = setting(0.2, "Share of the rows left after the test split used "
                                         "for validation.", gt=0, lt=1)
    test_fraction: float = setting(0.25, "Share of all rows held out for the final test.",
                                   ge=0, lt=1)
    seed: int = setting(42, "Seed of the split; the same file and seed give the same splits.")

    def __post_init__(self) -> None:
        check_settings(self, TextDataError)


def parse_label_columns(text: str) -> tuple[str, ...]:
    """Splits a comma-separated list of column names ("" gives no names)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def split_path(dataset_dir: str, split: str) -> str:
    """Path of one split's CSV inside a prepared dataset folder."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return os.path.join(dataset_dir, f"{split}.csv")


def read_manifest(dataset_dir: str) -> dict[str, Any]:
    """The manifest of a prepared dataset folder."""
    with open(os.path.join(dataset_dir, MANIFEST)) as f:
        return json.load(f)


def read_split(dataset_dir: str, split: str) -> pd.DataFrame:
    """One split of a prepared dataset: the text column (str) and 0/1 label columns."""
    # pandas only here: the pipelines and light steps import this module for its names.
    import numpy as np
    import pandas as pd

    manifest = read_manifest(dataset_dir)
    text = manifest["text_column"]
    frame = pd.read_csv(split_path(dataset_dir, split), dtype={text: str},
                        keep_default_na=False)
    for label in manifest["labels"]:
        frame[label] = frame[label].astype(np.int64)
    return frame


def read_text_csv(data: bytes, name: str, columns: Mapping[str, str],
                  error: type[Exception]) -> pd.DataFrame:
    """A CSV of texts, every cell a string ("" when empty), as the text steps read one.

    Args:
        data: The file's bytes.
        name: The file as the messages name it (e.g. "data_uri 'gs://b/x.csv'").
        columns: The columns needed, each to the parameter that names it.
        error: The step's error, raised with the message.

    Raises:
        error: Not text, empty, a refused header (`csv_header`) or not a readable CSV.
    """
    import pandas as pd

    try:
        text = decode_text(data, name, controls=False)
        csv_header(io.StringIO(text), name, columns)
        # Strings only: "NA" or "null" is a text, not a missing value.
        return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_filter=False)
    except InputKindError as err:
        raise error(str(err)) from None
    except pd.errors.ParserError as err:
        raise error(f"{name} is not a readable UTF-8 CSV: {err}") from err
