"""The task's vocabulary plus the rarer task tokens a pretrained LM knows. Pure logic.

fastai numbers only tokens seen `min_freq` times: on Debian's package descriptions 19% of
the test tokens read as `xxunk` where the LM knew all but 6%.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

# fastai pads a vocabulary with this token to a multiple of 8 (`make_vocab`).
FAKE = "xxfake"


def with_pretrained_tokens(task_vocab: Sequence[str], counts: Counter,
                           pretrained_vocab: Sequence[str], max_vocab: int) -> list[str]:
    """fastai's vocabulary of a task plus the task's rarer tokens a pretrained LM knows.

    Args:
        task_vocab: `make_vocab(counts, min_freq, max_vocab)` of the task's texts.
        counts: How often each token of the task's texts (train and validation) occurs.
        pretrained_vocab: The pretrained LM's vocabulary (its `vocab.pkl`).
        max_vocab: Most tokens kept (fastai's `max_vocab`).

    Returns:
        `task_vocab`'s tokens, then the task's other tokens `pretrained_vocab` holds (most
        frequent first), at most `max_vocab`, padded with `xxfake` as fastai pads.
    """
    kept = [token for token in task_vocab if token != FAKE]
    seen, known = set(kept), set(pretrained_vocab) - {FAKE}
    extra = [token for token, _ in counts.most_common() if token not in seen and token in known]
    vocab = (kept + extra)[:max_vocab]
    return vocab + [FAKE] * (8 - len(vocab) % 8)
