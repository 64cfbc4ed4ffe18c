"""Loading a transformer model folder and scoring texts with it (evaluation, prediction,
serving): the tokenizer and model `save_pretrained` wrote, on a GPU when there is one.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from components.train_text.contract import clip_text
from components.train_transformer.contract import LABELS_FILE, is_transformer_folder

MULTI_LABEL = "multi_label"


def import_transformers():
    """The `transformers` module, imported so that a broken torchvision cannot stop it.

    transformers imports torchvision when it is installed, for image models only. A
    torchvision built for another torch (the CUDA wheel beside the CPU torch of a laptop
    venv) fails at import ("operator torchvision::nms does not exist"), and with it every
    transformers class; text models never use it, so such a torchvision is hidden.
    """
    if "torchvision" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except (ImportError, RuntimeError):
            sys.modules["torchvision"] = None  # transformers then treats it as absent
    import transformers

    transformers.logging.set_verbosity_error()  # the step logs its own lines
    transformers.logging.disable_progress_bar()  # no bars in a job's log
    return transformers


class TransformerTextModel:
    """A trained transformer classifier: its labels.json and a `probabilities` method."""

    def __init__(self, model_dir: str) -> None:
        """Loads the model folder written by the transformer trainer.

        Raises:
            FileNotFoundError: The folder holds no Hugging Face model.
        """
        import torch

        if not is_transformer_folder(model_dir):
            raise FileNotFoundError(f"{model_dir!r} holds no Hugging Face model (config.json "
                                    "and model.safetensors)")
        transformers = import_transformers()
        with open(os.path.join(model_dir, LABELS_FILE)) as f:
            self.info: dict[str, Any] = json.load(f)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(
            model_dir).to(self.device).eval()
        self.max_length = int(self.info.get("max_length") or 512)

    def probabilities(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Sigmoid per label (multi-label) or softmax (single-label) for `texts`, in order.

        Each text is read up to `MAX_TEXT_CHARS` characters (`clip_text`), then up to the
        model's `max_length` tokens, as in training.
        """
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
