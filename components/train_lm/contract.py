"""The language model step's contract: its settings, and its folder (the text trainer's LM
assets layout and `lm_metrics.json`). Nothing here imports fastai or torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from components.common import preemption
from components.common.storage import filesystem
from components.common.written import check_settings, setting
from components.formats.lm_assets import LM_METRICS_FILE
from components.train_text.contract import FOUND_RATE_HELP, rate_text

METRICS_FILE = LM_METRICS_FILE
# Where the texts of a corpus come from: a CSV column, or .txt files (one or a folder).
TEXT_SUFFIX = ".txt"
CSV_SUFFIX = ".csv"


class LMTrainingError(RuntimeError):
    """The language model cannot be trained as configured; the message says why."""


# Bounds on the rate lr_find suggests (learning_rate=0; its valley, `choose_rate`). On the
# standard library's docstrings (230k tokens, a small AWD-LSTM) valley said 5.8e-4, while a
# fixed 1e-2 reached perplexity 102 in 3 epochs, hence the fixed default and a floor of 1e-3
# (below it an LM from scratch stays at the unigram level for its few epochs); lr_find is
# there for corpora unlike that one.
MIN_FOUND_LR, MAX_FOUND_LR = 1e-3, 3e-2
LEARNING_RATE_HELP = "Peak learning rate; " + FOUND_RATE_HELP.format(
    bounds=f"{rate_text(MIN_FOUND_LR)}..{rate_text(MAX_FOUND_LR)}")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Settings of one language model run: each field's help is the step's input help (the
    console's), where a step input gives model_config as JSON text."""

    lang: str = setting("en", "Language of the corpus (en, fr, de, ...; ja, ko and zh are cut "
                        "with a SentencePiece model trained here); names the assets folder, "
                        "which the text pipeline's lang must match.")
    text_column: str = setting("text", "Column of the texts when the corpus is a CSV file.")
    backwards: bool = setting(False, "Also train a backward model (texts read right to left), "
                              "for the text pipeline's backwards=true (a backward classifier, "
                              "or half of a bidirectional ensemble).")
    epochs: int = setting(10, "Epochs of each direction's one-cycle schedule.", ge=1)
    batch_size: int = setting(64, "Token streams per batch.", ge=1)
    seq_len: int = setting(72, "Tokens per backpropagation-through-time step.", ge=1)
    learning_rate: float = setting(1e-2, LEARNING_RATE_HELP, ge=0)  # 0: found by lr_find
    drop_mult: float = setting(0.3, "Multiplier of every AWD-LSTM dropout.", ge=0)
    min_freq: int = setting(3, "Tokens seen fewer times become xxunk.", ge=1)
    max_vocab: int = setting(60000, "Largest vocabulary kept.", ge=1)
    spm_vocab_size: int = setting(0, "SentencePiece vocabulary size for ja, ko and zh; 0 lets "
                                  "fastai choose from the corpus.", ge=0)
    validation_fraction: float = setting(0.1, "Share of the documents held out to measure "
                                         "perplexity and accuracy.", gt=0, lt=1)
    mixed_precision: bool = setting(True, "Train in mixed precision on a GPU: bf16 on compute "
                                    "capability 8.0 or more (A100, L4, H100), fp16 on 7.x "
                                    "(V100, T4); never on CPU.")
    model_config: dict[str, Any] = setting({}, "JSON object of AWD_LSTM settings (e.g. "
                                           '{"emb_sz": 400, "n_hid": 1152, "n_layers": 3}); '
                                           "empty for fastai's defaults. Written to "
                                           "config.json, so the text pipeline builds the same "
                                           "encoder.")
    seed: int = setting(42, "Seed of the held-out draw, initialisation and batch order.")
    checkpoint_every_steps: int = setting(0, preemption.EVERY_STEPS_HELP, ge=0)

    def __post_init__(self) -> None:
        problems = []
        if not self.lang.strip() or "/" in self.lang:
            problems.append(f"lang must be a language code such as en or ja, got {self.lang!r}")
        if not self.text_column.strip():
            problems.append("text_column must name the CSV column of the texts")
        check_settings(self, LMTrainingError, *problems)

    def directions(self) -> list[bool]:
        """`backwards` flags of the models to train: forward, then backward on request."""
        return [False, True] if self.backwards else [False]


def corpus_files(uri: str) -> tuple[str, list[str], list[str]]:
    """What the corpus at `uri` is, as the step reads it (and the preflight checks it):
    `("txt" or "csv", the files read, the other files of a folder, which are skipped)`.

    Raises:
        LMTrainingError: Nothing at `uri`, a folder without .txt files (at any depth), or
            neither a folder, a .txt file nor a .csv file.
    """
    fs, path = filesystem(uri)
    if not fs.exists(path):
        raise LMTrainingError(f"corpus {uri!r} does not exist")
    if fs.isdir(path):
        found = sorted(fs.find(path))
        files = [f for f in found if f.endswith(TEXT_SUFFIX)]
        if not files:
            raise LMTrainingError(
                f"corpus folder {uri!r} holds no {TEXT_SUFFIX} files ({len(found)} other files); "
                f"give a folder of UTF-8 {TEXT_SUFFIX} files, or a CSV file and text_column")
        return "txt", files, [f for f in found if not f.endswith(TEXT_SUFFIX)]
    if path.endswith(CSV_SUFFIX) or path.endswith(TEXT_SUFFIX):
        return ("csv" if path.endswith(CSV_SUFFIX) else "txt"), [path], []
    raise LMTrainingError(f"corpus {uri!r} is neither a folder, a {TEXT_SUFFIX} file nor a "
                          f"{CSV_SUFFIX} file")


def check_mostly_text(uri: str, not_text: list[str], read: int, files: int) -> None:
    """The step's rule for a corpus of .txt files: those that are not text are skipped, but
    not most of them. `not_text` says why for each such file among the first `read` of the
    corpus's `files` (the step reads them all, the preflight the first few).

    Raises:
        LMTrainingError: More than half of the files read are not text, naming the first.
    """
    if len(not_text) * 2 <= read:
        return
    if files == 1:
        raise LMTrainingError(f"corpus {uri!r}: {not_text[0]}")
    first = f"the first {read} of " if read < files else ""
    raise LMTrainingError(f"corpus {uri!r}: {len(not_text)} of {first}its {files} {TEXT_SUFFIX} "
                          f"files are not text, e.g. {not_text[0]}; a language model of them "
                          "would model something else")


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
