"""A corpus of made-up words drawn with Zipf's law: a real corpus's word-frequency shape at
any size, for the language model trainer's tests and benchmarks."""

from __future__ import annotations

import numpy as np


def write_zipf_corpus(path: str, tokens: int, types: int, seed: int = 0) -> None:
    """Writes paragraphs of 40-200 words (`types` distinct, `tokens` in all), each ending
    with " .", separated by blank lines."""
    rng = np.random.default_rng(seed)
    words = [f"w{i:x}" for i in range(types)]
    weights = 1.0 / np.arange(1, types + 1)
    ids = rng.choice(types, size=tokens, p=weights / weights.sum())
    paragraphs, at = [], 0
    while at < tokens:
        n = int(rng.integers(40, 200))
        paragraphs.append(" ".join(words[j] for j in ids[at:at + n]) + " .")
        at += n
    with open(path, "w") as f:
        f.write("\n\n".join(paragraphs) + "\n")
