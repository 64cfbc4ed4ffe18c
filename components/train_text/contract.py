"""The text trainer's contract: its settings and the model folder it writes.

Model folder: `export.pkl` (the fastai learner; it reads a frame whose text column is
`TEXT_FIELD`), `labels.json` (labels, task, thresholds), `metrics.json` (validation
scores and training history), `per_label_metrics.json`; and the layout of pretrained
language model assets it reads. Other steps import this module only, never the trainer;
nothing here imports fastai or torch. `components.formats.text_models` loads the model
folder, `components.formats.lm_assets` holds the tokenizer and the assets writer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from components.common.storage import filesystem

EXPORT_FILE = "export.pkl"
LABELS_FILE = "labels.json"
TRAINING_METRICS_FILE = "metrics.json"
PER_LABEL_FILE = "per_label_metrics.json"
# Pretrained language models, under the lm_assets root (see assets.py):
# <lang>/{forward,backward}/{config.json,vocab.pkl,weights.pth}, <lang>/spm/spm.model.
SPM_LANGS = frozenset({"ja", "ko", "zh"})
LM_FILES = ("config.json", "vocab.pkl", "weights.pth")
SPM_FILE = "spm/spm.model"
# The language of fastai's own pretrained AWD-LSTM (WikiText-103), which a pretrained run
# without lm_assets starts from (assets.fetch_fastai_pretrained).
FASTAI_PRETRAINED_LANG = "en"
# The text column of the frames the learner was trained on, and predicts from.
TEXT_FIELD = "text"
# The most characters of one text the classifier reads: its first ones (`clip_text`).
# spaCy refuses a text over 1,000,000 characters (E088), after fastai's rules, which can
# make a text up to ~4x longer (spaces around "/", "#" and newlines; xxrep markers); the
# AWD-LSTM reads every token one after another (2.5 ms a token measured on one CPU core
# at fastai's default size), while it pools over the last 1,440 only. 20,000 characters
# (~4,000 words) keeps one text around 10 s on a CPU endpoint.
MAX_TEXT_CHARS = 20_000
# What `monitor` may name: the losses, and the metric of multi- or single-label models.
MONITORS = ("valid_loss", "train_loss", "f1_score", "accuracy_multi", "accuracy")
# How a learnt encoder is unfrozen: ULMFiT's stages, everything at once, or by data size.
UNFREEZE_MODES = ("auto", "gradual", "all")


class TextTrainingError(RuntimeError):
    """Training cannot start as configured; the message says why."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (see the component for each one's meaning)."""

    # English from fastai's WikiText-103 AWD-LSTM unless told otherwise: a console user who
    # sets only data_uri starts pretrained (assets.fetch_fastai_pretrained, or lm_assets).
    lang: str = "en"
    pretrained: bool = True
    backwards: bool = False
    lm_epochs: int = 4
    epochs: int = 8
    batch_size: int = 16
    drop_mult: float = 0.3
    threshold: float = 0.3
    monitor: str = "valid_loss"
    unfreeze: str = "auto"
    learning_rate: float = 0.0  # 0: found by lr_find
    lm_learning_rate: float = 2e-3
    seq_len: int = 72
    min_freq: int = 3
    max_vocab: int = 60000
    mixed_precision: bool = True
    model_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 42

    def __post_init__(self) -> None:
        problems = []
        for name in ("lm_epochs", "epochs"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.epochs < 1:
            problems.append(f"epochs must be >= 1 (the classifier has to train), got {self.epochs}")
        for name in ("batch_size", "seq_len", "min_freq", "max_vocab"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.threshold < 1:  # also refuses NaN
            problems.append(f"threshold must be in (0, 1), got {self.threshold}")
        if not self.drop_mult >= 0:
            problems.append(f"drop_mult must be >= 0, got {self.drop_mult}")
        if not self.learning_rate >= 0:  # also refuses NaN
            problems.append(f"learning_rate must be > 0, or 0 to find it with lr_find; "
                            f"got {self.learning_rate}")
        if not self.lm_learning_rate > 0:
            problems.append(f"lm_learning_rate must be > 0, got {self.lm_learning_rate}")
        if self.monitor not in MONITORS:
            problems.append(f"monitor must be one of {MONITORS}, got {self.monitor!r}")
        if self.unfreeze not in UNFREEZE_MODES:
            problems.append(f"unfreeze must be one of {UNFREEZE_MODES}, got {self.unfreeze!r}")
        if problems:
            raise TextTrainingError("; ".join(problems))


def parse_model_config(text: str) -> dict[str, Any]:
    """AWD_LSTM settings from a JSON object string ("" gives none).

    Raises:
        TextTrainingError: Not a JSON object, or a key AWD_LSTM does not take.
    """
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise TextTrainingError(f"model_config is not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise TextTrainingError("model_config must be a JSON object, e.g. {\"emb_sz\": 400}")
    return value


def read_labels(model_dir: str) -> dict[str, Any]:
    """labels.json of a trained model folder."""
    with open(os.path.join(model_dir, LABELS_FILE)) as f:
        return json.load(f)


def clip_text(text: str) -> str:
    """The part of `text` a classifier reads: its first `MAX_TEXT_CHARS` characters.

    Whatever feeds texts to a classifier cuts them here (`components.formats.text_models`
    does, for evaluation, batch prediction and serving), so that a text over the limit is
    read the same way in training and prediction; callers count the texts cut
    (`len(text) > MAX_TEXT_CHARS`) and report them.
    """
    return text[:MAX_TEXT_CHARS]


def direction(backwards: bool) -> str:
    """Folder name of a direction: "backward" or "forward"."""
    return "backward" if backwards else "forward"


def required_files(lang: str, backwards: bool) -> list[str]:
    """Paths, relative to the assets URI, that a language and direction need."""
    lang = lang.strip()
    files = [f"{lang}/{direction(backwards)}/{name}" for name in LM_FILES]
    if lang in SPM_LANGS:
        files.append(f"{lang}/{SPM_FILE}")
    return files


def asset_uri(uri: str, relative: str) -> str:
    """`relative` (a path of the layout) under the assets root `uri`."""
    return uri.rstrip("/") + "/" + relative


def missing_files(assets_uri: str, lang: str, backwards: bool) -> list[str]:
    """Full URIs of the files a language and direction need that are absent."""
    fs, root = filesystem(assets_uri)
    return [asset_uri(assets_uri, rel) for rel in required_files(lang, backwards)
            if not fs.isfile(asset_uri(root, rel))]
