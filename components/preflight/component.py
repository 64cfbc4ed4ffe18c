"""KFP faces of the preflight step, each written from its pipeline's parameter list
(`components.common.written`), so the list lives in one place."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from components.common.written import write_function

# Each kind's outputs (one output is returned as a plain str) and what it refuses first.
OUTPUTS = {
    "image": ("data_fingerprint", "weights_fingerprint", "predict_fingerprint"),
    "text": ("data_fingerprint", "lm_assets_fingerprint", "predict_fingerprint"),
    "transformer": ("data_fingerprint", "model_fingerprint", "predict_fingerprint"),
    "lm": ("data_fingerprint",),
}
_WHAT = {
    "image": "image pipeline settings that a later step would refuse, before any paid job "
             "starts, and fingerprints the input folder, the weights file and the folder to "
             "label",
    "text": "text pipeline settings that a later step would refuse (and a missing pretrained "
            "language model), before any paid job starts, and fingerprints the CSV, the "
            "pretrained language models and the CSV to label",
    "transformer": "transformer pipeline settings that a later step would refuse (and a "
                   "model_name folder without a model in it), before any paid job starts, "
                   "and fingerprints the CSV, the model_name folder and the CSV to label",
    "lm": "language model pipeline settings and a corpus the training step would refuse, "
          "before the GPU job starts, and fingerprints the corpus",
}
_RETURNS = {
    "data_fingerprint": '"sha256:<digest>:<files>", a digest of the input\'s listing (names, '
                        "sizes, versions).",
    "weights_fingerprint": "The same of a weights file; empty for imagenet or none.",
    "lm_assets_fingerprint": "The same of lm_assets when pretrained; else empty.",
    "model_fingerprint": "The same of model_name when it is a folder (gs:// or local); empty "
                         "for a Hub name.",
    "predict_fingerprint": "The same of predict_uri; empty when nothing is to be labelled.",
}
TENSORBOARD = inspect.Parameter("tensorboard", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default="", annotation=str)
_TENSORBOARD_HELP = ("Not a pipeline parameter: the TensorBoard the training jobs upload to, "
                     "set at compile time (compile.py --tensorboard); with one, an empty "
                     "job_service_account is refused (Vertex would refuse the training job).")


def preflight_function(kind: str, parameters: Sequence[inspect.Parameter]):
    """The preflight step's function of a `kind` pipeline whose parameters are `parameters`.

    Args:
        kind: "image", "text", "transformer" or "lm".
        parameters: The pipeline's parameters, as its signature has them; `tensorboard`
            follows them.

    Returns:
        `preflight_<kind>`, which refuses what a later step would refuse and returns the
        fingerprints of `OUTPUTS[kind]`. Never cached: each fingerprint is an input of the
        step that reads those files, so its cache key changes exactly when they change.
    """
    outputs = OUTPUTS[kind]
    first = parameters[0].name if parameters else "tensorboard"
    returns = "str" if len(outputs) == 1 else (
        "NamedTuple('Outputs', [" + ", ".join(f"('{name}', str)" for name in outputs) + "])")
    written_returns = "\n".join(
        f"    {name}: {_RETURNS[name]}" for name in outputs) if len(outputs) > 1 else (
        f"    {_RETURNS[outputs[0]]}")
    doc = (f"Refuses {_WHAT[kind]}. Never cached.\n\n"
           f"Args:\n    {first}: See the pipeline. Every other parameter but tensorboard is "
           f"the pipeline's, checked by the step that uses it.\n"
           f"    tensorboard: {_TENSORBOARD_HELP}\n\nReturns:\n{written_returns}")
    body = ("parameters = dict(locals())  # the inputs, before the import names one more\n"
            "from components.preflight.checks import run_preflight\n\n"
            f"return run_preflight({kind!r}, parameters)")
    return write_function(f"preflight_{kind}", [*parameters, TENSORBOARD], doc, body, returns)
