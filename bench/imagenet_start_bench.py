"""Does the ImageNet start win on real photos? EfficientNet-Lite0 from its ImageNet weights
beside DenseNet121 from random weights at no smaller CPU budget, per seed.

    python bench/imagenet_start_bench.py --data DIR [--work DIR] [--image-size 96]
        [--seeds 42 43 44] [--threads 1] [--split-seed 42] [--flip | --no-flip]
        [--head-epochs 3 --fine-tune-epochs 4 --unfreeze-blocks 2]
        [--arms lite0_imagenet densenet_scratch lite0_scratch --scratch-epochs 12]

DATA is image class folders (`tools.datamakers.tuxpaint_photos`, or `make run`'s digits),
sharded once at --image-size. Per seed, on that one split, each arm is trained by the image
trainer and scored by the evaluation step beside its baselines: `lite0_imagenet`,
EfficientNet-Lite0 from the converted ImageNet weights (`make models`), head then top
MBConv stages; `densenet_scratch`, DenseNet121 from random weights for --scratch-epochs (at
least Lite0's CPU seconds); `lite0_scratch`, Lite0 from random weights, the same epochs.
Random flips on (a mirrored bird is a bird); off for digits (--no-flip).

The Lite0 recipe (the defaults) was picked on the validation split of the photos with
seed 42 only. Measured (the table, the recipes tried, the digits): docs/measurements.md,
"EfficientNet-Lite0 from ImageNet on real photos".

Prints one line per seed, the table and the mean, and CPU seconds (time.process_time of
the whole process: every thread) and wall seconds per arm. Threads: TF's intra-op pool
(--threads, 0 = TensorFlow's default of one per core).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.image_pretrain_bench import (  # noqa: E402
    _threads,
    accuracy_table,
    arm_parser,
    seed_rows,
    shard,
    train_and_score,
)
from components.common.storage import read_json  # noqa: E402

ARMS = ("lite0_imagenet", "densenet_scratch", "lite0_scratch")


def arm_config(arm: str, args, seed: int):
    """The trainer's settings of one arm (module docstring)."""
    from components.train_image.contract import TrainConfig

    if arm == "lite0_imagenet":
        return TrainConfig(architecture="efficientnet_lite0", weights="imagenet",
                           epochs=args.head_epochs, fine_tune_epochs=args.fine_tune_epochs,
                           unfreeze_blocks=args.unfreeze_blocks,
                           learning_rate=args.learning_rate,
                           fine_tune_learning_rate=args.fine_tune_learning_rate,
                           flip=args.flip, seed=seed)
    architecture = "densenet121" if arm == "densenet_scratch" else "efficientnet_lite0"
    # Patience as long as the run by default: every epoch of the budget is trained.
    patience = args.scratch_epochs if args.scratch_patience is None else args.scratch_patience
    return TrainConfig(architecture=architecture, weights=None, epochs=args.scratch_epochs,
                       fine_tune_epochs=0, flip=args.flip, seed=seed,
                       early_stopping_patience=patience)


def timed(dataset: str, out: str, config) -> dict:
    """`train_and_score` with the CPU seconds it took (training and scoring) and the last
    epoch's validation loss (a tie-break when the small validation split is all right)."""
    start = time.process_time()
    result = train_and_score(dataset, out, config)
    result["cpu_seconds"] = time.process_time() - start
    history = read_json(os.path.join(out, "model", "history.json"))
    last = [record for records in history.values() for record in records][-1]
    result["val_loss"] = last.get("val_loss")
    return result


def print_table(rows: list[dict], arms) -> None:
    """`accuracy_table`, then CPU and wall seconds of each arm."""
    accuracy_table(rows, arms, f"test accuracy ({rows[0][arms[0]]['test_examples']} test "
                   "images, same split every seed)")
    for arm in arms:
        print(f"{arm}: {statistics.mean(r[arm]['cpu_seconds'] for r in rows):.0f} CPU s, "
              f"{statistics.mean(r[arm]['seconds'] for r in rows):.0f} wall s of training per "
              f"run, {rows[0][arm]['epochs']} epochs (mean of {len(rows)} seeds)")


def build_parser() -> argparse.ArgumentParser:
    parser = arm_parser(__doc__, ARMS, arms=list(ARMS[:2]), head_epochs=3, unfreeze_blocks=2,
                        fine_tune_learning_rate=1e-4, flip=True, scratch_epochs=12)
    parser.add_argument("--data", required=True, help="image class folders")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--scratch-patience", type=int, default=None,
                        help="early-stopping patience of the arms from random weights (default: "
                        "their epochs, so all are trained; make run's: 3, the trainer's default)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _threads(args.threads)
    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or temporary
        os.makedirs(work, exist_ok=True)
        dataset = os.path.join(work, "shards")
        shard(args.data, dataset, args.split_seed, args.image_size)
        rows = seed_rows(args, work, lambda arm, seed, out: timed(
            dataset, out, arm_config(arm, args, seed)),
            lambda rows: {"args": vars(args), "rows": rows})
    print_table(rows, args.arms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
