"""A learned start made offline: DenseNet121 trained on the letters of real typefaces,
written as the no-top weights file the image trainer's `weights` takes.

    python -m tools.datamakers.glyph_start OUT.h5 [--work DIR] [--epochs 14] [--steps-per-epoch 250]
        [--seed 0] [--fonts DIR ...] [--scan-side 8]

Letters of every installed font (`tools.datamakers.font_glyphs`), each drawn as the UCI
digits were scanned (`font_glyphs.scan`; `--scan-side 0` keeps the crisp glyphs) -> shards
at 32 px -> the image trainer from scratch (one phase; no flips: letters have a handedness)
-> its DenseNet121 as OUT.h5 (`pipelines.base_weights`), with OUT.json beside it saying
what it was made from and how well it reads held-out letters. No weights are downloaded
(no registry ships a file Keras' DenseNet121 loads). What it took and is worth beside
training from scratch: docs/measurements.md, bench/image_pretrain_bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from components.common.commands import reports

IMAGE_SIZE = 32


def make_start(out_path: str, work: str, epochs: int = 14, steps_per_epoch: int = 250,
               seed: int = 0, font_paths: Sequence[str] | None = None,
               chars: str | None = None, scan_side: int = 8) -> dict[str, Any]:
    """Makes the weights file; returns (and writes to `<out_path minus .h5>.json`) its facts.

    Args:
        out_path: The `.h5` file to write.
        work: Folder for the glyphs, shards and the trained model (kept).
        epochs, steps_per_epoch: Training epochs, and batches of 32 per epoch.
        seed: Seed of the split and the training.
        font_paths, chars: Font files (default every installed one) and the classes
            (default the 52 letters).
        scan_side: Glyphs drawn as scans of this side (`font_glyphs.scan`); 0: crisp.

    Raises:
        FileNotFoundError: No installed font covers the characters.
    """
    from components.shard.contract import ShardConfig
    from components.shard.sharding import shard_dataset
    from components.train_image import training
    from components.train_image.contract import TrainConfig
    from pipelines import base_weights
    from tools.datamakers import font_glyphs

    start = time.perf_counter()
    glyphs, shards, model = (os.path.join(work, name) for name in ("glyphs", "shards", "model"))
    counts = font_glyphs.write_glyphs(glyphs, font_paths, chars or font_glyphs.LETTERS,
                                      IMAGE_SIZE, scan_side=scan_side)
    manifest = shard_dataset(glyphs, shards, ShardConfig(
        image_size=IMAGE_SIZE, min_shards_per_split=4, seed=seed, num_workers=1),
        progress=False)
    config = TrainConfig(weights=None, epochs=epochs, fine_tune_epochs=0, flip=False,
                         seed=seed, steps_per_epoch=steps_per_epoch, early_stopping_patience=4)
    metrics = training.train(shards, model, config, serving=False)  # its weights alone
    tensors = base_weights.save_base_weights(model, out_path)
    facts = {
        "weights": os.path.abspath(out_path), "tensors": tensors,
        "fonts": counts["fonts"], "images": counts["images"], "classes": counts["classes"],
        "splits": {name: split["count"] for name, split in manifest["splits"].items()},
        "image_size": IMAGE_SIZE, "epochs_run": metrics["epochs_run"],
        "steps_per_epoch": steps_per_epoch, "seed": seed, "scan_side": scan_side,
        "val_accuracy": metrics.get("val_accuracy"),
        "seconds": round(time.perf_counter() - start, 1),
    }
    with open(os.path.splitext(out_path)[0] + ".json", "w") as f:
        json.dump(facts, f, indent=1)
    return facts


@reports(FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.glyph_start",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("output", help="the .h5 weights file to write")
    parser.add_argument("--work", default=None,
                        help="folder kept for glyphs, shards and model (default: temporary)")
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--steps-per-epoch", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fonts", action="append", default=None,
                        help="folder of .ttf/.otf files (repeatable; default /usr/share/fonts)")
    parser.add_argument("--scan-side", type=int, default=8,
                        help="glyphs drawn as scans of this side, as the UCI digits (8); 0: crisp")
    args = parser.parse_args(argv)
    if not args.output.endswith(".h5"):
        parser.error("the output must be a .h5 file (what DenseNet121(weights=...) loads)")
    if args.scan_side < 0:
        parser.error(f"--scan-side must be 0 (crisp) or a side in pixels, got {args.scan_side}")
    from tools.datamakers import font_glyphs

    fonts = font_glyphs.find_fonts(args.fonts) if args.fonts else None
    with tempfile.TemporaryDirectory() as temporary:
        facts = make_start(args.output, args.work or temporary, args.epochs,
                           args.steps_per_epoch, args.seed, fonts, scan_side=args.scan_side)
    print(f"wrote {args.output}: DenseNet121 trained on {facts['images']} images of "
          f"{facts['classes']} letters from {facts['fonts']} typefaces, held-out accuracy "
          f"{facts['val_accuracy'] or float('nan'):.3f}, {facts['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
