"""The ULMFiT text trainer's contract: its settings and the pretrained LM assets it reads
(layout: `components.formats.lm_assets`). Nothing here imports fastai or torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from components.common import preemption
from components.common.storage import filesystem
from components.common.written import check_settings, setting
from components.formats.lm_assets import (
    LM_FILE_HEAD,
    LM_FILE_TAIL,
    LM_FILES,
    LM_METRICS_FILE,
    SPM_FILE,
    SPM_LANGS,
    direction,
    lm_file_problem,
)

# The language of fastai's own pretrained AWD-LSTM (WikiText-103), which a pretrained run
# without lm_assets starts from (assets.fetch_fastai_pretrained).
FASTAI_PRETRAINED_LANG = "en"
# What `monitor` may name: the losses, and the metric of multi- or single-label models.
MONITORS = ("valid_loss", "train_loss", "f1_score", "accuracy_multi", "accuracy")
# How a learnt encoder is unfrozen: ULMFiT's stages, everything at once, or by data size.
UNFREEZE_MODES = ("auto", "gradual", "all")


class TextTrainingError(RuntimeError):
    """Training cannot start as configured; the message says why."""


# Bounds on the rate `lr_find` suggests (learning_rate=0), measured on real text with a
# classifier trained whole: 3e-3..7e-3 learnt on every seed, 1e-2 jumped, 2e-2 collapsed,
# 1e-3 crawled. A head on a frozen encoder takes ULMFiT's higher rates (2e-2).
MIN_FOUND_LR = 3e-3
MAX_FOUND_LR_WHOLE, MAX_FOUND_LR_HEAD = 5e-3, 5e-2
# The AWD-LSTM hidden size the bounds above were measured at (fastai's default n_hid).
BOUNDS_N_HID = 1152
# What learning_rate=0 does (`components.common.fastai_text.choose_rate`), as both fastai
# trainers' help says it with their bounds; keep it choose_rate's.
FOUND_RATE_HELP = ("0 finds it with fastai's lr_find: its valley, held to {bounds}; "
                   "without a valley, the bounds' geometric middle.")


def rate_text(value: float) -> str:
    """A learning rate as the help writes it: 0.003 -> "3e-3", 0.0025 -> "2.5e-3"."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


