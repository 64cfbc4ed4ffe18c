"""Pretrained language model assets: checked, then copied from a local path or gs:// URI.

Layout under the assets URI, one folder per language:

    <lang>/forward/{config.json, vocab.pkl, weights.pth}
    <lang>/backward/{config.json, vocab.pkl, weights.pth}
    <lang>/spm/spm.model          (SentencePiece languages: ja, ko, zh)

`weights.pth` is a fastai language model's state dict (as `torch.save(model.state_dict())`
or `learn.save`), `vocab.pkl` the pickled list of its tokens (`dls.vocab`), and
`config.json` names the architecture and its sizes, e.g.
`{"arch": "AWD_LSTM", "emb_sz": 400, "n_hid": 1152, "n_layers": 3}` (any key of
fastai's `awd_lstm_lm_config`; the rest keep fastai's defaults). Nothing is ever
downloaded from the internet at run time.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from components.common.storage import filesystem
from components.train_text.contract import (
    asset_uri,
    direction,
    missing_files,
    required_files,
)

SUPPORTED_ARCHS = ("AWD_LSTM",)


class MissingAssetsError(FileNotFoundError):
    """Pretrained LM files are missing; the message lists each one."""


class AssetConfigError(ValueError):
    """config.json names an architecture or settings this runtime cannot build."""


@dataclasses.dataclass(frozen=True)
class LMAssets:
    """Local copies of one language and direction's pretrained LM.

    Attributes:
        config: The architecture settings from config.json (without "arch").
        weights: Path of weights.pth.
        vocab: Path of vocab.pkl.
        spm_model: Path of spm.model for SentencePiece languages, else None.
    """

    config: dict[str, Any]
    weights: str
    vocab: str
    spm_model: str | None


def parse_config(text: str, source: str) -> tuple[str, dict[str, Any]]:
    """Architecture name and settings from config.json's text.

    Accepts `{"arch": NAME, <settings>...}` or `{"arch": NAME, "config": {<settings>}}`;
    a missing arch means AWD_LSTM.

    Raises:
        AssetConfigError: Not a JSON object, or an architecture fastai 2.8 lacks.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise AssetConfigError(f"{source} is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise AssetConfigError(f"{source} must hold a JSON object, got {type(raw).__name__}")
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


def fetch_assets(assets_uri: str, lang: str, backwards: bool, local_dir: str) -> LMAssets:
    """Checks that a language and direction's LM files exist and copies them locally.

    Args:
        assets_uri: Root of the assets layout, a local path or gs:// URI.
        lang: Language code, e.g. "fr", "en", "ja".
        backwards: Take the backward LM instead of the forward one.
        local_dir: Folder the files are copied into (local paths are used in place).

    Returns:
        The local files and the architecture settings.

    Raises:
        MissingAssetsError: Some files are absent; the message lists every one.
        AssetConfigError: config.json cannot be used.
    """
    if not assets_uri.strip():
        raise MissingAssetsError(
            "pretrained=True needs lm_assets_uri, a folder laid out as "
            f"{', '.join(required_files(lang, backwards))}; or set pretrained=False "
            "to train the language model from scratch")
    missing = missing_files(assets_uri, lang, backwards)
    if missing:
        raise MissingAssetsError(
            f"pretrained LM assets for lang={lang!r} ({direction(backwards)}) are incomplete; "
            f"missing: {', '.join(missing)}. Provide them or set pretrained=False to train "
            "from scratch")
    fs, root = filesystem(assets_uri)
    paths = {}
    for rel in required_files(lang, backwards):
        source = asset_uri(root, rel)
        if assets_uri.startswith("gs://"):
            target = os.path.join(local_dir, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fs.get(source, target)
        else:
            target = source
        paths[rel.rsplit("/", 1)[-1]] = target
    with open(paths["config.json"]) as f:
        source = asset_uri(assets_uri, required_files(lang, backwards)[0])
        _, config = parse_config(f.read(), source)
    return LMAssets(config=config, weights=paths["weights.pth"],
                    vocab=paths["vocab.pkl"], spm_model=paths.get("spm.model"))
