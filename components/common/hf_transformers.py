"""Importing Hugging Face `transformers` in our runtimes (trainer and text-model reader)."""

from __future__ import annotations

import sys


def import_transformers():
    """The `transformers` module, imported so that a torchvision built for another torch
    (which fails at import, taking transformers with it) is hidden: text never uses it."""
    if "torchvision" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except (ImportError, RuntimeError):
            sys.modules["torchvision"] = None  # transformers then treats it as absent
    import transformers

    transformers.logging.set_verbosity_error()  # the step logs its own lines
    transformers.logging.disable_progress_bar()  # no bars in a job's log
    return transformers
