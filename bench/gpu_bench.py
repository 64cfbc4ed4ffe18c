"""What the training steps get out of an accelerator, measured side by side in one run.

    python bench/gpu_bench.py [--engine tf-keras|keras3] [--sections choices,densenet,feed,fastai]
        [--image-size 224] [--batch 64] [--steps 30] [--precisions mixed_float16,float32]
        [--layout 6,12,24,16] [--architecture densenet121|efficientnet_lite0]
        [--host-cores N] [--json FILE] [--smoke]

choices   what the trainers' selection logic picks on the devices seen: the strategy, the
          Keras precision policy and fastai's precision.
densenet  the image network's training images/s under each precision, fed from one batch
          in host memory; achieved TFLOP/s as a share of the device's peak (`bench.flops`:
          a training step is 3x the forward pass).
feed      the same step fed from real shards through the trainer's input pipeline vs from
          memory: feed ratio = step time from shards / from memory (1.0: the shards keep
          up), with the host's pipeline alone in images/s.
fastai    the text trainer's AWD-LSTM classifier tokens/s in fp32, fp16 and bf16.

--engine keras3 builds the same network with Keras 3 on KERAS_BACKEND (jax, torch, ...),
for accelerators without TensorFlow's CUDA build (feed still needs a CPU TensorFlow).
--smoke: tiny sizes (32 px, batch 4, one dense block per stage), for the tests on a CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.flops import forward_flops, peak_tflops, train_tflops  # noqa: E402

SECTIONS = ("choices", "densenet", "feed", "fastai")
TEXT_PRECISIONS = ("fp32", "fp16", "bf16")
KERAS_PRECISIONS = ("mixed_float16", "float32")
DENSENET121 = (6, 12, 24, 16)
SMOKE_LAYOUT = (1, 1, 1, 1)


def visible_gpus() -> list[dict]:
    """Name and compute capability of each GPU, from the first framework installed."""
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
    except ImportError:
        gpus = []
    if gpus:
        details = [(gpu, tf.config.experimental.get_device_details(gpu)) for gpu in gpus]
        return [{"name": found.get("device_name", gpu.name),
                 "capability": tuple(found.get("compute_capability") or (0, 0))}
                for gpu, found in details]
    try:  # a CPU-only TensorFlow beside a CUDA PyTorch (or no TensorFlow at all)
        import torch
    except ImportError:
        return []
    return [{"name": torch.cuda.get_device_name(i),
             "capability": tuple(torch.cuda.get_device_capability(i))}
            for i in range(torch.cuda.device_count())]


def choices(gpus: list[dict]) -> dict:
    """What the trainers' selection logic picks for these GPUs (no cluster variables)."""
    from components.common.fastai_text import choose_precision as text_precision
    from components.train_image.distribute import choose_precision, choose_strategy_kind

    capabilities = [g["capability"] for g in gpus]
    return {
        "gpus": [f"{g['name']} (compute {g['capability'][0]}.{g['capability'][1]})" for g in gpus],
        "strategy": choose_strategy_kind(None, None, capabilities),
        "keras_precision": choose_precision("auto", capabilities),
        "fastai_precision": text_precision(True, bool(gpus), capabilities[0] if gpus else None),
    }


def tf_keras_model(classes: int, size: int, precision: str, layout=DENSENET121,
                   architecture: str = "densenet121"):
    """The trainer's own model and compile settings on TensorFlow (tf-keras)."""
    import tf_keras

    from components.train_image.model import build_model, dtype_policy

    with dtype_policy(precision):
        model = build_model(classes, size, weights=None, layout=layout,
                            architecture=architecture)
        # as model.compile_model does (the policy adds the loss scaling)
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-4),
                      loss="sparse_categorical_crossentropy")
    return model


def keras3_model(classes: int, size: int, precision: str, layout=DENSENET121,
                 architecture: str = "densenet121"):
    """The same network (components.train_image.model.build_model) in Keras 3."""
    import keras

    # DenseNet121/169/201 are this builder at fixed layouts; Keras exports only those.
    from keras.src.applications.densenet import DenseNet

    from components.train_image.contract import IMAGENET_MEAN, IMAGENET_STD

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        inputs = keras.Input(shape=(size, size, 3), dtype="float32", name="image")
        scaled = keras.layers.Normalization(
            mean=[255.0 * m for m in IMAGENET_MEAN],
            variance=[(255.0 * s) ** 2 for s in IMAGENET_STD], dtype="float32")(inputs)
        base = DenseNet(list(layout), include_top=False, weights=None,
                        input_shape=(size, size, 3))
        x = keras.layers.GlobalAveragePooling2D()(base(scaled))
        x = keras.layers.Dropout(0.2)(x)
        outputs = keras.layers.Dense(classes, activation="softmax", dtype="float32")(x)
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss="sparse_categorical_crossentropy")
    finally:
        keras.config.set_dtype_policy(previous)
    return model


