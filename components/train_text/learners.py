"""The fastai learners: the language model's fine-tuning and the classifier."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from fastai.text.all import (
    AWD_LSTM,
    BCEWithLogitsLossFlat,
    CrossEntropyLossFlat,
    F1Score,
    F1ScoreMulti,
    accuracy,
    accuracy_multi,
    load_pickle,
    make_vocab,
    text_classifier_learner,
    tokenize_df,
)

from components.common.fastai_text import (
    TOKENIZER_WORKERS,
    lm_dataloaders,
    lm_learner,
    mixed_precision,
    quiet,
)
from components.prepare_text.contract import MULTI_LABEL
from components.text_common import scores as text_scores
from components.train_text import schedule
from components.train_text.contract import TextTrainingError
from components.train_text.data import (
    FRAME_TEXT,
    classifier_dataloaders,
    unigram_accuracy,
)
from components.train_text.runner import TrainingJob

log = logging.getLogger(__name__)

ENCODER = "lm_encoder"  # learn.save_encoder's name: lm_encoder.pth in the checkpoint folder

# Settings that shape the encoder; the LM's dropouts do not carry over to the classifier.
ENCODER_KEYS = ("emb_sz", "n_hid", "n_layers", "pad_token", "bidir")
# fastai pads a vocabulary with this token to a multiple of 8 (`make_vocab`).
FAKE = "xxfake"


def fine_tune_lm(job: TrainingJob, vocab: list[str] | None) -> list[str] | None:
    """Runs the LM stages and saves the encoder, unless there are none or it is saved.

    Returns:
        The vocabulary: `vocab`, or the LM data's when `vocab` was None (then saved).
    """
    run, state, config = job.run, job.run.state, job.config
    lm_indices = run.indices(schedule.LM)
    if not lm_indices or state["encoder_saved"]:
        return vocab
    vocab = _vocab_with_pretrained_tokens(job, vocab)
    dls_lm = lm_dataloaders(job.frame, FRAME_TEXT, job.tokenizer, vocab, config,
                            config.backwards)
    if vocab is None:
        vocab = list(dls_lm.vocab)
        run.save_vocab(vocab)
    learn_lm = lm_learner(dls_lm, job.lm_config, config.drop_mult, run.folder, job.precision)
    if not run.restore(learn_lm) and job.assets:
        learn_lm.load_pretrained(job.assets.weights, job.assets.vocab)
    for index in lm_indices:
        run.fit(learn_lm, index)
    learn_lm.save_encoder(ENCODER)
    lm_rows = [r for r in state["history"] if r["model"] == schedule.LM]
    discarded = schedule.lm_learnt_nothing(lm_rows, unigram_accuracy(dls_lm))
    if discarded:
        log.warning("the language model learnt nothing (%s): the classifier starts "
                    "from %s instead", discarded,
                    "the pretrained weights" if job.assets else "random weights")
    state.update(encoder_saved=True, checkpoint=None, lm_discarded=discarded)
    run.save()
    return vocab


def _vocab_with_pretrained_tokens(job: TrainingJob,
                                  vocab: list[str] | None) -> list[str] | None:
    """`vocab`, else with a pretrained LM fastai's plus the rarer tokens it knows (saved)."""
    if vocab is not None or job.assets is None:
        return vocab
    # Counted as TextBlock.from_df counts (a resumed run reads the saved vocabulary).
    _, counts = tokenize_df(job.frame[[FRAME_TEXT]], [FRAME_TEXT], tok=job.tokenizer,
                            n_workers=TOKENIZER_WORKERS)
    config = job.config
    frequent = make_vocab(counts, config.min_freq, config.max_vocab)
    vocab = with_pretrained_tokens(frequent, counts, load_pickle(job.assets.vocab),
                                   config.max_vocab)
    log.info("vocabulary: %d tokens seen %d times or more, %d rarer ones the pretrained "
             "language model knows", sum(t != FAKE for t in frequent), config.min_freq,
             sum(t != FAKE for t in vocab) - sum(t != FAKE for t in frequent))
    job.run.save_vocab(vocab)
    return vocab


