"""The prepared dataset, the frame fastai reads, and the LM's and classifier's dataloaders."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pandas as pd
import torch
from fastai.text.all import (
    CategoryBlock,
    ColReader,
    ColSplitter,
    DataBlock,
    MultiCategoryBlock,
    TextBlock,
)

from components.common.fastai_text import IS_VALID, TOKENIZER_WORKERS
from components.prepare_text.contract import MULTI_LABEL, read_manifest, read_split
from components.text_common.contract import MAX_TEXT_CHARS, TEXT_FIELD, clip_text
from components.train_text.contract import TrainConfig

log = logging.getLogger(__name__)

FRAME_TEXT, _CLASS = TEXT_FIELD, "__class__"  # columns of the frame fastai reads


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
    """The prepared dataset's manifest facts and its two splits used in training."""

    manifest: dict[str, Any]
    labels: list[str]
    task: str
    text_column: str
    train: pd.DataFrame
    valid: pd.DataFrame


def read_dataset(dataset_dir: str) -> PreparedDataset:
    """The manifest's labels, task and text column, and the train and validation splits."""
    manifest = read_manifest(dataset_dir)
    return PreparedDataset(manifest, manifest["labels"], manifest["task"],
                           manifest["text_column"], read_split(dataset_dir, "train"),
                           read_split(dataset_dir, "validation"))


def fastai_frame(data: PreparedDataset) -> tuple[pd.DataFrame, int]:
    """The frame fastai reads (text, is_valid, then the targets under fixed names: no label
    can clash with them), texts clipped; and how many were clipped."""
    both = pd.concat([data.train, data.valid], ignore_index=True)
    frame = pd.DataFrame({FRAME_TEXT: both[data.text_column].astype(str),
                          IS_VALID: [False] * len(data.train) + [True] * len(data.valid)})
    if data.task == MULTI_LABEL:
        for i, label in enumerate(data.labels):
            frame[f"__label_{i}"] = both[label].astype(np.int64)
    else:
        frame[_CLASS] = np.asarray(data.labels, dtype=object)[
            both[list(data.labels)].to_numpy().argmax(1)]
    # Read as prediction reads them (spaCy refuses texts over 1M characters).
    truncated = int((frame[FRAME_TEXT].str.len() > MAX_TEXT_CHARS).sum())
    frame[FRAME_TEXT] = frame[FRAME_TEXT].map(clip_text)
    if truncated:
        log.warning("%d text(s) over %d characters: read up to the limit", truncated,
                    MAX_TEXT_CHARS)
    return frame, truncated


def unigram_accuracy(dls_lm) -> float:
    """Share of the most frequent token in the language model's validation texts."""
    tokens = torch.cat([item[0].flatten() for item in dls_lm.valid_ds])
    return float(torch.bincount(tokens).max()) / max(1, tokens.numel())


def classifier_dataloaders(frame, tokenizer, vocab, labels, task, config: TrainConfig):
    """The classifier's dataloaders over `frame`, targets in `labels`' order."""
    if task == MULTI_LABEL:
        columns = [f"__label_{i}" for i in range(len(labels))]
        y_block, get_y = MultiCategoryBlock(encoded=True, vocab=list(labels)), ColReader(columns)
    else:
        # sort=False: the outputs stay in the manifest's label order, which labels.json,
        # the evaluation and the server read them in (fastai sorts a given vocab by default).
        y_block, get_y = CategoryBlock(vocab=list(labels), sort=False), ColReader(_CLASS)
    x_block = TextBlock.from_df(FRAME_TEXT, vocab=vocab, seq_len=config.seq_len,
                                backwards=config.backwards, tok=tokenizer,
                                min_freq=config.min_freq, max_vocab=config.max_vocab,
                                n_workers=TOKENIZER_WORKERS)
    block = DataBlock(blocks=(x_block, y_block),
                      get_x=ColReader(FRAME_TEXT), get_y=get_y, splitter=ColSplitter(IS_VALID))
    n_train = int((~frame[IS_VALID]).sum())
    # The training loader drops the last partial batch: never ask for more rows than exist.
    bs = min(config.batch_size, n_train)
    if bs < config.batch_size:
        log.warning("%d training rows: classifier batch size %d instead of %d",
                    n_train, bs, config.batch_size)
    return block.dataloaders(frame, bs=bs, seq_len=config.seq_len, num_workers=0)

