"""Input pipeline ratios, each measured side by side in one run.

    python bench/input_bench.py [--images 2000] [--image-size 224]

reader efficiency = img/s of the shard reader (interleaved TFRecord reads, parse,
    parallel decode) / img/s of a bare parallel decode of the same image bytes held in
    memory; for JPEG and raw shards. Target >= 0.9.
feed ratio = train step time fed by the shards / fed by synthetic in-memory tensors,
    same model and batch. Target <= 1.05.
frozen / fine-tune = step time with the DenseNet base frozen / with the top blocks
    unfrozen. Target <= 0.45.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from bench.shard_bench import make_images  # noqa: E402
from components.formats.shards import make_dataset  # noqa: E402
from components.shard import contract, sharding  # noqa: E402
from components.shard.sharding import ShardConfig  # noqa: E402


def images_per_second(dataset: tf.data.Dataset, count: int) -> float:
    """One full iteration's rate, batched by 64 so per-element overhead is shared."""
    start = time.perf_counter()
    seen = sum(int(images.shape[0]) for images, _ in dataset.batch(64))
    assert seen == count, (seen, count)
    return count / (time.perf_counter() - start)


def reader_efficiency(root: str, tmp: str, image_format: str, size: int) -> tuple[float, float]:
    out = os.path.join(tmp, f"shards-{image_format}")
    config = ShardConfig(image_size=size, image_format=image_format, min_shards_per_split=16,
                         train_fraction=1.0, validation_fraction=0.0, test_fraction=0.0)
    manifest = sharding.shard_dataset(root, out, config, progress=False)
    count = manifest["splits"]["train"]["count"]
    spec = {"image": tf.io.FixedLenFeature([], tf.string)}  # the train split's encoded images
    blobs = [tf.io.parse_single_example(record, spec)["image"].numpy()
             for path in contract.shard_files(out, manifest, "train")
             for record in tf.data.TFRecordDataset(path)]  # read out of the shards into memory
    shape = (size, size, 3)

    def bare_decode(blob):
        if image_format == "raw":
            return tf.reshape(tf.io.decode_raw(blob, tf.uint8), shape), 0
        return tf.ensure_shape(tf.io.decode_jpeg(blob, channels=3), shape), 0

    bare = (tf.data.Dataset.from_tensor_slices(blobs)
            .map(bare_decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False))
    shards = make_dataset(out, "train", manifest=manifest, deterministic=False)
    # alternate the measurements so machine drift hits both alike; best of each
    bare_rates, shard_rates = [], []
    for _ in range(4):
        bare_rates.append(images_per_second(bare, count))
        shard_rates.append(images_per_second(shards, count))
    return max(shard_rates), max(bare_rates)


class StepTimer(tf_keras.callbacks.Callback):
    """Times training steps; the median ignores warm-up and stragglers."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)

    def median(self, skip: int) -> float:
        kept = sorted(self.times[skip:])
        return kept[len(kept) // 2]


def step_time(model, dataset: tf.data.Dataset, steps: int, warmup: int = 3) -> float:
    """Median seconds of one training step fed by `dataset`."""
    timer = StepTimer()
    model.fit(dataset, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[timer])
    return timer.median(warmup)


def training_ratios(root: str, tmp: str, size: int, batch: int, steps: int) -> dict[str, float]:
    """Feed ratio and frozen/fine-tune step-time ratio on DenseNet121 (random weights)."""
    from components.train_image.model import build_model, set_trainable, train_input
    from components.train_image.training import TrainConfig

    out = os.path.join(tmp, "shards-train")
    manifest = sharding.shard_dataset(
        root, out, ShardConfig(image_size=size, min_shards_per_split=16), progress=False)
    classes = len(manifest["classes"])
    config = TrainConfig(weights="none", batch_size=batch)
    shards = train_input(out, manifest, config, batch)
    images, labels = next(iter(shards))
    synthetic = tf.data.Dataset.from_tensors((images, labels)).repeat()

    # frozen_batchnorm as with pretrained weights, whose phases this compares
    model = build_model(classes, size, weights=None, frozen_batchnorm=True)

    def compiled(phase, blocks=1):
        set_trainable(model, phase, unfreeze_blocks=blocks)
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-4),
                      loss="sparse_categorical_crossentropy")
        return model

    fine = compiled("fine_tune", 1)
    fed_synthetic = step_time(fine, synthetic, steps)
    fed_shards = step_time(fine, shards, steps)
    fed_synthetic = min(fed_synthetic, step_time(fine, synthetic, steps))
    frozen = step_time(compiled("head"), synthetic, steps)
    fine_tune = {1: fed_synthetic, 4: step_time(compiled("fine_tune", 4), synthetic, steps)}
    return {"feed": fed_shards / fed_synthetic, "step_synthetic": fed_synthetic,
            "step_shards": fed_shards, "step_frozen": frozen, "fine_tune": fine_tune}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--train-image-size", type=int, default=160,
                        help="image size of the training-step ratios (CPU: smaller is faster)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per case")
    parser.add_argument("--reader-only", action="store_true", help="skip the training ratios")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "images")
        make_images(root, args.images)
        print(f"{args.images} images, {args.image_size}px, {os.cpu_count()} cores")
        for image_format in ("jpeg", "raw"):
            shard_rate, bare_rate = reader_efficiency(root, tmp, image_format, args.image_size)
            print(f"reader efficiency ({image_format}): {shard_rate / bare_rate:.3f} "
                  f"(shards {shard_rate:.0f} img/s, bare in-memory decode {bare_rate:.0f} img/s;"
                  " target >= 0.9)")
        if args.reader_only:
            return 0
        r = training_ratios(root, tmp, args.train_image_size, args.batch_size, args.steps)
        print(f"feed ratio: {r['feed']:.3f} (step fed by shards {r['step_shards']:.3f} s / by "
              f"in-memory tensors {r['step_synthetic']:.3f} s; target <= 1.05)")
        for blocks, seconds in r["fine_tune"].items():
            print(f"frozen / fine-tune ({blocks} dense block(s) unfrozen) step time: "
                  f"{r['step_frozen'] / seconds:.3f} (frozen {r['step_frozen']:.3f} s, "
                  f"fine-tune {seconds:.3f} s; target <= 0.45)")
        print(f"(DenseNet121, {args.train_image_size}px, batch {args.batch_size}, median of "
              f"{args.steps} steps, {tf.config.list_physical_devices('GPU') or 'CPU only'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
