"""The DenseNet inside a trained image model, as the weights file a new training starts from.

    python -m pipelines.base_weights MODEL OUT.h5

MODEL is the image trainer's model folder (with `model.keras`) or a `run_local image` output
folder. OUT.h5 is a no-top weights file of its DenseNet, in the format of Keras'
`densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5`: pass it as the image pipeline's
`weights`, and the trainer runs its two phases from it as from ImageNet's. The head is left
behind; the weights hold no image size (a base learnt at 32 px loads at any size >= 32).
"""

from __future__ import annotations

import argparse
import os
import sys

from components.common.commands import reports
from components.common.storage import read_json
from components.train_image.contract import MODEL_FILE


def model_file(model: str) -> str:
    """`model.keras` of a model folder, or of the model a run_local summary.json names.

    Raises:
        FileNotFoundError: Neither is there.
    """
    direct = os.path.join(model, MODEL_FILE)
    if os.path.exists(direct):
        return direct
    summary = read_json(os.path.join(model, "summary.json"), optional=True) or {}
    named = summary.get("artifacts", {}).get("model")
    if named and os.path.exists(os.path.join(named, MODEL_FILE)):
        return os.path.join(named, MODEL_FILE)
    raise FileNotFoundError(f"{model!r} holds neither {MODEL_FILE} nor a run_local "
                            "summary.json naming a model")


def save_base_weights(model: str, out_path: str) -> int:
    """Writes the DenseNet base of a trained model as a no-top `.h5` weights file.

    Returns:
        The number of weight tensors written.
    """
    from components.formats.image_models import load_keras_model
    from components.train_image.model import get_base

    base = get_base(load_keras_model(model_file(model), compile=False))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    temporary = out_path + ".tmp.h5"
    base.save_weights(temporary)
    os.replace(temporary, out_path)
    return len(base.weights)


@reports(FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.base_weights",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("model", help="model folder, or a run_local image output folder")
    parser.add_argument("output", help="the .h5 file to write")
    args = parser.parse_args(argv)
    if not args.output.endswith(".h5"):
        parser.error("the output must be a .h5 file (what Keras' DenseNet(weights=...) loads)")
    count = save_base_weights(args.model, args.output)
    print(f"wrote {count} weight tensors to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
