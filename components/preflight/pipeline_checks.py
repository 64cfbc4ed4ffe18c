"""The per-pipeline checks (`CHECKS`): each later step's own rules, run on the pipeline's
parameters, plus the few only the pipeline knows (it evaluates the test split)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from components.common.input_kinds import InputKindError, folder_files, read_json_object
from components.common.storage import filesystem
from components.preflight.parameters import (
    PreflightError,
    build,
    typed_parameter,
)
from components.train_text.contract import model_config_problems, parse_model_config


def _evaluation_problems(parameters: Mapping[str, Any], kind: str) -> list[str]:
    """What the evaluation step and the registration gate refuse in their settings (their
    own rules), and a text pipeline evaluating a test split its preparation leaves empty."""
    from components.evaluate_image.contract import settings_problems as image_problems
    from components.evaluate_text.contract import settings_problems as text_problems
    from components.register.contract import (
        IMAGE_REGISTRATION_METRICS,
        TEXT_REGISTRATION_METRICS,
        gate_problems,
    )

    # an absent parameter (a partial run's) is given a value those rules take
    batch_size = typed_parameter(parameters, "eval_batch_size", int, 1)
    split = str(parameters.get("eval_split", "test"))
    if kind == "image":
        problems, metrics = image_problems(batch_size, "eval_"), IMAGE_REGISTRATION_METRICS
    else:
        problems, metrics = text_problems(split, batch_size, "eval_"), TEXT_REGISTRATION_METRICS
        if split == "test" and "test_fraction" in parameters \
                and not typed_parameter(parameters, "test_fraction") > 0:
            problems.append("test_fraction must be > 0 when eval_split is test (the pipeline "
                            "evaluates on the test split)")
    threshold = typed_parameter(parameters, "registration_threshold", float, 0.0)
    return problems + gate_problems(str(parameters.get("registration_metric", metrics[0])),
                                    threshold, metrics)


def lang_problems(lang: str) -> list[str]:
    """Why the text trainers cannot tokenize `lang` (`lm_assets.check_language`); empty."""
    from components.formats.lm_assets import SPM_LANGS, TokenizerError, check_language

    try:
        check_language(lang)
    except TokenizerError as err:
        if lang in SPM_LANGS:  # the message says which package the image lacks
            return [f"lang: {err}"]
        return [f"lang: {err}; give a language code spaCy has a tokenizer for (e.g. en, "
                f"fr, de, or xx for several languages), or one of {sorted(SPM_LANGS)}"]
    return []


def _fastai_problems(config_class: type, parameters: Mapping[str, Any]):
    """What a fastai text trainer refuses (its config, AWD_LSTM's model_config, the
    language), with the parsed model_config and the config (None where refused)."""
    problems, model_config, config = [], {}, None
    try:
        model_config = parse_model_config(str(parameters.get("model_config", "")))
        config = build(config_class, parameters, model_config=model_config)
    except (PreflightError, RuntimeError) as err:  # RuntimeError: model_config not an object
        problems.append(f"training: {err}")
    if model_config:
        from fastai.text.models.awdlstm import awd_lstm_lm_config  # what both trainers build from

        problems += model_config_problems(model_config, awd_lstm_lm_config)
    problems += lang_problems(str(parameters.get("lang", config_class.lang)))
    return problems, model_config, config


def _refusing(problems_of: Callable[[Mapping[str, Any]], list[str]]):
    """The check that raises PreflightError with every problem `problems_of` finds, each
    naming its parameter."""

    @functools.wraps(problems_of)
    def check(parameters: Mapping[str, Any]) -> None:
        if problems := problems_of(parameters):
            raise PreflightError("; ".join(problems))

    return check


def _step_problems(*checks: tuple[str, Callable[[], Any]]) -> list[str]:
    """What each (step, check) pair's check refuses, as "<step>: <error>"."""
    problems = []
    for name, check in checks:
        try:
            check()
        except PreflightError as err:
            problems.append(f"{name}: {err}")
    return problems


@_refusing
def check_image_run(parameters: Mapping[str, Any]) -> list[str]:
    """Refuses image pipeline parameters the sharding, training or evaluation would refuse."""
    from components.shard.contract import ShardConfig
    from components.train_image.contract import TrainConfig, weights_problem

    def training():
        steps = typed_parameter(parameters, "steps_per_epoch", int, 0)
        return build(TrainConfig, parameters, steps_per_epoch=steps or None)

    problems = _step_problems(
        ("sharding", lambda: build(ShardConfig, parameters, {"num_workers": "shard_workers"})),
        ("training", training))
    for name in ("train_fraction", "test_fraction"):
        if name in parameters and not typed_parameter(parameters, name) > 0:
            problems.append(f"{name} must be > 0: the pipeline trains on the train split and "
                            "evaluates on the test split")
    problems.append(weights_problem(str(parameters.get("weights", TrainConfig.weights)),
                                    str(parameters.get("architecture", TrainConfig.architecture))))
    return list(filter(None, problems)) + _evaluation_problems(parameters, "image")


