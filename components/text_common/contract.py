"""What every text classifier's model folder holds, and how a text is read, whichever trainer.

Both text trainers (`components.train_text`, fastai ULMFiT; `components.train_transformer`,
Hugging Face) write `labels.json` (labels, task, thresholds, text column),
`metrics.json` (validation scores and training history) and `per_label_metrics.json`
beside their model: the fastai learner in `export.pkl` (it reads a frame whose text
column is `TEXT_FIELD`), or what `save_pretrained` writes (`config.json` and weights).
Evaluation, prediction, serving and tracking read either through these names and
`components.text_common.models`. Each trainer imports this module, never the other
trainer; nothing here imports fastai, torch or transformers.
"""

from __future__ import annotations

import json
import os
from typing import Any

EXPORT_FILE = "export.pkl"  # the fastai trainer's learner
LABELS_FILE = "labels.json"
TRAINING_METRICS_FILE = "metrics.json"
PER_LABEL_FILE = "per_label_metrics.json"
# What `save_pretrained` writes and `from_pretrained` needs of a transformer's model folder.
MODEL_CONFIG_FILE = "config.json"
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")
# The text column of the frames the fastai learner was trained on, and predicts from.
TEXT_FIELD = "text"
# The most characters of one text the classifier reads: its first ones (`clip_text`).
# spaCy refuses a text over 1,000,000 characters (E088), after fastai's rules, which can
# make a text up to ~4x longer (spaces around "/", "#" and newlines; xxrep markers); the
# AWD-LSTM reads every token one after another (2.5 ms a token measured on one CPU core
# at fastai's default size), while it pools over the last 1,440 only. 20,000 characters
# (~4,000 words) keeps one text around 10 s on a CPU endpoint.
MAX_TEXT_CHARS = 20_000


def read_labels(model_dir: str) -> dict[str, Any]:
    """labels.json of a trained model folder."""
    with open(os.path.join(model_dir, LABELS_FILE)) as f:
        return json.load(f)


def clip_text(text: str) -> str:
    """The part of `text` a classifier reads: its first `MAX_TEXT_CHARS` characters.

    Whatever feeds texts to a classifier cuts them here (`components.text_common.models`
    does, for evaluation, batch prediction and serving), so that a text over the limit is
    read the same way in training and prediction; callers count the texts cut
    (`len(text) > MAX_TEXT_CHARS`) and report them.
    """
    return text[:MAX_TEXT_CHARS]


def has_weights(files: set[str]) -> bool:
    """Whether a model folder's file names include its weights (one file, or the index of
    their shards, as `save_pretrained` writes a large model)."""
    return any(name in files or f"{name}.index.json" in files for name in WEIGHTS_FILES)


def is_transformer_folder(model_dir: str) -> bool:
    """Whether a local folder holds a Hugging Face model (`config.json` and weights)."""
    if not os.path.isfile(os.path.join(model_dir, MODEL_CONFIG_FILE)):
        return False
    return has_weights(set(os.listdir(model_dir)))
