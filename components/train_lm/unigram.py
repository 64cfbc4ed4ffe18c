"""The language model's floor: a unigram model of its training tokens, scored as the LM is
(a corpus of NUL bytes reached held-out perplexity 15.0, which looked like learning until
set beside this floor). Pure numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def lm_target_batches(stream: np.ndarray, bs: int, seq_len: int) -> list[np.ndarray]:
    """The targets of each batch, one (bs, <= seq_len) array, that fastai's `LMDataLoader`
    makes of a token stream (the held-out texts' ids in the loader's order): `bs` rows of
    `bl = (len - 1) // bs` tokens, batch `k` their columns `k*seq_len ..`, each target the
    next token (`stream[i*bl + j + 1]`)."""
    stream = np.asarray(stream)
    bl = (len(stream) - 1) // bs if bs >= 1 else 0
    if bl < 1 or seq_len < 1:
        return []
    rows = np.stack([stream[i * bl + 1:(i + 1) * bl + 1] for i in range(bs)])
    return [rows[:, start:start + seq_len] for start in range(0, bl, seq_len)]


def unigram_baseline(train_ids: np.ndarray, valid_stream: np.ndarray, vocab_size: int,
                     bs: int, seq_len: int) -> dict[str, Any]:
    """Held-out perplexity and next-token accuracy of a unigram model of the training tokens.

    Token `t` has probability `(count(t) + 1) / (N + V)` (add-one smoothing); the prediction
    is the most frequent training token (lowest id among ties). Scored as fastai scores the
    LM: each batch's mean cross-entropy, averaged over batches; perplexity its exponential.

    Args:
        train_ids: Every token id of the training texts.
        valid_stream: The held-out token stream (`lm_target_batches`).
        vocab_size: Ids the LM predicts over (its vocabulary's length).
        bs: The held-out loader's batch size.
        seq_len: Its tokens per sequence.

    Returns:
        `{"perplexity", "accuracy", "valid_loss", "most_frequent_id", "train_tokens",
        "targets"}`; perplexity, accuracy and loss are None when the stream gives no batch.

    Raises:
        ValueError: An id outside the vocabulary.
    """
    train_ids = np.asarray(train_ids, dtype=np.int64).ravel()
    batches = lm_target_batches(np.asarray(valid_stream, dtype=np.int64).ravel(), bs, seq_len)
    for name, ids in (("training", train_ids), *(("held-out", b) for b in batches)):
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"a {name} token id is outside the vocabulary of {vocab_size}")
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64)
    log_probs = np.log(counts + 1.0) - math.log(len(train_ids) + vocab_size)
    top = int(np.argmax(counts))
    result: dict[str, Any] = {"perplexity": None, "accuracy": None, "valid_loss": None,
                              "most_frequent_id": top, "train_tokens": int(len(train_ids)),
                              "targets": int(sum(b.size for b in batches))}
    if batches:
        loss = float(np.mean([-log_probs[b].mean() for b in batches]))
        result.update(valid_loss=loss, perplexity=math.exp(loss),
                      accuracy=float(np.mean([(b == top).mean() for b in batches])))
    return result


def compare(perplexity: float | None, accuracy: float | None,
            unigram: dict[str, Any] | None) -> tuple[bool | None, str | None]:
    """Whether a language model's held-out perplexity beats the unigram's, and why not;
    `(None, None)` without a unigram figure.

    Returns:
        `(beats_unigram, learnt_nothing)`: the reason is None when it beats it.
    """
    if not unigram or unigram.get("perplexity") is None:
        return None, None
    if perplexity is not None and perplexity < unigram["perplexity"]:
        return True, None
    shown = "none" if perplexity is None else f"{perplexity:.2f}"
    why = (f"no better than a unigram model of its training tokens: held-out perplexity "
           f"{shown} vs the unigram's {unigram['perplexity']:.2f}")
    if accuracy is not None and unigram.get("accuracy") is not None:
        why += (f" (next-token accuracy {accuracy:.3f} vs {unigram['accuracy']:.3f} for always "
                "predicting the most frequent token)")
    return False, why