def with_pretrained_tokens(task_vocab: Sequence[str], counts: Counter,
                           pretrained_vocab: Sequence[str], max_vocab: int) -> list[str]:
    """fastai's vocabulary of a task plus the task's rarer tokens a pretrained LM knows
    (fastai numbers only tokens seen `min_freq` times: on Debian's package descriptions 19%
    of the test tokens read as `xxunk` where the LM knew all but 6%).

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


def train_random_encoder_whole(job: TrainingJob) -> None:
    """Replaces gradual unfreezing by one whole stage when the LM's encoder was discarded:
    a random encoder gains nothing from it (a resume plans alike: lm_discarded is saved)."""
    run, config = job.run, job.config
    if not (run.state.get("lm_discarded") and not config.pretrained and
            any(s.freeze_to is not None for s in run.plan)):
        return
    run.plan = [s for s in run.plan if s.model == schedule.LM] + \
        schedule.plan_stages(0, config.epochs, config.lm_learning_rate, config.learning_rate,
                             False, "all")
    job.unfreeze = ("all", "the language model learnt nothing: the random encoder trains "
                    "whole from the start")


def classifier_learner(job: TrainingJob, vocab: list[str] | None, loss, metrics):
    """The classifier's learner from its last checkpoint, else the fine-tuned encoder, else
    the pretrained one, else random weights.

    Returns:
        `(learner, its dataloaders, the vocabulary)`; a vocabulary first made here is saved.
    """
    run, state, config, data = job.run, job.run.state, job.config, job.data
    vocab = _vocab_with_pretrained_tokens(job, vocab)
    dls = classifier_dataloaders(job.frame, job.tokenizer, vocab, data.labels, data.task,
                                 config)
    if list(dls.vocab[1]) != list(data.labels):  # outputs are read in the labels' order
        raise TextTrainingError(f"the classifier's outputs are ordered {list(dls.vocab[1])}, "
                                f"not as the dataset's labels {list(data.labels)}")
    if vocab is None:
        vocab = list(dls.vocab[0])
        run.save_vocab(vocab)
    clas_config = {k: v for k, v in job.arch_config.items() if k in ENCODER_KEYS}
    learn = text_classifier_learner(
        dls, AWD_LSTM, seq_len=config.seq_len, config=clas_config, pretrained=False,
        drop_mult=config.drop_mult, loss_func=loss, metrics=metrics, path=run.folder,
        model_dir=".")
    quiet(learn)
    start_at_label_frequencies(learn, data.train[data.labels].to_numpy(), data.task)
    learn = mixed_precision(learn, job.precision)
    clas_indices = run.indices(schedule.CLASSIFIER)
    if not (clas_indices and run.started(clas_indices[0]) and run.restore(learn)):
        if state["encoder_saved"] and not state.get("lm_discarded"):
            learn.load_encoder(ENCODER)
        elif job.assets:
            learn.load_pretrained(job.assets.weights, job.assets.vocab, model=learn.model[0])
    return learn, dls, vocab


def start_at_label_frequencies(learn, truth: np.ndarray, task: str) -> None:
    """Gives a fresh classifier head's last Linear layer (fastai's has no bias) the bias
    that predicts each label's frequency in `truth`, the training split's 0/1 label matrix
    (`text_scores.frequency_bias`)."""
    linear = [m for m in learn.model[1].modules() if isinstance(m, torch.nn.Linear)][-1]
    bias = text_scores.frequency_bias(truth, task)
    linear.bias = torch.nn.Parameter(torch.as_tensor(bias, dtype=linear.weight.dtype,
                                                     device=linear.weight.device))


def loss_and_metrics(task: str, threshold: float) -> tuple[Any, list]:
    """Multi-label: sigmoid per label (BCE), thresholded; single-label: softmax (cross-entropy)."""
    if task == MULTI_LABEL:
        return (BCEWithLogitsLossFlat(thresh=threshold),
                [partial(accuracy_multi, thresh=threshold),
                 F1ScoreMulti(thresh=threshold, average="macro")])
    return CrossEntropyLossFlat(), [accuracy, F1Score(average="macro")]

