"""KFP face of the text preparation step: `prepare_text_data` takes every field of
`contract.PrepareConfig` (its type, default and help, written from the class by
`components.common.written.step_function`) between its CSV and its fingerprint."""

from kfp.dsl import Dataset, Output

from components.common.written import settings_from_step, step_function
from components.prepare_text.contract import PrepareConfig, parse_label_columns


def prepare_step(values: dict) -> None:
    """The step's work: prepares the CSV with the inputs' settings, then tags the dataset.

    Args:
        values: Every input of `prepare_text_data`, by name.
    """
    from components.prepare_text.preparation import prepare_text_dataset

    config = settings_from_step(PrepareConfig, values, {"label_columns": parse_label_columns})
    dataset = values["dataset"]
    manifest = prepare_text_dataset(values["data_uri"], dataset.path, config)
    dataset.metadata.update({
        "data_fingerprint": values["data_fingerprint"],
        "task": manifest["task"],
        "labels": manifest["labels"],
        "rows_in": manifest["rows_in"],
        "rows_kept": manifest["rows_kept"],
        **{f"dropped_{kind}": d["count"] for kind, d in manifest["dropped"].items()},
        "given_other": manifest["given_other"],
        **{f"{split}_rows": s["rows"] for split, s in manifest["splits"].items()},
    })


def written_step(settings: type = PrepareConfig):
    """`prepare_text_data` written from `settings`."""
    return step_function(
        "prepare_text_data", settings,
        "Validates a labelled text CSV and splits it into train/validation/test.",
        before=[
            ("data_uri", str, "CSV (gs://bucket/path.csv or local path) with a text column and "
             "either one 0/1 (or True/False) column per label or one column of class names."),
            ("dataset", Output[Dataset], "Output folder: `train.csv`, `validation.csv`, "
             "`test.csv` (text then one 0/1 column per label) and `manifest.json` (labels, "
             "task, dropped rows, split counts)."),
        ],
        after=[
            ("data_fingerprint", "", "Digest of the CSV's listing from the preflight step; not "
             "read, it only makes the cache key change when the file changes. Recorded in the "
             "dataset metadata."),
        ],
        runs="components.prepare_text.component:prepare_step")


prepare_text_data = written_step()
