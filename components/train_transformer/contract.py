"""The transformer trainer's contract: its settings and the model folder it writes.

Model folder: the Hugging Face model and tokenizer as `save_pretrained` writes them
(`config.json`, `model.safetensors`, `tokenizer.json`, ...), so `from_pretrained(folder)`
loads it; `labels.json` (labels, task, thresholds, text column, `"framework":
"transformers"`, `max_length`), `metrics.json` (validation scores and training history)
and `per_label_metrics.json`, the same three files the fastai text trainer writes, so
evaluation, prediction, serving and tracking read either (`components.text_common.contract`
names the files, `components.text_common.models` loads the folder). Nothing here imports
torch.
"""

from __future__ import annotations

import dataclasses
import math
import os

from components.common.input_kinds import FolderKind
from components.common.storage import is_remote
from components.text_common.contract import MODEL_CONFIG_FILE, TOKENIZER_FILES, WEIGHTS_FILES

FRAMEWORK = "transformers"
# The default encoder: multilingual (about 100 languages, the fastai trainer's fr default and
# ja/ko/zh included, with no per-language tokenizer to pick) and the usual strong base-size
# baseline for classification (Conneau et al. 2020, XNLI/MLQA). 278M parameters, 86M of
# them outside the embeddings: one L4 or T4 fine-tunes it at 256 tokens, batch 16.
DEFAULT_MODEL_NAME = "FacebookAI/xlm-roberta-base"
# What `monitor` may name: the validation loss, or micro/macro F1 at the threshold.
MONITORS = ("loss", "micro_f1", "macro_f1")


class TransformerTrainingError(RuntimeError):
    """Training cannot start as configured; the message says why."""


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Settings of one fine-tuning run (see the component for each one's meaning)."""

    model_name: str = DEFAULT_MODEL_NAME
    # Checked on a real pretrained encoder (all-MiniLM-L6-v2, pipelines.pretrained_encoder)
    # on ~500 training texts: at 2e-5 x 4 epochs (116 steps) it never left the constant
    # answer (validation micro F1 0); at 5e-5 x 6 it learnt (docs/measurements.md). Early
    # stopping ends large-data runs sooner; the tuning space spans 1e-5..1e-4.
    epochs: int = 6
    batch_size: int = 16
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_length: int = 256
    threshold: float = 0.5
    monitor: str = "loss"
    early_stopping_patience: int = 2
    mixed_precision: bool = True
    seed: int = 42

    def __post_init__(self) -> None:
        problems = []
        if not self.model_name.strip():
            problems.append("model_name must name a Hub model or a model folder")
        for name in ("epochs", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.early_stopping_patience < 0:
            problems.append("early_stopping_patience must be >= 0 (0: no early stopping), "
                            f"got {self.early_stopping_patience}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            problems.append(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_ratio < 1:  # also refuses NaN
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 < self.threshold < 1:
            problems.append(f"threshold must be in (0, 1), got {self.threshold}")
        if self.monitor not in MONITORS:
            problems.append(f"monitor must be one of {MONITORS}, got {self.monitor!r}")
        if problems:
            raise TransformerTrainingError("; ".join(problems))


def model_name_is_path(model_name: str) -> bool:
    """Whether `model_name` names a folder (gs://, s3://, an absolute or ./ path, or a path that
    exists here) rather than a Hub model; the trainer and the preflight decide alike."""
    name = model_name.strip()
    return (is_remote(name) or os.path.isabs(name) or name.startswith(".")
            or os.path.exists(name))


# A transformer to start training from (`model_name` as a folder), as `save_pretrained`
# writes it with its tokenizer: what the trainer and preflight hold such a folder to.
BASE_MODEL_FOLDER = FolderKind(
    "a transformer model folder", marks=(MODEL_CONFIG_FILE, *WEIGHTS_FILES),
    required=((MODEL_CONFIG_FILE,), WEIGHTS_FILES, TOKENIZER_FILES),
    made_by="a folder written by model.save_pretrained(folder) and "
            "tokenizer.save_pretrained(folder)")
