"""Which tokens a run numbers: the task's vocabulary, and what a pretrained LM adds to it.

Pure logic (no fastai, no torch) so it is unit-tested on its own.

fastai numbers a task's tokens seen at least `min_freq` times in its texts (`make_vocab`)
and maps every other one to `xxunk`; `load_pretrained` then copies the pretrained LM's
embedding row of each numbered token (`match_embeds`). `min_freq` is there because an
embedding learnt from one or two occurrences is noise; but a token the pretrained LM has
learnt does not need the task's occurrences to mean something. On a small task the rule
threw most of what the LM knew away: on Debian's package descriptions (2,357 short texts,
16.6k tokens) fastai's vocabulary kept 736 of the 2,676 token types, so 19% of the test
split's tokens read as `xxunk`, although an LM pretrained on the other packages'
descriptions knew all but 6% of them. `with_pretrained_tokens` keeps those tokens too.
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
        task_vocab: fastai's vocabulary of the task's texts (`make_vocab(counts, min_freq,
            max_vocab)`: special tokens first, then tokens seen `min_freq` times or more,
            padded with `xxfake`).
        counts: Every token of the task's texts (train and validation, as fastai counts
            them) and how often it occurs.
        pretrained_vocab: The pretrained LM's vocabulary (its `vocab.pkl`).
        max_vocab: Most tokens kept (fastai's `max_vocab`).

    Returns:
        `task_vocab`'s tokens in their order, then the task's other tokens that
        `pretrained_vocab` holds, most frequent first, at most `max_vocab` in all, padded
        with `xxfake` as fastai pads. A token neither frequent in the task nor known to the
        LM stays `xxunk`; one the task never shows is not added (the classifier could not
        learn what it means for the labels).
    """
    kept = [token for token in task_vocab if token != FAKE]
    seen, known = set(kept), set(pretrained_vocab) - {FAKE}
    extra = [token for token, _ in counts.most_common() if token not in seen and token in known]
    vocab = (kept + extra)[:max_vocab]
    return vocab + [FAKE] * (8 - len(vocab) % 8)
