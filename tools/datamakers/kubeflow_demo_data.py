"""The tiny data `python -m tools.rehearsal.kubeflow_demo` uploads to S3 before its rehearsals.

    python -m tools.datamakers.kubeflow_demo_data DIR

Writes `DIR/pets/` (class folders of digit images), `DIR/docstrings.csv` (this venv's
module docstrings labelled by package) and `DIR/tiny/` (a tiny BERT-style encoder whose
vocabulary is counted from that CSV's training split, as `make run` writes it).
"""

from __future__ import annotations

import os
import sys

from components.prepare_text.contract import PrepareConfig, read_split
from components.prepare_text.preparation import prepare_text_dataset
from components.train_transformer.tiny import write_tiny_model
from tools.datamakers.demo import write_digits
from tools.datamakers.docstring_corpus import write_docstring_corpus


def write_demo_data(folder: str) -> None:
    """Writes the image set, the text CSV and the encoder under `folder`."""
    write_digits(os.path.join(folder, "pets"), per_class=16)
    csv = os.path.join(folder, "docstrings.csv")
    write_docstring_corpus(csv)
    prepared = os.path.join(folder, "prepared")
    prepare_text_dataset(csv, prepared, PrepareConfig())
    write_tiny_model(read_split(prepared, "train")["text"], os.path.join(folder, "tiny"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_demo_data(sys.argv[1])
