"""The LM trainer's resident memory, batch by batch and epoch by epoch, with and without
its fixes.

    python bench/lm_memory_bench.py [--corpus zipf|english] [--tokens 1000000] [--types 15000]
        [--epochs 3] [--model-config '{"emb_sz": 64, "n_hid": 256, "n_layers": 2}']
        [--output runs/lm-memory] [--variants fixed,before] [--precisions mixed,fp32]
        [--batch-size 64] [--max-vocab N] [--min-freq N] [--sample-every 200]
        [--time-limit MINUTES]

`--corpus zipf` (the default): made-up words drawn by Zipf's law (`--tokens`, `--types`
distinct: a real corpus's vocabulary, whose softmax temporaries fragment the heap).
`--corpus english`: the English LM corpus of `bench/ulmfit_bench.py --lm-corpus english`
and, unless given, that LM's settings (`ENGLISH`: issue 56's configuration).

Trains `train_language_model` once per variant, each in a process of its own, one after
the other: `fixed`, the trainer as it is; `before`, without malloc_trim
(`fastai_text.TRIM_EVERY_BATCHES` = 0: before issue 56); `tensors-kept`, that and fastai's
per-batch loss tensors kept (before issue 44's fix in `EpochEnd`). Prints resident memory
(RSS, peak, CPU and wall seconds) every `--sample-every` batches and at each epoch's end
(with the validation loss, and on a GPU torch's allocated, peak and reserved memory), then
each run's growth from the first epoch's end to the last's; rows also go to
`<output>/<variant>-<precision>.jsonl`. `--time-limit` stops a run (its rows kept).
`--precisions`: `mixed` is the step's default, `fp32` turns it off. Not a test: minutes
an epoch on a CPU (docs/measurements.md has the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.datamakers.zipf_corpus import write_zipf_corpus  # noqa: E402 (after the path)

VARIANTS = ("fixed", "before", "tensors-kept")
# --corpus english: the English LM of bench/ulmfit_bench.py (issue 56's configuration)
ENGLISH = {"model_config": '{"emb_sz": 200, "n_hid": 512, "n_layers": 2}', "batch_size": 32,
           "max_vocab": 15000, "min_freq": 3, "epochs": 2, "sample_every": 200}
ZIPF = {"model_config": '{"emb_sz": 64, "n_hid": 256, "n_layers": 2}', "batch_size": 64,
        "max_vocab": 60000, "min_freq": 3, "epochs": 3, "sample_every": 0}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _gpu_mb() -> dict:
    """Torch's allocated, peak and reserved GPU memory (MiB); {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    mib = 2 ** 20
    return {"gpu_mb": round(torch.cuda.memory_allocated() / mib, 1),
            "gpu_peak_mb": round(torch.cuda.max_memory_allocated() / mib, 1),
            "gpu_reserved_mb": round(torch.cuda.memory_reserved() / mib, 1)}


