"""KFP face of the text preparation step: the typed signature mapped onto `prepare_text_dataset`."""

from kfp.dsl import Dataset, Output


# Defaults written by python -m tools.signatures from contract.PrepareConfig (edit there).
def prepare_text_data(
    data_uri: str,
    dataset: Output[Dataset],
    text_column: str = "text",
    label_columns: str = "",
    label_delimiter: str = "auto",
    other_label: str = "other",
    validation_fraction: float = 0.2,
    test_fraction: float = 0.25,
    seed: int = 42,
    data_fingerprint: str = "",
):
    """Validates a labelled text CSV and splits it into train/validation/test.

    Args:
        data_uri: CSV (gs://bucket/path.csv or local path) with a text column and either one 0/1 (or True/False) column per label or one column of class names.
        dataset: Output folder: `train.csv`, `validation.csv`, `test.csv` (text then one 0/1 column per label) and `manifest.json` (labels, task, dropped rows, split counts).
        text_column: Name of the column holding the texts.
        label_columns: Comma-separated label column names; empty uses every column but the text.
        label_delimiter: Separates several class names inside one cell of a class-name column: "auto" reads "," and refuses a cell holding ";" or "|" (one file mixing them would make "a;b" a class); "," declares ";" and "|" part of class names; ";" or "|" separate with that; empty keeps each cell one class name.
        other_label: Label given to rows with no label set; empty drops those rows instead.
        validation_fraction: Share of the rows left after the test split used for validation.
        test_fraction: Share of all rows held out for the final test.
        seed: Seed of the split; the same file and seed give the same splits.
        data_fingerprint: Digest of the CSV's listing from the preflight step; not read, it only makes the cache key change when the file changes. Recorded in the dataset metadata.
    """
    from components.prepare_text.contract import PrepareConfig, parse_label_columns
    from components.prepare_text.preparation import prepare_text_dataset

    config = PrepareConfig(
        text_column=text_column, label_columns=parse_label_columns(label_columns),
        label_delimiter=label_delimiter, other_label=other_label,
        validation_fraction=validation_fraction, test_fraction=test_fraction, seed=seed,
    )
    manifest = prepare_text_dataset(data_uri, dataset.path, config)
    dataset.metadata.update({
        "data_fingerprint": data_fingerprint,
        "task": manifest["task"],
        "labels": manifest["labels"],
        "rows_in": manifest["rows_in"],
        "rows_kept": manifest["rows_kept"],
        **{f"dropped_{kind}": d["count"] for kind, d in manifest["dropped"].items()},
        "given_other": manifest["given_other"],
        **{f"{split}_rows": s["rows"] for split, s in manifest["splits"].items()},
    })