ENGINES = {"tf-keras": tf_keras_model, "keras3": keras3_model}  # name -> model builder


def step_seconds(model, data, steps: int, warmup: int) -> float:
    """Seconds per training step: a warm-up fit (tracing), then a timed one (`fit` reads the
    loss back, so the span waits for the device)."""
    model.fit(data, steps_per_epoch=warmup, epochs=1, verbose=0)
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    return (time.perf_counter() - start) / steps


def memory_batch(batch: int, size: int, classes: int):
    """One batch of random pixels and labels in host memory, repeated forever (tf.data, or a
    generator for Keras 3 without TensorFlow)."""
    import numpy as np

    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (batch, size, size, 3)).astype("float32")
    labels = rng.integers(0, classes, batch).astype("int64")
    try:
        import tensorflow as tf
    except ImportError:
        return ((images, labels) for _ in itertools.count())  # a generator, for ever
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def densenet(engine: str, gpus: list[dict], size: int, batch: int, steps: int, warmup: int,
             rounds: int, precisions: tuple[str, ...] = KERAS_PRECISIONS,
             layout: tuple[int, ...] = DENSENET121, architecture: str = "densenet121") -> dict:
    """Training images/s under each of `precisions`, alternated `rounds` times (best kept);
    the AMP speed-up when both were measured."""
    from components.train_image.contract import architecture_name

    classes = 10
    data = memory_batch(batch, size, classes)
    models = {p: ENGINES[engine](classes, size, p, layout, architecture) for p in precisions}
    flops = forward_flops(next(iter(models.values())))
    best = {p: float("inf") for p in models}
    for _ in range(rounds):  # alternate so drift (clocks, heat) hits both alike
        for precision, model in models.items():
            best[precision] = min(best[precision], step_seconds(model, data, steps, warmup))
    device = gpus[0]["name"] if gpus else "CPU"
    out = {"engine": engine, "device": device, "image_size": size, "batch": batch,
           "architecture": (architecture_name(layout) if architecture == "densenet121"
                            else "EfficientNet-Lite0"), "forward_gflop": flops / 1e9}
    for precision, seconds in best.items():
        rate = batch / seconds
        tflops = train_tflops(rate, flops)
        peak = peak_tflops(device, precision) if gpus else None
        out[precision] = {"images_per_second": rate, "tflops": tflops,
                          "share_of_peak": tflops / peak if peak else None}
    out["amp_speedup"] = (out["mixed_float16"]["images_per_second"]
                          / out["float32"]["images_per_second"]
                          if set(KERAS_PRECISIONS) <= set(best) else None)
    return out


def host_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def feed(engine: str, precision: str, size: int, batch: int, steps: int, warmup: int,
         images: int, layout: tuple[int, ...] = DENSENET121,
         architecture: str = "densenet121") -> dict:
    """Step time fed by the trainer's input pipeline over real shards vs by a batch in memory."""
    from bench.shard_bench import make_images
    from components.shard.sharding import ShardConfig, shard_dataset
    from components.train_image.contract import TrainConfig
    from components.train_image.model import train_input

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as workdir:
        # photo-like JPEGs (bench.shard_bench), sharded by the sharding step, all for training
        make_images(os.path.join(workdir, "images"), images)
        shards = os.path.join(workdir, "shards")
        manifest = shard_dataset(os.path.join(workdir, "images"), shards, ShardConfig(
            image_size=size, min_shards_per_split=16, train_fraction=1.0,
            validation_fraction=0.0, test_fraction=0.0), progress=False)
        classes = len(manifest["classes"])
        config = TrainConfig(weights="none", batch_size=batch)
        dataset = train_input(shards, manifest, config, batch)
        model = ENGINES[engine](classes, size, precision, layout, architecture)
        memory = memory_batch(batch, size, classes)
        from_memory = step_seconds(model, memory, steps, warmup)
        from_shards = step_seconds(model, dataset, steps, warmup)
        from_memory = min(from_memory, step_seconds(model, memory, steps, warmup))
        iterator = iter(dataset)  # the input pipeline alone, no model consuming it
        next(iterator)  # fill the interleave and prefetch buffers
        start = time.perf_counter()
        for _ in range(steps):
            next(iterator)
        host = batch * steps / (time.perf_counter() - start)
    return {"precision": precision, "host_cores": host_cores(), "shard_images": images,
            "step_from_memory_s": from_memory, "step_from_shards_s": from_shards,
            "feed_ratio": from_shards / from_memory,
            "model_images_per_second": batch / from_memory,
            "pipeline_images_per_second": host}


