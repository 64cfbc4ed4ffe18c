"""Does a learned start win? DenseNet121 pretrained on the letters of real fonts, then
fine-tuned on handwritten digits, beside the same network from scratch, per seed.

    python bench/image_pretrain_bench.py [--work DIR] [--weights FILE.h5] [--seeds 42 43 44]
        [--threads 1] [--pretrain-epochs 14 --pretrain-steps 250]
        [--head-epochs 3 --fine-tune-epochs 3 --unfreeze-blocks 1]
        [--arms scratch --scratch-epochs 15] [--split-seed 42]

1. The start (`tools.datamakers.glyph_start`; skipped when --weights names one made before):
   DenseNet121 trained on the scanned letters of every installed typeface, as a no-top .h5.
2. The digits of `make run` (`tools.datamakers.demo digits`), sharded as `make run` does.
3. Per seed, on that one split, three arms scored on the test split by the evaluation step
   beside its baselines: `scratch_make_run` (from scratch, random flips on: the trainer's
   default), `scratch` (the same without flips: a mirrored 2 is no digit) and `glyph_start`
   (2 epochs on the frozen base, then 4 with dense blocks 2-5 unfrozen at 3e-4, no flips;
   the recipe picked on seed 42's validation split). Measured, with the recipes tried:
   docs/measurements.md, "The image trainer from a learned start".

Prints one line per seed and the mean, and seconds per epoch of each run. Threads: TF's
intra-op pool (--threads, 0 = TensorFlow's default of one per core).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _threads(count: int) -> None:
    if count:
        os.environ["OMP_NUM_THREADS"] = str(count)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if count:
        tf.config.threading.set_intra_op_parallelism_threads(count)
        tf.config.threading.set_inter_op_parallelism_threads(count)


def shard(images: str, out: str, seed: int = 42, image_size: int = 32, label: str = "split"
          ) -> None:
    """Shards class folders once (4 shards a split, one writer); prints each split's size."""
    from components.shard.contract import ShardConfig
    from components.shard.sharding import shard_dataset

    manifest = shard_dataset(images, out, ShardConfig(
        image_size=image_size, min_shards_per_split=4, seed=seed, num_workers=1), progress=False)
    print(f"{label}:", {k: v["count"] for k, v in manifest["splits"].items()}, flush=True)


