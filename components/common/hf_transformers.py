"""Importing Hugging Face `transformers` in our runtimes: the transformer trainer and the
text-model reader (`components.text_common.models`) both go through here.
"""

from __future__ import annotations

import sys


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