def child(variant: str, corpus: str, output: str, epochs: int, model_config: dict,
          mixed: bool = True, batch_size: int = 64, max_vocab: int = 60000,
          min_freq: int = 3, sample_every: int = 0) -> None:
    """One training run, printing a JSON line per sample and per epoch."""
    import time

    import torch
    from fastai.text.all import Callback

    from components.common import fastai_text
    from components.common.fastai_text import EpochEnd
    from components.train_lm.contract import LMConfig
    from components.train_lm.training import train_language_model

    if variant in ("before", "tensors-kept"):
        fastai_text.TRIM_EVERY_BATCHES = 0  # EpochEnd reads it when the trainer makes one
    if variant == "tensors-kept":
        EpochEnd.after_batch = lambda self: None  # the Recorder's tensors stay, as before
    trims = {"calls": 0, "seconds": 0.0}
    release = fastai_text.release_freed_memory

    def timed_release():
        start = time.perf_counter()
        try:
            return release()
        finally:
            trims["calls"] += 1
            trims["seconds"] += time.perf_counter() - start

    fastai_text.release_freed_memory = timed_release  # EpochEnd takes it when made

    def peak_mb() -> float:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)

    memory = []  # at each epoch's end; the trainer's own history has the rest
    clock = {"cpu": time.process_time(), "wall": time.monotonic(), "batch": 0}

    def sample(**where) -> None:
        print(json.dumps({"variant": variant, **where, "rss_mb": round(_rss_mb(), 1),
                          "peak_mb": peak_mb(),
                          "cpu_s": round(time.process_time() - clock["cpu"], 1),
                          "wall_s": round(time.monotonic() - clock["wall"], 1),
                          "trims": trims["calls"],
                          "trim_s": round(trims["seconds"], 3)}), flush=True)

    class Probe(Callback):
        order = 99

        def before_fit(self):
            clock.update(cpu=time.process_time(), wall=time.monotonic())
            sample(sample="fit start", batch=0)

        def before_epoch(self):
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()

        def after_batch(self):
            if self.training:
                clock["batch"] += 1
                if sample_every and clock["batch"] % sample_every == 0:
                    sample(sample="batch", batch=clock["batch"], epoch=self.epoch + 1)

        def after_epoch(self):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            memory.append({"rss_mb": round(_rss_mb(), 1), "peak_mb": peak_mb(),
                           "batch": clock["batch"], **_gpu_mb()})

    config = LMConfig(epochs=epochs, model_config=model_config, mixed_precision=mixed,
                      batch_size=batch_size, max_vocab=max_vocab, min_freq=min_freq)
    metrics = train_language_model(corpus, output, config, callbacks=[Probe()])
    history = metrics["directions"]["forward"]["history"]  # one direction: the default
    for at_end, epoch in zip(memory, history, strict=True):
        print(json.dumps({"variant": variant, "epoch": epoch["epoch"], **at_end,
                          "cpu_s": round(epoch["cpu_seconds"], 1),
                          "wall_s": round(epoch["seconds"], 2),
                          "valid_loss": round(epoch["valid_loss"], 4),
                          "trims": trims["calls"], "trim_s": round(trims["seconds"], 3)}),
              flush=True)
    print(json.dumps({"variant": variant, "precision": metrics["run"]["precision"],
                      "perplexity": metrics["perplexity"], "tokens": metrics["tokens"],
                      "vocab_size": metrics["vocab_size"], "peak_mb": peak_mb()}), flush=True)


def _print_sample(run: str, row: dict) -> None:
    where = f"batch {row['batch']:5d}" if row["sample"] == "batch" else f"{row['sample']:>11}"
    print(f"{run:>12} {where}: RSS {row['rss_mb']:8.1f} MB, peak {row['peak_mb']:8.1f} MB, "
          f"{row['cpu_s']:8.1f} CPU s, {row['wall_s']:7.1f} s; {row['trims']} trims in "
          f"{row['trim_s']:.2f} s", flush=True)


def _print_epoch(run: str, row: dict) -> None:
    gpu = (f", GPU {row['gpu_mb']:7.1f} MiB (peak {row['gpu_peak_mb']:7.1f}, reserved "
           f"{row['gpu_reserved_mb']:7.1f})" if "gpu_mb" in row else "")
    print(f"{run:>12} epoch {row['epoch']}: RSS {row['rss_mb']:8.1f} MB, "
          f"peak {row['peak_mb']:8.1f} MB, {row['cpu_s']:7.1f} CPU s, {row['wall_s']:7.2f} s, "
          f"valid loss {row['valid_loss']:.4f}{gpu}", flush=True)


def _print_growth(rows: dict) -> None:
    for run, epochs in rows.items():
        if not epochs:
            continue
        span = max(len(epochs) - 1, 1)
        for key, unit in (("rss_mb", "MB RSS"), ("gpu_reserved_mb", "MiB GPU reserved")):
            if key in epochs[0]:
                growth = epochs[-1][key] - epochs[0][key]
                print(f"{run}: {unit} from the end of epoch 1 to the end of epoch "
                      f"{len(epochs)}: {growth:+.1f} ({growth / span:+.1f} an epoch)")


