"""The transformer trainer's contract: its settings and the model folder it writes.

Model folder: the model and tokenizer as `save_pretrained` writes them, and the fastai
text trainer's `labels.json` (`"framework": "transformers"`, `max_length`), `metrics.json`
and `per_label_metrics.json`, so every reader loads either (`components.text_common`).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os

from components.common import preemption
from components.common.input_kinds import FolderKind
from components.common.storage import is_remote
from components.common.written import check_settings, setting
from components.text_common.contract import MODEL_CONFIG_FILE, TOKENIZER_FILES, WEIGHTS_FILES

FRAMEWORK = "transformers"
# Multilingual (~100 languages, no tokenizer to pick per language), the usual base-size
# baseline (Conneau et al. 2020); 278M parameters: one L4 or T4 at 256 tokens, batch 16.
DEFAULT_MODEL_NAME = "FacebookAI/xlm-roberta-base"
MONITORS = ("loss", "micro_f1", "macro_f1")


class TransformerTrainingError(RuntimeError):
    """Training cannot start as configured; the message says why."""


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Settings of one fine-tuning run (each field's help: the step input's)."""

    model_name: str = setting(DEFAULT_MODEL_NAME, "Hub model name (e.g. "
                              "FacebookAI/xlm-roberta-base, google-bert/bert-base-uncased) or "
                              "a folder (gs:// or local) written by save_pretrained; its "
                              "classification head is replaced by one sized for the labels.")
    # all-MiniLM-L6-v2 on ~500 texts never left the constant answer at 2e-5 x 4 epochs; at
    # 5e-5 x 6 it learnt (docs/measurements.md). Early stopping ends large runs sooner.
    epochs: int = setting(6, "Most epochs (early stopping may end sooner).", ge=1)
    batch_size: int = setting(16, "Texts per batch on each GPU (or process).", ge=1)
    learning_rate: float = setting(5e-5, "Peak AdamW learning rate: 5e-5 fine-tunes a "
                                   "pretrained encoder (a small one such as all-MiniLM-L6-v2 "
                                   "on a few hundred texts learns faster at 1e-4); a model "
                                   "trained from scratch needs about 1e-3.", gt=0)
    weight_decay: float = setting(0.01, "AdamW weight decay.", ge=0)
    warmup_ratio: float = setting(0.1, "Share of the steps the rate warms up over, linearly from"
                                  " 0; it then decays linearly to 0.", ge=0, lt=1)
    max_length: int = setting(256, "Tokens of each text the model reads (longer texts are cut).",
                              ge=1)
    threshold: float = setting(0.5, "Multi-label decision threshold on each label's probability.",
                               gt=0, lt=1)
    monitor: str = setting("loss", "What picks the best epoch and stops training: loss "
                           "(validation loss), micro_f1 or macro_f1.", choices=MONITORS)
    early_stopping_patience: int = setting(2, "Epochs without improvement of the monitored value"
                                           " before training stops; 0 never stops early.", ge=0)
    mixed_precision: bool = setting(True, "bf16 on GPUs of compute capability >= 8.0 (A100, L4, "
                                    "H100), fp16 on 7.x (V100, T4); never on CPU.")
    seed: int = setting(42, "Seed of the classification head's initialisation and the batch "
                        "order.")
    checkpoint_every_steps: int = setting(0, preemption.EVERY_STEPS_HELP, ge=0)

    def __post_init__(self) -> None:
        problems = []
        if not self.model_name.strip():
            problems.append("model_name must name a Hub model or a model folder")
        check_settings(self, TransformerTrainingError, *problems)


def model_name_is_path(model_name: str) -> bool:
    """Whether `model_name` names a folder (gs://, s3://, an absolute or ./ path, or one that
    exists here) rather than a Hub model, for the trainer and the preflight alike."""
    name = model_name.strip()
    return (is_remote(name) or os.path.isabs(name) or name.startswith(".")
            or os.path.exists(name))


# A `model_name` folder, as `save_pretrained` writes it with its tokenizer.
BASE_MODEL_FOLDER = FolderKind(
    "a transformer model folder", marks=(MODEL_CONFIG_FILE, *WEIGHTS_FILES),
    required=((MODEL_CONFIG_FILE,), WEIGHTS_FILES, TOKENIZER_FILES),
    made_by="a folder written by model.save_pretrained(folder) and "
            "tokenizer.save_pretrained(folder)")


def model_folder_problem(model_name: str, files: set[str]) -> str:
    """Why a `model_name` folder holding `files` (`folder_files`) is no model the trainer
    loads, for the trainer and the preflight alike; "" when it is one."""
    kind = BASE_MODEL_FOLDER
    missing = kind.missing(files)
    if not missing:
        return ""
    what = f"is not {kind.name}" if files else "is not a folder (or an empty one)"
    held = f" (it holds {', '.join(sorted(files)[:8])})" if files else ""
    return (f"model_name {model_name!r} {what}: it has no {' and no '.join(missing)}; give "
            f"{kind.made_by}, or a Hub model name such as {DEFAULT_MODEL_NAME}{held}")