# schedule.found_rate_bounds: the head's window, or a whole model's scaled by width.
_LOW, _HEAD = rate_text(MIN_FOUND_LR), rate_text(MAX_FOUND_LR_HEAD)
LEARNING_RATE_HELP = (
    "Peak learning rate of the classifier's first stage (with gradual unfreezing, later "
    "stages use 1/2, 1/4, then 1/20 of it); " + FOUND_RATE_HELP.format(
        bounds=f"{_LOW}..{_HEAD} when gradual unfreezing trains the head first, else "
               f"{_LOW}..{rate_text(MAX_FOUND_LR_WHOLE)} times {BOUNDS_N_HID}/n_hid, capped "
               f"at {_HEAD}"))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run: each field's help is the training step's input help (the
    console's), where a step input gives model_config as JSON text."""

    lang: str = setting("en", "Language of the texts (en, fr, de, ...; ja, ko and zh use "
                        "SentencePiece); picks the tokenizer and the assets folder.")
    pretrained: bool = setting(True, "Start from a pretrained LM: the one in lm_assets_uri "
                               "(missing files are an error that lists them), or with lang=en "
                               "and no lm_assets_uri fastai's WikiText-103 AWD-LSTM, "
                               "downloaded as fastai does (stage a copy with python -m "
                               "pipelines.stage_wt103 for jobs without internet); false trains"
                               " from scratch.")
    backwards: bool = setting(False, "Read texts backwards (use the backward LM).")
    lm_epochs: int = setting(4, "Language model fine-tuning epochs on the dataset's texts; 0 "
                             "skips it.", ge=0)
    # 12 epochs, best F1 kept: a learnt encoder peaks early, a random one late
    # (docs/measurements.md).
    epochs: int = setting(12, "Classifier epochs (see unfreeze).", ge=1)
    batch_size: int = setting(16, "Texts per batch (language model and classifier).", ge=1)
    drop_mult: float = setting(0.3, "Multiplier of every AWD-LSTM dropout.", ge=0)
    threshold: float = setting(0.3, "Multi-label decision threshold on each label's probability.",
                               gt=0, lt=1)
    monitor: str = setting("f1_score", "Metric whose best epoch is kept: valid_loss, f1_score "
                           "(macro F1), accuracy_multi (multi-label) or accuracy "
                           "(single-label).", choices=MONITORS)
    unfreeze: str = setting("auto", "How a pretrained or LM-fine-tuned encoder is unfrozen: "
                            '"gradual" (ULMFiT: head, top 2 groups, top 3, then everything, '
                            'one epoch each, discriminative rates), "all" (everything from the'
                            ' first epoch at one rate), or "auto": gradual when an epoch has '
                            "at least 50 batches, else all (on small data gradual stages are "
                            "too short to learn). A random encoder always trains everything at"
                            " once.", choices=UNFREEZE_MODES)
    learning_rate: float = setting(0.0, LEARNING_RATE_HELP, ge=0)  # 0: found by lr_find
    lm_learning_rate: float = setting(2e-3, "Peak learning rate of the unfrozen language model "
                                      "epochs (its frozen first epoch uses 10x).", gt=0)
    seq_len: int = setting(72, "Tokens per backpropagation-through-time step.", ge=1)
    min_freq: int = setting(3, "Tokens seen fewer times in the training texts become xxunk.", ge=1)
    max_vocab: int = setting(60000, "Largest vocabulary kept.", ge=1)
    mixed_precision: bool = setting(True, "Train in mixed precision on a GPU: bf16 on compute "
                                    "capability 8.0 or more (A100, L4, H100), fp16 on 7.x "
                                    "(V100, T4); never on CPU.")
    model_config: dict[str, Any] = setting({}, "JSON object of AWD_LSTM settings (e.g. "
                                           '{"emb_sz": 400, "n_hid": 1152, "n_layers": 3}) '
                                           "when training from scratch; empty for fastai's "
                                           "defaults.")
    seed: int = setting(42, "Seed of weights initialisation and batch order.")
    checkpoint_every_steps: int = setting(0, preemption.EVERY_STEPS_HELP, ge=0)

    def __post_init__(self) -> None:
        scratch_only = (["model_config applies to training from scratch; a pretrained LM's "
                         "settings come from its config.json: leave model_config empty"]
                        if self.pretrained and self.model_config else [])
        check_settings(self, TextTrainingError, *scratch_only)


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


def _is_kind(value: Any, kind: type) -> bool:
    """Whether a JSON value is a `kind` (bool, int or float), as AWD_LSTM uses it."""
    if kind is bool or isinstance(value, bool):  # JSON true is not the number 1
        return kind is bool and isinstance(value, bool)
    if kind is int:  # 400.0 is no layer size torch takes
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


_KIND_NAMES = {bool: "true or false", int: "a whole number", float: "a finite number"}


def model_config_problems(config: Mapping[str, Any], defaults: Mapping[str, Any],
                          source: str = "model_config") -> list[str]:
    """What AWD_LSTM would refuse in its settings, late, on the GPU (both fastai trainers
    and the preflight check with this).

    Args:
        config: The settings (a parsed model_config, or a pretrained LM's config.json).
        defaults: fastai's `awd_lstm_lm_config`: the keys, each value's type its default's.
        source: Where the settings come from, as the messages name it.

    Returns:
        One message per unknown key or value of another type; empty when fine.
    """
    problems = []
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        problems.append(f"{source}: unknown AWD_LSTM setting(s) {unknown}; known: "
                        f"{sorted(defaults)}")
    for key, value in config.items():
        kind = next((k for k in _KIND_NAMES if isinstance(defaults.get(key), k)), None)
        if kind is not None and not _is_kind(value, kind):
            problems.append(f"{source}: {key} must be {_KIND_NAMES[kind]} like the default "
                            f"{defaults[key]!r}, got {value!r}")
    return problems


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
    """Full URIs of a language and direction's files that are absent, or followed by why
    they cannot be what their name says (`lm_file_problem`)."""
    fs, root = filesystem(assets_uri)
    found = []
    for rel in required_files(lang, backwards):
        path = asset_uri(root, rel)
        if not fs.isfile(path):
            found.append(asset_uri(assets_uri, rel))
            continue
        size = fs.size(path)
        with fs.open(path, "rb") as f:
            head = f.read(LM_FILE_HEAD)
            f.seek(max(0, size - LM_FILE_TAIL))
            tail = f.read()
        problem = lm_file_problem(rel, head, tail)
        if problem:
            found.append(f"{asset_uri(assets_uri, rel)} ({problem})")
    return found


def unlearnt_lm(assets_uri: str, lang: str, backwards: bool) -> str | None:
    """Why the LM a run would take from `assets_uri` learnt nothing (its `lm_metrics.json`
    says `beats_unigram` false for the run's direction), or None; assets without that file,
    or with one of another language, unmeasured or unreadable, are not judged.

    Args:
        assets_uri: Root of the assets layout, a local path or gs:// URI.
        lang: The run's language.
        backwards: Whether the run takes the backward model.

    Returns:
        The refusal, naming the file, both perplexities and what to do; or None.
    """
    fs, root = filesystem(assets_uri)
    path = asset_uri(root, LM_METRICS_FILE)
    try:
        if not fs.isfile(path):
            return None
        metrics = json.loads(fs.cat_file(path))
    except (OSError, ValueError):  # unreadable, or not JSON: not the LM step's report
        return None
    if not isinstance(metrics, dict) or str(metrics.get("lang", lang)) != lang.strip():
        return None
    entry = (metrics.get("directions") or {}).get(direction(backwards))
    if not isinstance(entry, dict) or entry.get("beats_unigram") is not False:
        return None

    def shown(value: Any) -> str:
        return f"{value:.2f}" if isinstance(value, (int, float)) else str(value)

    unigram = entry.get("unigram") or {}
    return (f"{asset_uri(assets_uri, LM_METRICS_FILE)} says its {direction(backwards)} "
            f"language model (lang={lang!r}) is no better than a unigram model of its "
            f"training tokens: held-out perplexity {shown(entry.get('perplexity'))} vs the "
            f"unigram's {shown(unigram.get('perplexity'))}, so its encoder would bring the "
            "classifier nothing. Train the language model longer or on more text (the LM "
            "pipeline's epochs or learning_rate, a larger corpus) until it beats the unigram "
            "model, or pass other lm_assets (or pretrained=false to train from scratch)")
