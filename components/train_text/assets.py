"""Pretrained language model assets (`components.formats.lm_assets`' layout): checked, then
copied from a local path or gs:// URI; English without assets takes fastai's WikiText-103
AWD-LSTM as `language_model_learner(..., pretrained=True)` fetches it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from components.common.input_kinds import InputKindError, read_json_object
from components.common.storage import filesystem, is_remote
from components.formats.lm_assets import direction
from components.train_text.contract import (
    FASTAI_PRETRAINED_LANG,
    asset_uri,
    missing_files,
    required_files,
    unlearnt_lm,
)

SUPPORTED_ARCHS = ("AWD_LSTM",)


class MissingAssetsError(FileNotFoundError):
    """Pretrained LM files are missing; the message lists each one."""


class AssetConfigError(ValueError):
    """config.json names an architecture or settings this runtime cannot build."""


class UnlearntAssetsError(ValueError):
    """The assets' own lm_metrics.json says their language model learnt nothing."""


@dataclasses.dataclass(frozen=True)
class LMAssets:
    """Local copies of one language and direction's pretrained LM."""

    config: dict[str, Any]  # config.json's settings, without "arch"
    weights: str
    vocab: str
    spm_model: str | None  # SentencePiece languages only
    source: str  # the assets' root, or the URL of fastai's English model


def parse_config(text: str | bytes, source: str) -> tuple[str, dict[str, Any]]:
    """Architecture name and settings from config.json: `{"arch": NAME, <settings>...}` or
    `{"arch": NAME, "config": {<settings>}}`; a missing arch means AWD_LSTM.

    Raises:
        AssetConfigError: Not a JSON object, or an architecture fastai 2.8 lacks.
    """
    try:
        raw = read_json_object(text.encode("utf-8") if isinstance(text, str) else text, source)
    except InputKindError as err:
        raise AssetConfigError(str(err)) from None
    arch = str(raw.get("arch", "AWD_LSTM"))
    settings = raw.get("config", {k: v for k, v in raw.items() if k != "arch"})
    if not isinstance(settings, dict):
        raise AssetConfigError(f"{source}: \"config\" must be a JSON object")
    if arch == "AWD_QRNN":
        raise AssetConfigError(
            f"{source} asks for AWD_QRNN, which fastai 2.8 no longer ships (QRNN was removed "
            "from fastai 2); give AWD_LSTM weights")
    if arch not in SUPPORTED_ARCHS:
        raise AssetConfigError(f"{source}: unknown arch {arch!r}; supported: {SUPPORTED_ARCHS}")
    return arch, dict(settings)


def fetch_fastai_pretrained(backwards: bool) -> LMAssets:
    """fastai's English WikiText-103 AWD-LSTM, as `language_model_learner` fetches it (the
    first `*.pth` and `*.pkl` of `untar_data`'s folder).

    Raises:
        MissingAssetsError: The download failed, or the folder lacks a `.pth` or a `.pkl`.
    """
    from fastai.text.all import URLs, untar_data

    url = URLs.WT103_BWD if backwards else URLs.WT103_FWD  # as pretrained=True downloads
    try:
        folder = untar_data(url, c_key="model")
    except Exception as err:  # urllib, HTTP and archive errors alike
        raise MissingAssetsError(
            f"could not fetch fastai's pretrained English language model from {url} ({err}); "
            "a job without internet needs a copy in a bucket: run `python -m "
            "pipelines.stage_wt103 --output gs://BUCKET/lm` once where there is internet and "
            "pass lm_assets=gs://BUCKET/lm; with none anywhere, pass lm_assets= the folder the "
            "LM pipeline wrote from your own corpus (the lm_assets output of `run_local lm`), "
            "or pretrained=false to train from scratch (weaker on small data)") from err
    weights, vocab = sorted(folder.glob("*.pth")), sorted(folder.glob("*.pkl"))
    if not weights or not vocab:
        raise MissingAssetsError(f"{folder} (fastai's copy of {url}) lacks a "
                                 f"{'.pth' if not weights else '.pkl'} file: delete the "
                                 "folder so that fastai fetches it again")
    return LMAssets(config={}, weights=str(weights[0]), vocab=str(vocab[0]), spm_model=None,
                    source=url)


def fetch_assets(assets_uri: str, lang: str, backwards: bool, local_dir: str) -> LMAssets:
    """Checks that a language and direction's LM files exist and copies them locally; with
    no assets and lang=en, fastai's English model (`fetch_fastai_pretrained`).

    Args:
        assets_uri: Root of the assets layout, a local path or gs:// URI; or empty.
        lang: Language code, e.g. "fr", "en", "ja".
        backwards: Take the backward LM instead of the forward one.
        local_dir: Folder the files are copied into (local paths are used in place).

    Raises:
        MissingAssetsError: Some files are absent (the message lists every one), or fastai's
            English model could not be fetched.
        UnlearntAssetsError: Their lm_metrics.json says the model learnt nothing
            (`contract.unlearnt_lm`).
        AssetConfigError: config.json cannot be used.
    """
    if not assets_uri.strip() and lang.strip() == FASTAI_PRETRAINED_LANG:
        return fetch_fastai_pretrained(backwards)
    if not assets_uri.strip():
        raise MissingAssetsError(
            "pretrained=True needs lm_assets_uri, a folder laid out as "
            f"{', '.join(required_files(lang, backwards))} (only lang="
            f"{FASTAI_PRETRAINED_LANG!r} has fastai's model without one); or set "
            "pretrained=False to train the language model from scratch")
    missing = missing_files(assets_uri, lang, backwards)
    if missing:
        raise MissingAssetsError(
            f"pretrained LM assets for lang={lang!r} ({direction(backwards)}) are incomplete; "
            f"missing: {', '.join(missing)}. Provide them or set pretrained=False to train "
            "from scratch")
    unlearnt = unlearnt_lm(assets_uri, lang, backwards)
    if unlearnt:
        raise UnlearntAssetsError(f"pretrained LM assets refused: {unlearnt}")
    fs, root = filesystem(assets_uri)
    paths = {}
    files = required_files(lang, backwards)
    for rel in files:
        source = target = asset_uri(root, rel)
        if is_remote(assets_uri):
            target = os.path.join(local_dir, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fs.get(source, target)
        paths[rel.rsplit("/", 1)[-1]] = target
    with open(paths["config.json"], "rb") as f:
        _, config = parse_config(f.read(), asset_uri(assets_uri, files[0]))
    return LMAssets(config=config, weights=paths["weights.pth"],
                    vocab=paths["vocab.pkl"], spm_model=paths.get("spm.model"), source=assets_uri)