def _run(run_name: str, command: list[str], output: str, time_limit: float | None,
         ) -> tuple[list[dict], int]:
    """Runs one child, printing and keeping its rows as they come; stops it after
    `time_limit` seconds (returncode -9 then, the rows so far kept)."""
    import threading

    stem = os.path.join(output, run_name.replace("/", "-"))
    rows = []
    with open(stem + ".log", "w") as log, open(stem + ".jsonl", "w") as raw:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        timer = threading.Timer(time_limit, child.kill) if time_limit else None
        if timer:
            timer.start()
        try:
            for line in child.stdout:
                if not line.startswith('{"variant"'):
                    continue
                row = json.loads(line)
                rows.append(row)
                raw.write(line)
                raw.flush()
                if "sample" in row:
                    _print_sample(run_name, row)
                elif "epoch" in row:
                    _print_epoch(run_name, row)
        finally:
            if timer:
                timer.cancel()
            child.wait()
    if child.returncode and not (time_limit and child.returncode == -9):
        with open(stem + ".log") as f:
            print(f"{run_name} failed ({child.returncode}):\n{f.read()[-3000:]}", flush=True)
    elif child.returncode:
        print(f"{run_name}: stopped after the time limit ({time_limit / 60:.0f} min)",
              flush=True)
    return rows, child.returncode


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=("zipf", "english"), default="zipf")
    p.add_argument("--tokens", type=int, default=1_000_000, help="zipf: its tokens")
    p.add_argument("--types", type=int, default=15_000, help="zipf: its distinct words")
    p.add_argument("--man-characters", type=int, default=8_000_000,
                   help="english: characters of manual pages (ulmfit_bench's default)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--model-config")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--max-vocab", type=int)
    p.add_argument("--min-freq", type=int)
    p.add_argument("--sample-every", type=int,
                   help="training batches between two RSS samples (0: none)")
    p.add_argument("--time-limit", type=float, help="minutes a run may take (then stopped)")
    p.add_argument("--output", default="runs/lm-memory")
    p.add_argument("--variants", default="fixed,before")
    p.add_argument("--precisions", default="mixed", help="mixed (the default) and/or fp32")
    p.add_argument("--json", help="also write every row here")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--precision", choices=("mixed", "fp32"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    for key, value in (ENGLISH if args.corpus == "english" else ZIPF).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    corpus = os.path.join(args.output, "corpus.txt" if args.corpus == "zipf" else "english-lm")
    if args.child:
        child(args.child, corpus, os.path.join(args.output, f"{args.child}-{args.precision}"),
              args.epochs, json.loads(args.model_config), args.precision == "mixed",
              args.batch_size, args.max_vocab, args.min_freq, args.sample_every)
        return 0
    os.makedirs(args.output, exist_ok=True)
    if args.corpus == "zipf":
        write_zipf_corpus(corpus, args.tokens, args.types)
        made = f"{args.tokens} tokens of {args.types} words"
    else:
        from ulmfit_bench import write_english_corpus  # bench/ is the script's folder

        made = "English: " + ", ".join(
            f"{name} {c['characters']:,} characters"
            for name, c in write_english_corpus(corpus, 4_000_000, args.man_characters).items())
    print(f"corpus: {made}; model {args.model_config}; batch {args.batch_size}; vocabulary "
          f"<= {args.max_vocab}, min_freq {args.min_freq}; {args.epochs} epochs", flush=True)
    rows, finals, failed = {}, {}, []
    for precision in args.precisions.split(","):
        for variant in args.variants.split(","):
            run_name = f"{variant}/{precision}"
            # the child reads the same options (and fills in the same defaults)
            lines, code = _run(run_name, [
                sys.executable, __file__, *argv, "--child", variant, "--precision", precision],
                args.output, args.time_limit * 60 if args.time_limit else None)
            rows[run_name] = [row for row in lines if "epoch" in row and "sample" not in row]
            finals[run_name] = next((row for row in lines if "perplexity" in row), {})
            samples = [row for row in lines if "sample" in row]
            if code and not (args.time_limit and code == -9):
                failed.append(run_name)
            if finals[run_name]:
                print(f"{run_name}: trained in {finals[run_name]['precision']}, perplexity "
                      f"{finals[run_name]['perplexity']}, peak RSS "
                      f"{finals[run_name]['peak_mb']} MB", flush=True)
            elif samples:
                print(f"{run_name}: peak RSS so far {max(r['peak_mb'] for r in samples)} MB",
                      flush=True)
    _print_growth(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"epochs": rows, "final": finals, "args": vars(args)}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