@_refusing
def check_text_run(parameters: Mapping[str, Any]) -> list[str]:
    """Refuses text pipeline parameters the preparation, training or evaluation would
    refuse, and pretrained LM files missing or no better than a unigram model."""
    from components.prepare_text.contract import PrepareConfig
    from components.train_text.contract import (
        FASTAI_PRETRAINED_LANG,
        TrainConfig,
        missing_files,
        unlearnt_lm,
    )

    problems = _step_problems(
        ("preparation", lambda: build(PrepareConfig, parameters, label_columns=())))
    trained, model_config, config = _fastai_problems(TrainConfig, parameters)
    problems += trained
    try:
        pretrained = typed_parameter(parameters, "pretrained", bool, TrainConfig.pretrained)
    except PreflightError:  # the training check says so ("training: pretrained: ...")
        pretrained = False
    if pretrained:
        root = str(parameters.get("lm_assets", ""))
        lang = str(parameters.get("lang", config.lang if config else ""))
        if not root and lang.strip() != FASTAI_PRETRAINED_LANG:  # else fastai's WikiText-103
            problems.append("pretrained is true but lm_assets is empty: give the folder of "
                            "the pretrained language models (only lang="
                            f"{FASTAI_PRETRAINED_LANG!r} starts from fastai's model without "
                            "one), or set pretrained to false to train from scratch")
        elif root:
            backwards = typed_parameter(parameters, "backwards", bool, TrainConfig.backwards)
            missing = missing_files(root, lang, backwards)
            if missing:
                problems.append(f"lm_assets {root!r} lacks {missing} for lang={lang!r}")
            unlearnt = unlearnt_lm(root, lang, backwards)  # as the trainer checks them
            if unlearnt:
                problems.append(f"lm_assets refused: {unlearnt}")
    return problems + _evaluation_problems(parameters, "text")


# A Hub model id (huggingface_hub's REPO_ID_REGEX; it also refuses "--", ".." and > 96 chars).
_HUB_MODEL_NAME = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
_HUB_NAME_MAX_CHARS = 96


def model_name_problems(model_name: str, max_length: int | None = None) -> list[str]:
    """What the transformer trainer would refuse in `model_name`, late, on the GPU: a folder
    without what `save_pretrained` writes or too short for `max_length`, or a Hub name not
    like `[organisation/]name` (not looked up).

    Args:
        model_name: The pipeline's model_name.
        max_length: The pipeline's max_length (None: not checked).

    Returns:
        Messages naming `model_name` (or `max_length`) and what to give; empty when fine.
    """
    from components.train_transformer.contract import (
        BASE_MODEL_FOLDER,
        DEFAULT_MODEL_NAME,
        model_folder_problem,
        model_name_is_path,
    )

    name = model_name.strip()
    if not name:
        return []
    if model_name_is_path(name):
        files = folder_files(name)
        problem = model_folder_problem(model_name, files)
        return [problem] if problem else _max_length_problems(name, files, max_length)
    if not _HUB_MODEL_NAME.match(name) or "--" in name or ".." in name \
            or len(name) > _HUB_NAME_MAX_CHARS:
        return [f"model_name {model_name!r} is neither an existing folder (gs:// or local "
                "path) nor a Hub model name ([organisation/]name: letters, digits, '_', '-', "
                f"'.', no spaces); give {BASE_MODEL_FOLDER.made_by}, or a Hub model name "
                f"such as {DEFAULT_MODEL_NAME}"]
    return []


def _max_length_problems(folder: str, files: set[str], max_length: int | None) -> list[str]:
    """`max_length` held to the model folder's config.json and tokenizer_config.json."""
    from components.text_common.contract import (
        MODEL_CONFIG_FILE,
        TOKENIZER_CONFIG_FILE,
        field_problems,
        max_length_problem,
    )

    if max_length is None:
        return []
    read = {}
    for name in (MODEL_CONFIG_FILE, TOKENIZER_CONFIG_FILE):
        if name in files:
            fs, path = filesystem(f"{folder.rstrip('/')}/{name}")
            try:
                read[name] = read_json_object(fs.cat_file(path), f"model_name {folder!r}: {name}",
                                              "write the folder again with save_pretrained")
            except InputKindError as err:
                return [str(err)]
    problems = [p for name, values in read.items() for p in field_problems(name, values, folder)]
    if problems:
        return problems
    problem = max_length_problem(max_length, read.get(MODEL_CONFIG_FILE, {}),
                                 read.get(TOKENIZER_CONFIG_FILE, {}).get("model_max_length"),
                                 folder)
    return [problem] if problem else []


@_refusing
def check_transformer_run(parameters: Mapping[str, Any]) -> list[str]:
    """Refuses transformer pipeline parameters a later step would refuse, and a
    model_name folder without a model in it."""
    from components.prepare_text.contract import PrepareConfig
    from components.train_transformer.contract import DEFAULT_MODEL_NAME, TransformerConfig

    problems = _step_problems(
        ("preparation", lambda: build(PrepareConfig, parameters, label_columns=())),
        ("training", lambda: build(TransformerConfig, parameters)))
    try:
        max_length = typed_parameter(parameters, "max_length", int, TransformerConfig.max_length)
    except PreflightError:  # the training check says so
        max_length = None
    problems += model_name_problems(str(parameters.get("model_name", DEFAULT_MODEL_NAME)),
                                    max_length)
    return problems + _evaluation_problems(parameters, "text")


@_refusing
def check_lm_run(parameters: Mapping[str, Any]) -> list[str]:
    """Refuses language model pipeline parameters the training step would refuse."""
    from components.train_lm.contract import LMConfig

    return _fastai_problems(LMConfig, parameters)[0]


CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "image": check_image_run, "text": check_text_run, "lm": check_lm_run,
    "transformer": check_transformer_run}