def fastai_tokens(gpus: list[dict], batch: int, doc_len: int, batches: int, rounds: int,
                  arch: dict, vocab: int = 30000, labels: int = 7) -> dict:
    """AWD-LSTM classifier training tokens/s in fp32, fp16 and bf16 autocast, same batches."""
    import torch
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.text.all import (
        AWD_LSTM,
        BCEWithLogitsLossFlat,
        Callback,
        TextLearner,
        awd_lstm_clas_config,
        awd_lstm_clas_split,
        get_text_classifier,
    )

    from components.common.fastai_text import mixed_precision, quiet

    device = torch.device("cuda" if gpus else "cpu")
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, vocab, (batch * batches, doc_len), generator=generator)
    targets = (torch.rand(batch * batches, labels, generator=generator) < 0.3).float()
    items = list(zip(tokens, targets))
    dls = DataLoaders(DataLoader(items, bs=batch, shuffle=True, drop_last=True),
                      DataLoader(items[:batch], bs=batch), device=device)

    class TrainTime(Callback):
        def before_train(self):
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.start = time.perf_counter()

        def after_train(self):
            if device.type == "cuda":
                torch.cuda.synchronize()
            self.learn.train_seconds = time.perf_counter() - self.start

    def learner(precision: str):
        config = {**awd_lstm_clas_config, **arch}
        model = get_text_classifier(AWD_LSTM, vocab, labels, seq_len=72, config=config,
                                    drop_mult=0.3, max_len=72 * 20)
        learn = TextLearner(dls, model, loss_func=BCEWithLogitsLossFlat(),
                            splitter=awd_lstm_clas_split, cbs=[TrainTime()])
        quiet(learn)
        return mixed_precision(learn, precision)

    learners = {name: learner(name) for name in TEXT_PRECISIONS}
    best = {name: float("inf") for name in learners}
    for learn in learners.values():
        learn.fit(1, 1e-3)  # warm-up: cuDNN picks its kernels
    for _ in range(rounds):
        for name, learn in learners.items():
            learn.fit(1, 1e-3)
            best[name] = min(best[name], learn.train_seconds)
    count = batch * batches * doc_len
    out = {"device": gpus[0]["name"] if gpus else "CPU", "batch": batch, "doc_tokens": doc_len,
           "arch": {k: awd_lstm_clas_config[k] if k not in arch else arch[k]
                    for k in ("emb_sz", "n_hid", "n_layers")}}
    for name, seconds in best.items():
        out[name] = {"tokens_per_second": count / seconds,
                     "speedup": best["fp32"] / seconds}
    return out


def report(results: dict) -> str:
    """The results as aligned lines, one figure per line."""
    lines = []
    if "choices" in results:
        c = results["choices"]
        lines += [f"devices          {', '.join(c['gpus']) or 'CPU only'}",
                  f"strategy         {c['strategy']}",
                  f"keras precision  {c['keras_precision']}",
                  f"fastai precision {c['fastai_precision']}"]
    if "densenet" in results:
        d = results["densenet"]
        lines.append(f"{d['architecture']} {d['image_size']}px batch {d['batch']} "
                     f"({d['engine']}, {d['device']}; {d['forward_gflop']:.3g} GFLOP forward)")
        for precision in (p for p in KERAS_PRECISIONS if p in d):
            p = d[precision]
            share = p["share_of_peak"]
            lines.append(f"  {precision:<14} {p['images_per_second']:9.1f} img/s "
                         f"{p['tflops']:8.2f} TFLOP/s  "
                         f"{'-' if share is None else f'{100 * share:.1f}'}% of peak")
        if d["amp_speedup"] is not None:
            lines.append(f"  AMP speed-up   {d['amp_speedup']:.2f}x")
    if "feed" in results:
        f = results["feed"]
        lines += [f"feed ({f['precision']}, {f['host_cores']} host cores, "
                  f"{f['shard_images']} sharded images)",
                  f"  step from memory  {1000 * f['step_from_memory_s']:.1f} ms "
                  f"({f['model_images_per_second']:.1f} img/s)",
                  f"  step from shards  {1000 * f['step_from_shards_s']:.1f} ms",
                  f"  feed ratio        {f['feed_ratio']:.3f}",
                  f"  pipeline alone    {f['pipeline_images_per_second']:.1f} img/s"]
    if "fastai" in results:
        t = results["fastai"]
        lines.append(f"AWD-LSTM classifier batch {t['batch']} x {t['doc_tokens']} tokens "
                     f"({t['device']}, {t['arch']})")
        for name in TEXT_PRECISIONS:
            lines.append(f"  {name:<14} {t[name]['tokens_per_second']:11.0f} tokens/s "
                         f"{t[name]['speedup']:5.2f}x")
    for section, reason in results.get("skipped", {}).items():
        lines.append(f"{section}: skipped ({reason})")
    return "\n".join(lines)


