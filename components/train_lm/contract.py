"""The language model step's contract: its settings and the folder it writes.

Output folder: the pretrained LM assets in the layout the text trainer reads
(`<lang>/{forward,backward}/{config.json,vocab.pkl,weights.pth}`, `<lang>/spm/spm.model`
for ja, ko, zh; see components/train_text/contract.py) and `lm_metrics.json` (the corpus
read, perplexity and accuracy per direction, timings). Nothing here imports fastai or torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from components.formats.lm_assets import LM_METRICS_FILE

METRICS_FILE = LM_METRICS_FILE
# Where the texts of a corpus come from: a CSV column, or .txt files (one or a folder).
TEXT_SUFFIX = ".txt"
CSV_SUFFIX = ".csv"


class LMTrainingError(RuntimeError):
    """The language model cannot be trained as configured; the message says why."""


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Settings of one language model run (see the component for each one's meaning)."""

    lang: str = "en"
    text_column: str = "text"
    backwards: bool = False
    epochs: int = 10
    batch_size: int = 64
    seq_len: int = 72
    learning_rate: float = 1e-2  # 0: found by lr_find
    drop_mult: float = 0.3
    min_freq: int = 3
    max_vocab: int = 60000
    spm_vocab_size: int = 0  # 0: fastai's choice from the corpus
    validation_fraction: float = 0.1
    mixed_precision: bool = True
    model_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 42

    def __post_init__(self) -> None:
        problems = []
        if not self.lang.strip() or "/" in self.lang:
            problems.append(f"lang must be a language code such as en or ja, got {self.lang!r}")
        if not self.text_column.strip():
            problems.append("text_column must name the CSV column of the texts")
        for name in ("epochs", "batch_size", "seq_len", "min_freq", "max_vocab"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.spm_vocab_size < 0:
            problems.append(f"spm_vocab_size must be >= 0 (0: chosen from the corpus), got "
                            f"{self.spm_vocab_size}")
        if not self.learning_rate >= 0:  # also refuses NaN
            problems.append(f"learning_rate must be > 0, or 0 to find it with lr_find; "
                            f"got {self.learning_rate}")
        if not self.drop_mult >= 0:
            problems.append(f"drop_mult must be >= 0, got {self.drop_mult}")
        if not 0 < self.validation_fraction < 1:
            problems.append(f"validation_fraction must be in (0, 1) (perplexity is measured on "
                            f"held-out texts), got {self.validation_fraction}")
        if problems:
            raise LMTrainingError("; ".join(problems))

    def directions(self) -> list[bool]:
        """`backwards` flags of the models to train: forward, then backward on request."""
        return [False, True] if self.backwards else [False]


def console_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The step's console scalars from its lm_metrics.json content: per direction (the
    backward ones prefixed `backward_`) perplexity, accuracy and valid_loss, the unigram
    model's (`unigram_perplexity`, ...), `beats_unigram` (1 or 0) and the mean
    `epoch_seconds`; then `train_tokens` and `vocab_size`. Missing values are left out."""
    scalars: dict[str, float] = {}
    for name, run in result["directions"].items():
        prefix = "" if name == "forward" else f"{name}_"
        for key in ("perplexity", "accuracy", "valid_loss"):
            for field, source in ((key, run), (f"unigram_{key}", run.get("unigram") or {})):
                if source.get(key) is not None:
                    scalars[prefix + field] = float(source[key])
        if run.get("beats_unigram") is not None:
            scalars[prefix + "beats_unigram"] = float(run["beats_unigram"])
        if run.get("epoch_seconds"):
            scalars[prefix + "epoch_seconds"] = sum(run["epoch_seconds"]) / len(
                run["epoch_seconds"])
    scalars["train_tokens"] = float(result["tokens"]["train"])
    scalars["vocab_size"] = float(result["vocab_size"])
    return scalars
