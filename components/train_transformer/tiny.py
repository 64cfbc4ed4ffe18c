"""A small BERT with random weights and a vocabulary counted on a corpus, saved as a Hub
model (a `model_name` folder): the pipeline offline and in tests. It has learnt nothing
before fine-tuning, so it needs a higher rate (1e-3) and more epochs than a pretrained one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from components.common.hf_transformers import import_transformers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def wordpiece_vocabulary(texts: Iterable[str], size: int) -> list[str]:
    """A WordPiece vocabulary of at most `size` tokens, the same for the same texts: the
    special tokens, every character (alone and as `##` continuation), then the most frequent
    words, ties alphabetical (`tokenizers`' trainer breaks ties in hash order)."""
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    splitter = pre_tokenizers.BertPreTokenizer()
    words: Counter[str] = Counter()
    for text in texts:
        words.update(w for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for word in words for c in word})
    tokens = [*SPECIAL_TOKENS, *chars, *(f"##{c}" for c in chars)]
    ranked = sorted((w for w in words if len(w) > 1), key=lambda w: (-words[w], w))
    return tokens + ranked[:max(0, size - len(tokens))]


def write_tiny_model(texts: Iterable[str], folder: str, *, vocab_size: int = 4000,
                     hidden_size: int = 128, layers: int = 2, heads: int = 2,
                     max_length: int = 512, seed: int = 0) -> dict[str, int]:
    """Makes a WordPiece vocabulary of `texts` and saves it with a random BERT in `folder`.

    Args:
        texts: The corpus (e.g. the training CSV's text column).
        folder: Output folder (created), as `save_pretrained` writes it.
        vocab_size: Largest vocabulary the tokenizer keeps.
        hidden_size, layers, heads: Width (feed-forward 4x), layers, attention heads.
        max_length: Longest sequence the position embeddings cover.
        seed: Seed of the random weights.

    Returns:
        `{"vocab_size", "parameters"}` of what was written.

    Raises:
        ValueError: No text to learn a vocabulary from, or heads not dividing hidden_size.
    """
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise ValueError("no non-empty text to learn a vocabulary from")
    if hidden_size % heads:
        raise ValueError(f"heads ({heads}) must divide hidden_size ({hidden_size})")
    transformers = import_transformers()
    vocab = {token: i for i, token in enumerate(wordpiece_vocabulary(texts, vocab_size))}
    tokenizer = transformers.BertTokenizer(vocab=vocab, do_lower_case=True,
                                           model_max_length=max_length)
    transformers.set_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden_size,
        max_position_embeddings=max_length, pad_token_id=vocab["[PAD]"])
    model = transformers.BertForSequenceClassification(config)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"vocab_size": len(vocab), "parameters": sum(p.numel() for p in model.parameters())}
