"""A trained text classifier of either trainer as one kind of model (frameworks loaded then)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from components.common.hf_transformers import import_transformers
from components.prepare_text.contract import MULTI_LABEL
from components.text_common.contract import (
    EXPORT_FILE,
    LABELS_FILE,
    TEXT_FIELD,
    clip_text,
    is_transformer_folder,
    read_labels,
    token_limit,
)

if TYPE_CHECKING:
    import numpy as np


class _FastaiTextModel:
    """A fastai text classifier export with the interface of every text model."""

    def __init__(self, model_dir: str) -> None:
        import warnings

        import torch
        from fastai.learner import load_learner

        self.info = read_labels(model_dir)  # before the learner: it names a bad labels.json
        path = os.path.join(model_dir, EXPORT_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{path} not found: {model_dir!r} is not a trained text model folder (expected "
                f"{EXPORT_FILE} and {LABELS_FILE} of the fastai trainer, or a transformer's "
                f"config.json, model.safetensors and {LABELS_FILE})")
        with warnings.catch_warnings():
            # fastai warns that pickles can run code: this is the export of our own training step.
            warnings.filterwarnings("ignore", message=".*insecure pickle")
            self._learn = load_learner(path, cpu=not torch.cuda.is_available())

    def probabilities(self, texts: list[str], batch_size: int = 64):
        """See `load_text_model`."""
        import pandas as pd

        frame = pd.DataFrame({TEXT_FIELD: [clip_text(t) for t in texts]})
        dl = self._learn.dls.test_dl(frame, bs=batch_size, num_workers=0)
        probs, _ = self._learn.get_preds(dl=dl)  # reorder=True undoes the sorting by length
        return probs.float().cpu().numpy()


class TransformerTextModel:
    """A trained transformer classifier: its labels.json and a `probabilities` method."""

    def __init__(self, model_dir: str) -> None:
        """Loads the transformer trainer's model folder (FileNotFoundError without one)."""
        import torch

        if not is_transformer_folder(model_dir):
            raise FileNotFoundError(f"{model_dir!r} holds no Hugging Face model (config.json "
                                    "and model.safetensors)")
        self.info: dict[str, Any] = read_labels(model_dir)  # before anything heavy loads
        transformers = import_transformers()
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(
            model_dir).to(self.device).eval()
        saved = int(self.info.get("max_length") or 512)
        limit = token_limit(self.model.config.to_dict(), self.tokenizer.model_max_length)
        # A model saved with a max_length beyond its positions (training refuses one now)
        # reads what fits, instead of failing on every long text.
        self.max_length = min(saved, limit) if limit else saved

    def probabilities(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """See `load_text_model`; each text is also cut at the model's `max_length` tokens."""
        import numpy as np
        import torch

        k = len(self.info["labels"])
        out = [np.zeros((0, k), dtype=np.float32)]
        multi = self.info["task"] == MULTI_LABEL
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = self.tokenizer([clip_text(t) for t in texts[start:start + batch_size]],
                                       truncation=True, max_length=self.max_length,
                                       padding=True, return_tensors="pt").to(self.device)
                logits = self.model(**batch).logits.float()
                probs = torch.sigmoid(logits) if multi else torch.softmax(logits, dim=-1)
                out.append(probs.cpu().numpy())
        return np.concatenate(out)


def load_text_model(model_dir: str):
    """The text classifier of a model folder: the fastai trainer's or the transformer's.

    Args:
        model_dir: A training step's model output (local).

    Returns:
        An object with `info` (the folder's labels.json: labels, task, threshold,
        thresholds, text_column) and `probabilities(texts, batch_size)` (sigmoid per
        label for multi-label, softmax for single-label; texts cut by `clip_text`).

    Raises:
        FileNotFoundError: The folder holds neither kind of model.
    """
    if is_transformer_folder(model_dir):
        return TransformerTextModel(model_dir)
    return _FastaiTextModel(model_dir)
