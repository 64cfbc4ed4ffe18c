"""What every text classifier's model folder holds, and how a text is read, whichever trainer.
Nothing here imports fastai, torch or transformers.
"""

from __future__ import annotations

import os
from typing import Any

from components.common.input_kinds import read_json_object

EXPORT_FILE = "export.pkl"  # the fastai trainer's learner
LABELS_FILE = "labels.json"
TRAINING_METRICS_FILE = "metrics.json"
PER_LABEL_FILE = "per_label_metrics.json"
# What `save_pretrained` writes and `from_pretrained` needs of a transformer's model folder.
MODEL_CONFIG_FILE = "config.json"
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")
# `tokenizer.save_pretrained`'s files (fast or slow). Without one, transformers builds a
# tokenizer of the special tokens alone from config.json: every word is [UNK].
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model",
                   "spiece.model", "tokenizer.model")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Encoders whose position ids start after the padding index (RoBERTa's scheme): of
# XLM-R's 514 positions, 512 hold tokens.
OFFSET_POSITION_MODELS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert",
                          "data2vec-text", "mpnet", "longformer")
# Tokenizers without a length limit say so with a huge model_max_length (1e30).
_NO_LIMIT = 1_000_000
# The text column of the frames the fastai learner was trained on, and predicts from.
TEXT_FIELD = "text"
# The most characters of one text the classifier reads (`clip_text`). spaCy refuses a text
# over 1M characters (E088) after fastai's rules (up to ~4x longer), and the AWD-LSTM reads
# every token in turn (2.5 ms a token on one CPU core) while pooling over the last 1,440:
# 20,000 characters (~4,000 words) keeps one text around 10 s on a CPU endpoint.
MAX_TEXT_CHARS = 20_000


def read_labels(model_dir: str) -> dict[str, Any]:
    """labels.json of a trained model folder.

    Raises:
        InputKindError: It is not a JSON object (naming the file).
    """
    path = os.path.join(model_dir, LABELS_FILE)
    with open(path, "rb") as f:
        return read_json_object(f.read(), f"model file {path!r}",
                                "give the training step's model output, whole")


def clip_text(text: str) -> str:
    """The part of `text` a classifier reads: its first `MAX_TEXT_CHARS` characters.

    Training and every prediction path cut texts here, so a long text reads alike in both;
    callers count and report the texts cut.
    """
    return text[:MAX_TEXT_CHARS]


def is_transformer_folder(model_dir: str) -> bool:
    """Whether a local folder holds a Hugging Face model (`config.json` and weights, one
    file or the index of their shards)."""
    if not os.path.isfile(os.path.join(model_dir, MODEL_CONFIG_FILE)):
        return False
    files = set(os.listdir(model_dir))
    return any(name in files or f"{name}.index.json" in files for name in WEIGHTS_FILES)


# The fields of a transformer folder's JSON files that the checks read, and their types.
_NUMBER_FIELDS = {MODEL_CONFIG_FILE: {"max_position_embeddings": int, "pad_token_id": int,
                                      "vocab_size": int},
                  TOKENIZER_CONFIG_FILE: {"model_max_length": (int, float)}}


def field_problems(name: str, values: dict[str, Any], folder: str) -> list[str]:
    """The fields of `name` (config.json or tokenizer_config.json) read here that hold a
    value of another type, each named with what it must be."""
    return [f"model_name {folder!r}: {name} field {field!r} is {value!r}, not a "
            f"{'number' if kind is not int else 'whole number'}; save the folder again with "
            "save_pretrained"
            for field, kind in _NUMBER_FIELDS.get(name, {}).items()
            for value in [values.get(field)]
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind))]


def token_limit(config: dict[str, Any], model_max_length: float | None) -> int | None:
    """The most tokens one text can have for this encoder: the smaller of its tokenizer's
    `model_max_length` and its usable position embeddings; None if neither sets one.

    Args:
        config: The model's config.json.
        model_max_length: The tokenizer's limit (tokenizer_config.json), if any.
    """
    limits = []
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        if config.get("model_type") in OFFSET_POSITION_MODELS:
            pad = config.get("pad_token_id")
            positions -= (pad if isinstance(pad, int) else 0) + 1
        limits.append(positions)
    if isinstance(model_max_length, (int, float)) and not isinstance(model_max_length, bool) \
            and 0 < model_max_length < _NO_LIMIT:
        limits.append(int(model_max_length))
    return min(limits) if limits else None


def max_length_problem(max_length: int, config: dict[str, Any],
                       model_max_length: float | None, model_name: str) -> str:
    """Why `max_length` is too long for the model `model_name`; empty when it fits."""
    limit = token_limit(config, model_max_length)
    if limit is None or max_length <= limit:
        return ""
    return (f"max_length {max_length} is more than model_name {model_name!r} reads: at most "
            f"{limit} tokens (its positions and its tokenizer's model_max_length); set "
            f"max_length to {limit} or less")


def tokenizer_problem(tokens: int, config: dict[str, Any], model_name: str) -> str:
    """Why a loaded tokenizer cannot be the model's own (far fewer tokens than the model
    has embeddings: built from config.json alone); empty when it can."""
    embeddings = config.get("vocab_size")
    if not isinstance(embeddings, int) or isinstance(embeddings, bool) or tokens * 2 >= embeddings:
        return ""
    return (f"model_name {model_name!r} loads a tokenizer of {tokens} tokens for a model of "
            f"{embeddings} token embeddings: its tokenizer files ({', '.join(TOKENIZER_FILES)}) "
            "are missing, so every word would be unknown; save them beside the model with "
            "tokenizer.save_pretrained(folder)")