def _precisions(text: str) -> tuple[str, ...]:
    """--precisions as a tuple, some of KERAS_PRECISIONS."""
    precisions = tuple(p for p in text.split(",") if p)
    if not precisions or set(precisions) - set(KERAS_PRECISIONS):
        raise argparse.ArgumentTypeError(
            f"--precisions takes some of {list(KERAS_PRECISIONS)}, got {text!r}")
    return precisions


def _layout(text: str) -> tuple[int, ...]:
    """--layout as a tuple of four positive block counts."""
    layout = tuple(int(n) for n in text.split(",") if n.isdigit())
    if len(layout) != 4 or len(text.split(",")) != 4 or min(layout) < 1:
        raise argparse.ArgumentTypeError(
            f"--layout takes four positive block counts (conv2..conv5), e.g. 6,12,24,16; "
            f"got {text!r}")
    return layout


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=ENGINES, default="tf-keras")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64, help="images per DenseNet step")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="alternations; best kept")
    parser.add_argument("--shard-images", type=int, default=2048)
    parser.add_argument("--host-cores", type=int, default=0,
                        help="run on this many CPU cores only (0: all), like a smaller machine")
    parser.add_argument("--text-batch", type=int, default=64)
    parser.add_argument("--doc-tokens", type=int, default=400)
    parser.add_argument("--text-batches", type=int, default=20)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--precisions", type=_precisions,  # DenseNet's
                        default=",".join(KERAS_PRECISIONS))
    parser.add_argument("--layout", type=_layout, default=None,
                        help="dense blocks per stage, e.g. 6,12,32,32 for DenseNet169 "
                             "(default DenseNet121's 6,12,24,16; --smoke: 1,1,1,1)")
    parser.add_argument("--architecture", choices=("densenet121", "efficientnet_lite0"),
                        default="densenet121", help="the image network the densenet and feed "
                        "sections train (tf-keras engine only for efficientnet_lite0)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes: checks the bench runs, measures nothing useful")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    if not 0 <= args.host_cores <= host_cores():
        parser.error(f"--host-cores must be between 0 (all) and {host_cores()}, "
                     f"the cores this process may use; got {args.host_cores}")
    if args.host_cores:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.host_cores])
    layout = args.layout or (SMOKE_LAYOUT if args.smoke else DENSENET121)
    size, batch, steps, warmup, arch = args.image_size, args.batch, args.steps, 5, {}
    if args.smoke:
        size, batch, steps, warmup = 32, 4, 2, 1
        args.shard_images, args.rounds = 40, 1
        args.text_batch, args.doc_tokens, args.text_batches = 4, 24, 2
        arch = {"emb_sz": 16, "n_hid": 32, "n_layers": 1}

    if args.architecture != "densenet121" and args.engine != "tf-keras":
        parser.error("--architecture efficientnet_lite0 is built by the tf-keras engine only")
    gpus = visible_gpus()
    picked = choices(gpus)
    results: dict = {"choices": picked} if "choices" in sections else {}
    runs = {
        "densenet": lambda: densenet(args.engine, gpus, size, batch, steps, warmup, args.rounds,
                                     args.precisions, layout, args.architecture),
        "feed": lambda: feed(args.engine, picked["keras_precision"], size, batch, steps, warmup,
                             args.shard_images, layout, args.architecture),
        "fastai": lambda: fastai_tokens(gpus, args.text_batch, args.doc_tokens,
                                        args.text_batches, args.rounds, arch),
    }
    for section in sections:
        if section in runs:
            try:
                results[section] = runs[section]()
            except ImportError as err:  # a framework this machine lacks: say which
                results.setdefault("skipped", {})[section] = f"needs {err.name}"
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
