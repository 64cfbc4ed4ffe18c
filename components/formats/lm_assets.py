"""Pretrained language model assets (`<lang>/{forward,backward}/{config.json,vocab.pkl,
weights.pth}`, `<lang>/spm/spm.model`), their writer, and the tokenizer both fastai text
trainers cut text with (the LM and the classifier must cut alike)."""

from __future__ import annotations

import os
from typing import Any

from components.common.storage import write_json_atomically

SPM_LANGS = frozenset({"ja", "ko", "zh"})
LM_FILES = ("config.json", "vocab.pkl", "weights.pth")
SPM_FILE = "spm/spm.model"
# Beside <lang>/: the LM step's report; the text trainer reads its `beats_unigram`.
LM_METRICS_FILE = "lm_metrics.json"


# The start and end `lm_file_problem` reads: a zip's end record is 22 bytes + a 64 KB comment.
LM_FILE_HEAD, LM_FILE_TAIL = 16, 65_558
# What `torch.save` writes: a zip archive, or (before torch 1.6) its magic number's pickles.
_TORCH_ZIP, _ZIP_END = b"PK\x03\x04", b"PK\x05\x06"
_TORCH_LEGACY = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"


def lm_file_problem(name: str, head: bytes, tail: bytes) -> str:
    """Why an assets file cannot be what its name says, from its first `LM_FILE_HEAD` and
    last `LM_FILE_TAIL` bytes (nothing unpickled); "" when it can."""
    if not head:
        return "is empty"
    if name.endswith(".pkl") and not tail.endswith(b"."):
        return "is cut short (a pickle ends with its STOP opcode '.'): copy it again"
    if name.endswith(".pth"):
        if head.startswith(_TORCH_ZIP):
            if _ZIP_END not in tail:
                return "is a zip archive cut short (no end record): copy it again"
        elif not head.startswith(_TORCH_LEGACY):
            return ("is not a file torch.save wrote (neither a zip archive nor torch's "
                    "legacy format): give the weights learn.save or torch.save wrote")
    return ""


class TokenizerError(RuntimeError):
    """No tokenizer can be built for a language here; the message says why."""


def direction(backwards: bool) -> str:
    """Folder name of a direction: "backward" or "forward"."""
    return "backward" if backwards else "forward"


def check_language(lang: str) -> None:
    """Whether `make_tokenizer` can build a tokenizer for `lang` here, without fastai and
    torch (spaCy's blank pipeline is what fastai's `SpacyTokenizer` builds).

    Raises:
        TokenizerError: A SentencePiece language without sentencepiece, or a language
            spaCy has no tokenizer for.
    """
    if lang in SPM_LANGS:
        import importlib.util

        if importlib.util.find_spec("sentencepiece") is None:
            raise TokenizerError(
                f"lang={lang!r} is tokenized with SentencePiece, but the sentencepiece "
                "package is not installed in this runtime; add it to the fastai image")
        return
    import spacy

    try:
        spacy.blank(lang)
    except (ImportError, OSError, KeyError) as err:
        raise TokenizerError(f"spaCy has no tokenizer for lang={lang!r}: {err}") from err


def make_tokenizer(lang: str, spm_model: str | None, cache_dir: str):
    """The word tokenizer of a language: spaCy's rules, or SentencePiece for ja/ko/zh.

    Args:
        lang: Language code.
        spm_model: A trained SentencePiece model (ja, ko, zh), or None (fastai trains one).
        cache_dir: Where fastai's SentencePiece tokenizer keeps its files.

    Raises:
        TokenizerError: As `check_language`.
    """
    check_language(lang)
    from fastai.text.all import SentencePieceTokenizer, SpacyTokenizer

    if lang in SPM_LANGS:
        return SentencePieceTokenizer(lang=lang, sp_model=spm_model, cache_dir=cache_dir)
    return SpacyTokenizer(lang=lang)


def save_lm_assets(learn, root: str, lang: str, backwards: bool,
                   config: dict[str, Any]) -> list[str]:
    """Writes a language model learner in the assets layout.

    Args:
        learn: A fastai language model learner (`language_model_learner`).
        root: Assets root folder (local).
        lang: Language folder name.
        backwards: Whether `learn` reads texts backwards.
        config: Its AWD_LSTM settings, as passed to `language_model_learner`.

    Returns:
        The paths written.
    """
    import torch
    from fastai.text.all import L, save_pickle

    folder = os.path.join(root, lang, direction(backwards))
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, n) for n in LM_FILES]
    write_json_atomically(paths[0], {"arch": "AWD_LSTM", **config})
    # The texts' vocabulary (a classifier's dls hold an `L` of texts' and labels').
    vocab = learn.dls.vocab
    save_pickle(paths[1], list(vocab[0] if isinstance(vocab, L) else vocab))
    torch.save(learn.model.state_dict(), paths[2])
    return paths
