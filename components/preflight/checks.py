"""What the pipelines check before their first paid job, and the data fingerprint.

Every rule is the later step's own (its config class raises on bad values; the text
trainers' tokenizer and fastai's AWD_LSTM settings; the image trainer's weights; the
transformer trainer's model folder), run here
on the pipeline's parameters, plus the few rules that only the pipeline knows (it evaluates
the test split, so the test split must not be empty). The data fingerprint lists the
input (names, sizes and versions, no contents) so a changed bucket changes the cache
key of the steps that read it.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
import typing
from collections.abc import Callable, Mapping
from typing import Any

from components.common.storage import filesystem
from components.track.contract import TrackingError, check_tracking_uri


class PreflightError(ValueError):
    """The run would fail later; the message names each parameter and what to do."""


def coerce(value: Any, annotation: Any) -> Any:
    """A parameter value as the config field's type wants it.

    Pipeline parameters reach this step inside a dict, where Vertex writes every value
    as text ("32", "0.5", "true") and kfp.local writes whole numbers as "32.0".
    """
    if annotation is bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false"):
                raise PreflightError(f"expected true or false, got {value!r}")
            return value.lower() == "true"
        return bool(value)
    if annotation is int:
        number = float(value)
        if not number.is_integer():
            raise PreflightError(f"expected a whole number, got {value!r}")
        return int(number)
    if annotation is float:
        try:
            number = float(value)
        except (TypeError, ValueError) as err:
            raise PreflightError(f"expected a number, got {value!r}") from err
        if not math.isfinite(number):  # NaN or inf slips through every range check
            raise PreflightError(f"expected a finite number, got {value!r}")
        return number
    return value if value is None else str(value)


def build(config_class: type, parameters: Mapping[str, Any], renames: Mapping[str, str] = (),
          **overrides: Any) -> Any:
    """Constructs `config_class` from the pipeline parameters its fields name.

    Args:
        config_class: A dataclass whose `__post_init__` validates.
        parameters: Pipeline parameters by name (text or typed values).
        renames: Field name -> pipeline parameter name, where they differ.
        **overrides: Field values given directly (already typed).

    Raises:
        PreflightError: A value of the wrong type, or what the config refuses.
    """
    renames = dict(renames)
    hints = typing.get_type_hints(config_class)
    values = dict(overrides)
    for field in dataclasses.fields(config_class):
        source = renames.get(field.name, field.name)
        if field.name in values or source not in parameters:
            continue
        annotation = hints[field.name]
        base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        try:
            values[field.name] = coerce(parameters[source], base)
        except (PreflightError, ValueError) as err:
            raise PreflightError(f"{source}: {err}") from err
    try:
        return config_class(**values)
    except ValueError as err:
        raise PreflightError(str(err)) from err
    except RuntimeError as err:  # the trainers' own error types
        raise PreflightError(str(err)) from err


def _number(parameters: Mapping[str, Any], name: str) -> float:
    try:
        return float(parameters[name])
    except ValueError as err:
        raise PreflightError(f"{name}: expected a number, got {parameters[name]!r}") from err


def _steps(parameters: Mapping[str, Any]) -> int:
    try:
        return coerce(parameters.get("steps_per_epoch", 0), int)
    except (PreflightError, ValueError) as err:
        raise PreflightError(f"steps_per_epoch: {err}") from err


# Evaluation metrics a pipeline's registration gate may compare with its threshold (every
# one is in metrics.json for every task the pipeline trains); the first is the default.
IMAGE_REGISTRATION_METRICS = ("accuracy", "macro_f1")
TEXT_REGISTRATION_METRICS = ("micro_f1", "macro_f1")


def _registration_problems(parameters: Mapping[str, Any], metrics: tuple[str, ...]) -> list[str]:
    problems = []
    if parameters.get("registration_metric", metrics[0]) not in metrics:
        problems.append(f"registration_metric must be one of {list(metrics)}, got "
                        f"{parameters['registration_metric']!r}")
    if "registration_threshold" in parameters and \
            not 0 <= _number(parameters, "registration_threshold") <= 1:
        problems.append("registration_threshold must be in [0, 1], got "
                        f"{parameters['registration_threshold']}")
    return problems


def weights_problems(weights: str) -> list[str]:
    """What the image trainer would refuse in `weights`, late, after sharding.

    Args:
        weights: "imagenet", "none"/"" (from scratch), or a DenseNet121 no-top weights
            file, local or gs:// (gs:// files are not looked up: the trainer reads them
            with its own service account).

    Returns:
        A message naming `weights` and what to give when a local file is not there (the
        trainer takes any other value for a path); empty when fine.
    """
    from components.train_image.contract import normalize_weights

    value = normalize_weights(weights)
    if value is None or value == "imagenet" or value.startswith("gs://") or os.path.isfile(value):
        return []
    return [f"weights {weights!r} is neither 'imagenet', 'none' nor an existing file: give "
            "'imagenet' (DenseNet121's ImageNet weights, downloaded), 'none' (train from "
            "scratch) or the path of a DenseNet121 no-top .h5 weights file (local or gs://)"]


def _is_kind(value: Any, kind: type) -> bool:
    """Whether a JSON value is a `kind` (bool, int or float), as AWD_LSTM uses it."""
    if kind is bool or isinstance(value, bool):  # JSON true is not the number 1
        return kind is bool and isinstance(value, bool)
    if kind is int:  # 400.0 is no layer size torch takes
        return isinstance(value, int)
    return isinstance(value, (int, float)) and math.isfinite(value)


_KIND_NAMES = {bool: "true or false", int: "a whole number", float: "a finite number"}


def model_config_problems(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """What AWD_LSTM would refuse in `model_config`, late, on the GPU.

    Args:
        config: The parsed model_config.
        defaults: fastai's AWD_LSTM settings (`awd_lstm_lm_config`): the known keys,
            each value's type taken from its default.

    Returns:
        One message per problem (an unknown key, a value of another type than the
        default's, a non-finite number); empty when fine.
    """
    problems = []
    unknown = sorted(set(config) - set(defaults))
    if unknown:  # the trainers' own wording
        problems.append(f"model_config: unknown AWD_LSTM setting(s) {unknown}; known: "
                        f"{sorted(defaults)}")
    for key, value in config.items():
        kind = next((k for k in _KIND_NAMES if isinstance(defaults.get(key), k)), None)
        if kind is not None and not _is_kind(value, kind):
            problems.append(f"model_config: {key} must be {_KIND_NAMES[kind]} like the default "
                            f"{defaults[key]!r}, got {value!r}")
    return problems


def _awd_lstm_problems(config: Mapping[str, Any]) -> list[str]:
    if not config:
        return []
    from fastai.text.models.awdlstm import awd_lstm_lm_config  # what both trainers build from

    return model_config_problems(config, awd_lstm_lm_config)


def lang_problems(lang: str) -> list[str]:
    """Whether the text trainers can tokenize `lang`: builds their tokenizer for it.

    Returns:
        A message naming `lang` and what to give when it cannot; empty when it can.
    """
    from components.formats.lm_assets import make_tokenizer
    from components.train_text.contract import SPM_LANGS, TextTrainingError

    with tempfile.TemporaryDirectory() as scratch:
        try:
            make_tokenizer(lang, None, scratch)
        except TextTrainingError as err:
            if lang in SPM_LANGS:  # the message says which package the image lacks
                return [f"lang: {err}"]
            return [f"lang: {err}; give a language code spaCy has a tokenizer for (e.g. en, "
                    f"fr, de, or xx for several languages), or one of {sorted(SPM_LANGS)}"]
    return []


def check_image_run(parameters: Mapping[str, Any]) -> None:
    """Refuses image pipeline parameters that the sharding, training or evaluation step
    would refuse after the steps before them ran.

    Raises:
        PreflightError: Every problem found, each naming its parameter.
    """
    from components.shard.contract import ShardConfig
    from components.train_image.contract import TrainConfig

    problems = []
    for name, check in (
        ("sharding", lambda: build(ShardConfig, parameters, {"num_workers": "shard_workers"})),
        ("training", lambda: build(TrainConfig, parameters,
                                   steps_per_epoch=_steps(parameters) or None)),
    ):
        try:
            check()
        except PreflightError as err:
            problems.append(f"{name}: {err}")
    for name in ("train_fraction", "test_fraction"):
        if name in parameters and not _number(parameters, name) > 0:
            problems.append(f"{name} must be > 0: the pipeline trains on the train split and "
                            "evaluates on the test split")
    problems += weights_problems(str(parameters.get("weights", TrainConfig.weights)))
    problems += _registration_problems(parameters, IMAGE_REGISTRATION_METRICS)
    if "eval_batch_size" in parameters and not _number(parameters, "eval_batch_size") >= 1:
        problems.append(f"eval_batch_size must be >= 1, got {parameters['eval_batch_size']}")
    if problems:
        raise PreflightError("; ".join(problems))


def check_text_run(parameters: Mapping[str, Any]) -> None:
    """Refuses text pipeline parameters that the preparation, training or evaluation step
    would refuse after the steps before them ran; checks that the pretrained language
    model files are there when `pretrained` is true.

    Raises:
        PreflightError: Every problem found, each naming its parameter.
    """
    from components.prepare_text.contract import PrepareConfig
    from components.train_text.contract import (
        FASTAI_PRETRAINED_LANG,
        TrainConfig,
        missing_files,
        parse_model_config,
    )

    problems = []
    try:
        build(PrepareConfig, parameters, label_columns=())
    except PreflightError as err:
        problems.append(f"preparation: {err}")
    model_config: dict[str, Any] = {}
    try:
        model_config = parse_model_config(str(parameters.get("model_config", "")))
        config = build(TrainConfig, parameters, model_config=model_config)
    except PreflightError as err:
        problems.append(f"training: {err}")
        config = None
    except RuntimeError as err:  # model_config that is not a JSON object
        problems.append(f"training: {err}")
        config = None
    try:
        pretrained = coerce(parameters.get("pretrained", TrainConfig.pretrained), bool)
    except PreflightError as err:
        problems.append(f"pretrained: {err}")
        pretrained = False
    if pretrained and model_config:  # the trainer's rule
        problems.append("model_config applies to training from scratch; a pretrained LM's "
                        "settings come from its config.json: leave model_config empty")
    problems += _awd_lstm_problems(model_config)
    problems += lang_problems(str(parameters.get("lang", TrainConfig.lang)))
    if pretrained:
        root = str(parameters.get("lm_assets", ""))
        lang = str(parameters.get("lang", config.lang if config else ""))
        if not root and lang.strip() == FASTAI_PRETRAINED_LANG:
            pass  # fastai's English WikiText-103 model, fetched by the training step
        elif not root:
            problems.append("pretrained is true but lm_assets is empty: give the folder of "
                            "the pretrained language models (only lang="
                            f"{FASTAI_PRETRAINED_LANG!r} starts from fastai's model without "
                            "one), or set pretrained to false to train from scratch")
        else:
            backwards = coerce(parameters.get("backwards", TrainConfig.backwards), bool)
            missing = missing_files(root, lang, backwards)
            if missing:
                problems.append(f"lm_assets {root!r} lacks {missing} for lang={lang!r}")
    problems += _text_evaluation_problems(parameters)
    if problems:
        raise PreflightError("; ".join(problems))


def _text_evaluation_problems(parameters: Mapping[str, Any]) -> list[str]:
    """What the text evaluation and the registration gate would refuse (both text kinds)."""
    problems = []
    if parameters.get("eval_split", "test") not in ("test", "validation", "train"):
        problems.append(f"eval_split must be test, validation or train, got "
                        f"{parameters['eval_split']!r}")
    elif parameters.get("eval_split", "test") == "test" and "test_fraction" in parameters \
            and not _number(parameters, "test_fraction") > 0:
        problems.append("test_fraction must be > 0 when eval_split is test (the pipeline "
                        "evaluates on the test split)")
    if "eval_batch_size" in parameters and not _number(parameters, "eval_batch_size") >= 1:
        problems.append(f"eval_batch_size must be >= 1, got {parameters['eval_batch_size']}")
    return problems + _registration_problems(parameters, TEXT_REGISTRATION_METRICS)


# A Hugging Face Hub model id as `from_pretrained` takes it: [organisation/]name, letters,
# digits, "_", "-" and "." (huggingface_hub's REPO_ID_REGEX; it also refuses "--", ".." and
# ids over 96 characters).
_HUB_MODEL_NAME = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
_HUB_NAME_MAX_CHARS = 96


def model_folder_files(model_dir: str) -> set[str]:
    """Names of the files directly in a model folder (local or gs://); empty when it is not
    a folder."""
    fs, path = filesystem(model_dir)
    fs.invalidate_cache(path)  # gcsfs keeps listings: the folder may have changed since
    if not fs.isdir(path):
        return set()
    return {os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}


def model_name_problems(model_name: str) -> list[str]:
    """What the transformer trainer would refuse in `model_name`, late, on the GPU.

    A folder (gs:// or local) must hold what `save_pretrained` writes: config.json and a
    weights file (`text_common.contract.WEIGHTS_FILES`, or the index of their shards). A Hub name
    must look like `[organisation/]name`; it is not looked up (the training job downloads
    it, with its own network access).

    Args:
        model_name: The pipeline's model_name.

    Returns:
        One message naming `model_name` and what to give; empty when fine (or empty,
        which TransformerConfig refuses).
    """
    from components.text_common.contract import MODEL_CONFIG_FILE, WEIGHTS_FILES, has_weights
    from components.train_transformer.contract import DEFAULT_MODEL_NAME, model_name_is_path

    name = model_name.strip()
    if not name:
        return []
    give = (f"give a folder written by save_pretrained ({MODEL_CONFIG_FILE} and "
            f"{WEIGHTS_FILES[0]}) or a Hub model name such as {DEFAULT_MODEL_NAME}")
    if model_name_is_path(name):
        files = model_folder_files(name)
        if not files:
            return [f"model_name {model_name!r} is not a folder (or an empty one): {give}"]
        missing = [] if MODEL_CONFIG_FILE in files else [MODEL_CONFIG_FILE]
        if not has_weights(files):
            missing.append(" or ".join(WEIGHTS_FILES))
        if missing:
            return [f"model_name {model_name!r} is not a model folder: it has no "
                    f"{' and no '.join(missing)}; {give}"]
        return []
    if not _HUB_MODEL_NAME.match(name) or "--" in name or ".." in name \
            or len(name) > _HUB_NAME_MAX_CHARS:
        return [f"model_name {model_name!r} is neither an existing folder (gs:// or local "
                "path) nor a Hub model name ([organisation/]name: letters, digits, '_', '-', "
                f"'.', no spaces); {give}"]
    return []


def check_transformer_run(parameters: Mapping[str, Any]) -> None:
    """Refuses transformer pipeline parameters that the preparation, training or evaluation
    step would refuse after the steps before them ran, and a model_name folder without a
    model in it.

    Raises:
        PreflightError: Every problem found, each naming its parameter.
    """
    from components.prepare_text.contract import PrepareConfig
    from components.train_transformer.contract import DEFAULT_MODEL_NAME, TransformerConfig

    problems = []
    for name, check in (
        ("preparation", lambda: build(PrepareConfig, parameters, label_columns=())),
        ("training", lambda: build(TransformerConfig, parameters)),
    ):
        try:
            check()
        except PreflightError as err:
            problems.append(f"{name}: {err}")
    problems += model_name_problems(str(parameters.get("model_name", DEFAULT_MODEL_NAME)))
    problems += _text_evaluation_problems(parameters)
    if problems:
        raise PreflightError("; ".join(problems))


def check_lm_run(parameters: Mapping[str, Any]) -> None:
    """Refuses language model pipeline parameters the training step would refuse.

    Raises:
        PreflightError: Every problem found, each naming its parameter.
    """
    from components.train_lm.contract import LMConfig
    from components.train_text.contract import parse_model_config

    problems = []
    model_config: dict[str, Any] = {}
    try:
        model_config = parse_model_config(str(parameters.get("model_config", "")))
        build(LMConfig, parameters, model_config=model_config)
    except (RuntimeError, PreflightError) as err:  # RuntimeError: model_config not a JSON object
        problems.append(f"training: {err}")
    problems += _awd_lstm_problems(model_config)
    problems += lang_problems(str(parameters.get("lang", LMConfig.lang)))
    if problems:
        raise PreflightError("; ".join(problems))


def check_corpus(uri: str, text_column: str) -> None:
    """Refuses a corpus the language model step could not read, from its listing (and a
    CSV's header line): a folder without .txt files, a file of another kind, a CSV
    without the text column.

    Raises:
        PreflightError: The problem, naming the URI and what to give instead.
    """
    from components.train_lm.contract import CSV_SUFFIX, TEXT_SUFFIX

    fs, path = filesystem(uri)
    if not fs.exists(path):
        return  # data_fingerprint says so
    if fs.isdir(path):
        if not any(name.endswith(TEXT_SUFFIX) for name in fs.find(path)):
            raise PreflightError(f"corpus_uri {uri!r} holds no {TEXT_SUFFIX} files; give a "
                                 f"folder of UTF-8 {TEXT_SUFFIX} files or a CSV file")
    elif path.endswith(CSV_SUFFIX):
        with fs.open(path, "rb") as f:
            header = f.readline().decode("utf-8", errors="replace")
        columns = next(csv.reader([header]), [])
        if text_column not in columns:
            raise PreflightError(f"corpus_uri {uri!r} has no column {text_column!r} (header: "
                                 f"{columns}); set text_column")
    elif not path.endswith(TEXT_SUFFIX):
        raise PreflightError(f"corpus_uri {uri!r} is neither a folder, a {TEXT_SUFFIX} nor a "
                             f"{CSV_SUFFIX} file")


CHECKS: dict[str, Callable[[Mapping[str, Any]], None]] = {
    "image": check_image_run, "text": check_text_run, "lm": check_lm_run,
    "transformer": check_transformer_run}


def data_fingerprint(uri: str, parameter: str = "data_uri") -> str:
    """A digest of what sits at `uri` (a file or a folder, local or gs://), read from the
    listing only: each file's relative name, size and version (GCS generation, or the
    local modification time). Any added, removed, replaced or rewritten file changes it.

    Raises:
        PreflightError: Nothing is there.
    """
    fs, path = filesystem(uri)
    if not fs.exists(path):
        raise PreflightError(f"{parameter} {uri!r} does not exist")
    if fs.isdir(path):
        entries = fs.find(path, detail=True)
        # Sharding enters linked folders (`find` does not): so must the fingerprint.
        linked = [p for p, info in entries.items() if info.get("islink") and fs.isdir(p)]
        seen = {os.path.realpath(path)}
        while linked:
            link = linked.pop()
            if os.path.realpath(link) in seen:  # a loop, or a folder listed already
                continue
            seen.add(os.path.realpath(link))
            found = fs.find(link, detail=True)
            entries.update(found)
            linked += [p for p, info in found.items() if info.get("islink") and fs.isdir(p)]
    else:
        entries = {path: fs.info(path)}
    if not entries:
        raise PreflightError(f"{parameter} {uri!r} is an empty folder")
    listing = []
    for name, info in sorted(entries.items()):
        version = info.get("generation") or info.get("mtime") or info.get("updated") \
            or info.get("md5Hash") or info.get("crc32c")
        listing.append([os.path.relpath(name, path) if name != path else os.path.basename(name),
                        info.get("size"), str(version)])
    digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
    return f"sha256:{digest}:{len(listing)}"


def input_fingerprints(kind: str, parameters: Mapping[str, Any]) -> dict[str, str]:
    """Fingerprints of the files a run reads by URI besides its data, one per step input.

    Each goes to the step that reads the files (never cached: a step's cache key holds
    only its inputs' values, so new images under the same `predict_uri`, or weights
    rewritten in place, would otherwise reuse the last run's output). Empty where the run
    reads no such file.

    Args:
        kind: "image", "text" or "transformer".
        parameters: The pipeline's parameters by name.

    Returns:
        image: {"weights_fingerprint", "predict_fingerprint"}; text:
        {"lm_assets_fingerprint", "predict_fingerprint"}; transformer:
        {"model_fingerprint" (of a model_name folder; empty for a Hub name),
        "predict_fingerprint"}.
    """
    from components.train_image.contract import normalize_weights

    def of(name: str, uri: str) -> str:
        return data_fingerprint(uri, name) if uri else ""

    fingerprints = {}
    if kind == "image":
        weights = normalize_weights(str(parameters.get("weights", "imagenet")))
        fingerprints["weights_fingerprint"] = of("weights", "" if weights in (None, "imagenet")
                                                 else weights)
    elif kind == "transformer":
        from components.train_transformer.contract import model_name_is_path

        name = str(parameters.get("model_name", "")).strip()
        fingerprints["model_fingerprint"] = of("model_name",
                                               name if model_name_is_path(name) else "")
    else:
        from components.train_text.contract import TrainConfig

        pretrained = str(parameters.get("pretrained", TrainConfig.pretrained)).lower() == "true"
        fingerprints["lm_assets_fingerprint"] = of(
            "lm_assets", str(parameters.get("lm_assets", "")) if pretrained else "")
    fingerprints["predict_fingerprint"] = of("predict_uri", str(parameters.get("predict_uri", "")))
    return fingerprints


# A service account's e-mail (user-managed, or a default compute / App Engine account).
_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]*@[a-z0-9][a-z0-9.-]*\.gserviceaccount\.com$")


def check_job_account(parameters: Mapping[str, Any]) -> None:
    """Refuses a job service account Vertex would reject when the first job starts.

    Raises:
        PreflightError: Not empty and not a service account e-mail.
    """
    account = str(parameters.get("job_service_account", "") or "")
    if account and not _SERVICE_ACCOUNT.match(account):
        raise PreflightError(
            f"job_service_account {account!r} is not a service account e-mail "
            "(NAME@PROJECT.iam.gserviceaccount.com); leave it empty for Vertex's default")


def check_tensorboard_account(parameters: Mapping[str, Any]) -> None:
    """Refuses a run whose training jobs upload to a TensorBoard but run as no user-managed
    service account, which Vertex refuses when the first training job starts.

    `tensorboard` is set when the pipeline was compiled with `--tensorboard`; compile.py
    checks its own `--service-account`, but a run may set `job_service_account` to "".

    Raises:
        PreflightError: Naming both ways out.
    """
    tensorboard = str(parameters.get("tensorboard", "") or "")
    if tensorboard and not str(parameters.get("job_service_account", "") or ""):
        raise PreflightError(
            f"job_service_account is empty, but this pipeline was compiled with --tensorboard "
            f"{tensorboard} and Vertex refuses TensorBoard uploads from jobs without a "
            "user-managed service account: set job_service_account "
            "(NAME@PROJECT.iam.gserviceaccount.com), or compile without --tensorboard")


def check_predict_uri(uri: str, kind: str) -> None:
    """Refuses a `predict_uri` that is not there: a folder (images) or a file (texts).

    Empty means no prediction. Checked before training, so a typo does not cost a run.

    Raises:
        PreflightError: Naming the URI and what it should be.
    """
    if not uri:
        return
    fs, path = filesystem(uri)
    if kind == "text" and not fs.isfile(path):
        raise PreflightError(f"predict_uri {uri!r} is not a file: give the CSV of texts to "
                             "label (with the training text column), or leave it empty")
    if kind == "image" and not (fs.isdir(path) or fs.isfile(path)):
        raise PreflightError(f"predict_uri {uri!r} does not exist: give the folder of images "
                             "to label, or leave it empty")


def check_tracking(parameters: Mapping[str, Any]) -> None:
    """Refuses a `tracking_uri` the tracking step could not write to.

    Raises:
        PreflightError: Its scheme is unknown.
    """
    try:
        check_tracking_uri(str(parameters.get("tracking_uri", "")))
    except TrackingError as err:
        raise PreflightError(str(err)) from err


def preflight(kind: str, data_uri: str, parameters: Mapping[str, Any]) -> str:
    """Checks a run of pipeline `kind` and returns its data fingerprint.

    Args:
        kind: "image", "text", "transformer" or "lm".
        data_uri: The pipeline's input (folder of class folders, CSV, or text corpus).
        parameters: The pipeline's other parameters by name.

    Raises:
        PreflightError: Bad parameters (all of them listed) or no data.
    """
    if kind not in CHECKS:
        raise PreflightError(f"unknown pipeline kind {kind!r}; known: {sorted(CHECKS)}")
    CHECKS[kind](parameters)
    check_job_account(parameters)
    check_tensorboard_account(parameters)
    # Both text kinds label a CSV of texts.
    check_predict_uri(str(parameters.get("predict_uri", "")),
                      "image" if kind == "image" else "text")
    check_tracking(parameters)
    if kind == "lm":
        check_corpus(data_uri, str(parameters.get("text_column", "text")))
        return data_fingerprint(data_uri, "corpus_uri")
    return data_fingerprint(data_uri)
