"""Readers and writers of the files steps hand each other, shared by the steps that use them.

A step's `contract.py` names its outputs (file names, schemas, feature keys), holds its
settings class and errors, and reads its own small JSON files; the code that loads a
framework to read or write those outputs lives here, one module per format:

- `shards`: the tf.data reader of the sharding step's TFRecords.
- `image_models`: the tf-keras loader of the image trainer's `model.keras`.
- `lm_assets`: the tokenizer both fastai text trainers cut text with, and the writer of
  pretrained language model assets.

These modules import contracts, `components.common` and each other only, never a step's
logic (tests/test_structure.py), and import their frameworks inside the functions that
need them, so that a light step (or a contract) can import them.
"""
