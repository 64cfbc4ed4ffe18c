"""Which tokens a run numbers: the task's vocabulary, and what a pretrained LM adds to it.

fastai numbers the tokens seen `min_freq` times (`make_vocab`), every other one is `xxunk`,
and `load_pretrained` copies the LM's embedding of each numbered token. A token the LM has
learnt needs no occurrences in the task to mean something: on Debian's package descriptions
(2,357 texts) fastai kept 736 of 2,676 token types, so 19% of the test tokens read as `xxunk`
where the LM knew all but 6%. `with_pretrained_tokens` keeps those tokens too. Pure logic.
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
        `task_vocab`'s tokens in their order, then the task's other tokens that
        `pretrained_vocab` holds, most frequent first, at most `max_vocab` in all, padded
        with `xxfake` as fastai pads. A token the task never shows is not added (the
        classifier could not learn what it means for the labels).
    """
    kept = [token for token in task_vocab if token != FAKE]
    seen, known = set(kept), set(pretrained_vocab) - {FAKE}
    extra = [token for token, _ in counts.most_common() if token not in seen and token in known]
    vocab = (kept + extra)[:max_vocab]
    return vocab + [FAKE] * (8 - len(vocab) % 8)