def epoch_timer():
    """A tf-keras callback keeping the seconds of each epoch (training and validation)."""
    import tf_keras

    class EpochTimer(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    return EpochTimer()


def train_and_score(dataset: str, out: str, config) -> dict:
    """Trains, evaluates on the test split; accuracy, baselines and timings."""
    from components.evaluate_image.evaluation import evaluate_image_model
    from components.train_image import training

    timer = epoch_timer()
    start = time.perf_counter()
    metrics = training.train(dataset, os.path.join(out, "model"), config, callbacks=[timer])
    seconds = time.perf_counter() - start
    result = evaluate_image_model(os.path.join(out, "model"), dataset, os.path.join(out, "eval"))
    return {"accuracy": result["accuracy"], "val_accuracy": metrics.get("val_accuracy"),
            "baseline": {name: values["accuracy"] for name, values in result["baseline"].items()},
            "epochs": metrics["epochs_run"], "seconds": seconds,
            "seconds_per_epoch": timer.seconds, "test_examples": result.get("num_examples")}


ARMS = ("scratch_make_run", "scratch", "glyph_start")


def seed_rows(args, work: str, run_arm, record) -> list[dict]:
    """Per seed of `args.seeds`, each arm of `args.arms` run by `run_arm(arm, seed, out)`,
    the baselines beside; with --work, `record(rows so far)` written to results.json."""
    rows = []
    for seed in args.seeds:
        row = {"seed": seed}
        for arm in args.arms:
            row[arm] = run_arm(arm, seed, os.path.join(work, f"{arm}-{seed}"))
            row["baseline"] = row[arm]["baseline"]
            print(arm, seed, json.dumps(row[arm]), flush=True)
        rows.append(row)
        if args.work:
            with open(os.path.join(work, "results.json"), "w") as f:
                json.dump(record(rows), f, indent=1)
    return rows


def arm_config(arm: str, args, weights: str, seed: int):
    """The trainer's settings of one arm: `make run`'s from scratch (flips on, its default),
    from scratch as the others (flips as --flip says), and from the glyph start."""
    from components.train_image.contract import TrainConfig

    if arm == "scratch_make_run":
        return TrainConfig(weights=None, epochs=args.scratch_epochs, fine_tune_epochs=0,
                           seed=seed)
    if arm == "scratch":
        return TrainConfig(weights=None, epochs=args.scratch_epochs, fine_tune_epochs=0,
                           flip=args.flip, seed=seed)
    return TrainConfig(weights=weights, epochs=args.head_epochs,
                       fine_tune_epochs=args.fine_tune_epochs,
                       unfreeze_blocks=args.unfreeze_blocks,
                       fine_tune_learning_rate=args.fine_tune_learning_rate,
                       flip=args.flip, seed=seed)


def accuracy_table(rows: list[dict], arms, title: str) -> None:
    """Test accuracy per seed, arms beside the baselines, and the mean."""
    names = [*arms, "pixels_logreg", "majority_class"]
    print(f"\n{title}")
    print("seed  " + "  ".join(f"{name:>16}" for name in names))
    for row in rows:
        values = [row[arm]["accuracy"] for arm in arms]
        values += [row["baseline"]["pixels_logreg"], row["baseline"]["majority_class"]]
        print(f"{row['seed']:>4}  " + "  ".join(f"{v:16.4f}" for v in values))
    means = [statistics.mean(row[arm]["accuracy"] for row in rows) for arm in arms]
    print("mean  " + "  ".join(f"{v:16.4f}" for v in means))


def print_table(rows: list[dict], arms) -> None:
    """`accuracy_table`, then seconds per epoch of each arm."""
    accuracy_table(rows, arms, "test accuracy on the digits' test split (same split every seed)")
    for arm in arms:
        epochs = [s for row in rows for s in row[arm]["seconds_per_epoch"]]
        print(f"{arm}: {statistics.mean(epochs):.1f} s per epoch (mean of {len(epochs)}; "
              f"the first holds tracing), {statistics.mean(r[arm]['seconds'] for r in rows):.0f} "
              "s per training run")


def arm_parser(doc: str, choices: tuple[str, ...], **defaults) -> argparse.ArgumentParser:
    """The options both image benches take, each bench's `defaults` (its recipe) set."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--work", default=None, help="folder kept for the outputs "
                        "(default: a temporary one)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--split-seed", type=int, default=42,
                        help="the seed that splits the images (make run's 42)")
    # The learned start's recipe, chosen on the validation split of seed 42 (docstrings).
    parser.add_argument("--head-epochs", type=int)
    parser.add_argument("--fine-tune-epochs", type=int, default=4)
    parser.add_argument("--unfreeze-blocks", type=int)
    parser.add_argument("--fine-tune-learning-rate", type=float)
    parser.add_argument("--flip", action=argparse.BooleanOptionalAction,
                        help="random flips (photos: on; digits, which have a handedness: off)")
    parser.add_argument("--scratch-epochs", type=int, help="epochs of the arms from random "
                        "weights (default %(default)s)")
    parser.add_argument("--arms", nargs="+", choices=choices, default=list(choices))
    parser.set_defaults(**defaults)
    return parser


def build_parser() -> argparse.ArgumentParser:
    # flips in the scratch and glyph_start arms only; the scratch arms get the glyph start's
    # budget of 6 epochs (make run's from random weights: 15)
    parser = arm_parser(__doc__, ARMS, head_epochs=2, unfreeze_blocks=4,
                        fine_tune_learning_rate=3e-4, flip=False, scratch_epochs=6)
    parser.add_argument("--weights", default=None, help="a start made before (skips step 1)")
    parser.add_argument("--pretrain-epochs", type=int, default=14)
    parser.add_argument("--pretrain-steps", type=int, default=250)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _threads(args.threads)
    import dataclasses

    from tools.datamakers import demo

    with tempfile.TemporaryDirectory() as temporary:
        work = args.work or temporary
        os.makedirs(work, exist_ok=True)
        weights, facts = args.weights, None
        if weights is None:
            from tools.datamakers import glyph_start

            weights = os.path.join(work, "densenet121_glyphs_notop.h5")
            facts = glyph_start.make_start(weights, os.path.join(work, "start"),
                                           args.pretrain_epochs, args.pretrain_steps)
            print("start:", json.dumps(facts), flush=True)
        digits, dataset = os.path.join(work, "digits"), os.path.join(work, "digit-shards")
        demo.write_digits(digits)
        shard(digits, dataset, args.split_seed, label="digits")
        configs = {arm: dataclasses.asdict(arm_config(arm, args, weights, 0))
                   for arm in args.arms}
        rows = seed_rows(args, work, lambda arm, seed, out: train_and_score(
            dataset, out, arm_config(arm, args, weights, seed)),
            lambda rows: {"start": facts, "rows": rows, "configs": configs})
    print_table(rows, args.arms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
