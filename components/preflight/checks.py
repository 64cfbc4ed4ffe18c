"""The preflight entry points: a pipeline kind's checks, the run-wide ones and the data
checks (`preflight`), and the fingerprints of what a run reads by URI (`run_preflight`)."""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Mapping
from typing import Any

from components.preflight.component import OUTPUTS
from components.preflight.data import check_corpus, check_predict_uri, data_fingerprint
from components.preflight.parameters import PreflightError, typed_parameter
from components.preflight.pipeline_checks import CHECKS
from components.track.contract import TrackingError, check_tracking_uri


def input_fingerprints(kind: str, parameters: Mapping[str, Any]) -> dict[str, str]:
    """Fingerprints of the files a run reads by URI besides its data, one per step input,
    so files changed under the same URI change the reading step's cache key.

    Args:
        kind: "image", "text" or "transformer".
        parameters: The pipeline's parameters by name.

    Returns:
        `component.OUTPUTS[kind]` but the data's, by name; empty where nothing is read.
    """
    from components.train_image.contract import normalize_weights

    def of(name: str, uri: str) -> str:
        return data_fingerprint(uri, name) if uri else ""

    if kind == "image":
        weights = normalize_weights(str(parameters.get("weights", "imagenet")))
        read = of("weights", "" if weights in (None, "imagenet") else weights)
    elif kind == "transformer":
        from components.train_transformer.contract import model_name_is_path

        model = str(parameters.get("model_name", "")).strip()
        read = of("model_name", model if model_name_is_path(model) else "")
    else:
        from components.train_text.contract import TrainConfig

        pretrained = typed_parameter(parameters, "pretrained", bool, TrainConfig.pretrained)
        read = of("lm_assets", str(parameters.get("lm_assets", "")) if pretrained else "")
    return {OUTPUTS[kind][1]: read,
            "predict_fingerprint": of("predict_uri", str(parameters.get("predict_uri", "")))}


# A service account's e-mail (user-managed, or a default compute / App Engine account).
_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]*@[a-z0-9][a-z0-9.-]*\.gserviceaccount\.com$")


def _check_accounts(parameters: Mapping[str, Any]) -> None:
    """Refuses a job_service_account that is no service account e-mail, and an empty one
    with a TensorBoard compiled in (Vertex refuses it when the first training job starts)."""
    account = str(parameters.get("job_service_account", "") or "")
    if account and not _SERVICE_ACCOUNT.match(account):
        raise PreflightError(
            f"job_service_account {account!r} is not a service account e-mail "
            "(NAME@PROJECT.iam.gserviceaccount.com); leave it empty for Vertex's default")
    tensorboard = str(parameters.get("tensorboard", "") or "")
    if tensorboard and not account:
        raise PreflightError(
            f"job_service_account is empty, but this pipeline was compiled with --tensorboard "
            f"{tensorboard} and Vertex refuses TensorBoard uploads from jobs without a "
            "user-managed service account: set job_service_account "
            "(NAME@PROJECT.iam.gserviceaccount.com), or compile without --tensorboard")


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
    _check_accounts(parameters)
    # Both text kinds label a CSV of texts.
    check_predict_uri(str(parameters.get("predict_uri", "")),
                      "image" if kind == "image" else "text",
                      str(parameters.get("text_column", "text") or "text"))
    try:  # a tracking_uri the tracking step could not write to
        check_tracking_uri(str(parameters.get("tracking_uri", "")))
    except TrackingError as err:
        raise PreflightError(str(err)) from err
    if kind == "lm":
        check_corpus(data_uri, str(parameters.get("text_column", "text")))
        return data_fingerprint(data_uri, "corpus_uri")
    return data_fingerprint(data_uri)


def run_preflight(kind: str, parameters: Mapping[str, Any]) -> Any:
    """The preflight step of pipeline `kind`: `preflight`, then `input_fingerprints`.

    Args:
        kind: "image", "text", "transformer" or "lm".
        parameters: The step's inputs by name (`corpus_uri` for "lm", else `data_uri`,
            and the other parameters).

    Returns:
        For "lm" the corpus fingerprint; else a namedtuple of the data fingerprint and
        each of `input_fingerprints`.

    Raises:
        PreflightError: As `preflight`.
    """
    data = "corpus_uri" if kind == "lm" else "data_uri"
    settings = {name: value for name, value in parameters.items() if name != data}
    fingerprint = preflight(kind, parameters[data], settings)
    if kind == "lm":
        print(f"settings accepted; corpus fingerprint {fingerprint}")
        return fingerprint
    others = input_fingerprints(kind, settings)
    print(f"settings accepted; data fingerprint {fingerprint}; {others}")
    return namedtuple("Outputs", ["data_fingerprint", *others])(fingerprint, *others.values())
