"""The LM trainer's memory epoch by epoch: as it is, and with fastai's per-batch loss
tensors kept (as before the fix in `components.common.fastai_text.EpochEnd`).

    python bench/lm_memory_bench.py [--tokens 1000000] [--types 15000] [--epochs 3]
        [--model-config '{"emb_sz": 64, "n_hid": 256, "n_layers": 2}'] [--output runs/lm-memory]
        [--variants fixed,as-is] [--precisions mixed,fp32] [--batch-size 64]

Writes one corpus of made-up words drawn by Zipf's law (`--tokens` of them, `--types`
distinct: a vocabulary the size of a real corpus's, whose softmax makes the large per-batch
temporaries that fragment the heap), then trains `train_language_model` on it once per
variant, each in a process of its own and one after the other (they would compete for the
cores). Prints, per variant and epoch, the resident memory at the epoch's end, the peak so
far (ru_maxrss), the CPU and wall seconds the epoch took and the validation loss; on a
GPU also what torch holds there at the epoch's end, its peak in the epoch and what its
allocator reserves. Then each run's growth from the first epoch's end to the last's.
`--precisions`: `mixed` is the step's default (bf16 or fp16 where a GPU has them), `fp32`
turns it off. Not a test: at 1M tokens an epoch takes minutes on a CPU.
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

VARIANTS = ("fixed", "as-is")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _gpu_mb() -> dict:
    """What torch holds on the GPU now, its peak since the last reset and what its allocator
    reserves (MiB); {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    mib = 2 ** 20
    return {"gpu_mb": round(torch.cuda.memory_allocated() / mib, 1),
            "gpu_peak_mb": round(torch.cuda.max_memory_allocated() / mib, 1),
            "gpu_reserved_mb": round(torch.cuda.memory_reserved() / mib, 1)}


def child(variant: str, corpus: str, output: str, epochs: int, model_config: dict,
          mixed: bool = True, batch_size: int = 64) -> None:
    """One training run, printing a JSON line per epoch."""
    import torch
    from fastai.text.all import Callback

    from components.common.fastai_text import EpochEnd
    from components.train_lm.contract import LMConfig
    from components.train_lm.training import train_language_model

    if variant == "as-is":
        EpochEnd.after_batch = lambda self: None  # the Recorder's tensors stay, as before

    memory = []  # at each epoch's end; the trainer's own history has the rest

    class Probe(Callback):
        order = 99

        def before_epoch(self):
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()

        def after_epoch(self):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            memory.append({"rss_mb": round(_rss_mb(), 1),
                              "peak_mb": round(resource.getrusage(
                                  resource.RUSAGE_SELF).ru_maxrss / 1024, 1), **_gpu_mb()})

    config = LMConfig(epochs=epochs, model_config=model_config, mixed_precision=mixed,
                      batch_size=batch_size)
    metrics = train_language_model(corpus, output, config, callbacks=[Probe()])
    history = metrics["directions"]["forward"]["history"]  # one direction: the default
    for at_end, epoch in zip(memory, history, strict=True):
        print(json.dumps({"variant": variant, "epoch": epoch["epoch"], **at_end,
                          "cpu_s": round(epoch["cpu_seconds"], 1),
                          "wall_s": round(epoch["seconds"], 2),
                          "valid_loss": round(epoch["valid_loss"], 4)}), flush=True)
    print(json.dumps({"variant": variant, "precision": metrics["run"]["precision"],
                      "perplexity": metrics["perplexity"]}), flush=True)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--types", type=int, default=15_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--model-config", default='{"emb_sz": 64, "n_hid": 256, "n_layers": 2}')
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--output", default="runs/lm-memory")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--precisions", default="mixed", help="mixed (the default) and/or fp32")
    p.add_argument("--json", help="also write every epoch's row here")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--precision", choices=("mixed", "fp32"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    corpus = os.path.join(args.output, "corpus.txt")
    if args.child:
        child(args.child, corpus, os.path.join(args.output, f"{args.child}-{args.precision}"),
              args.epochs, json.loads(args.model_config), args.precision == "mixed",
              args.batch_size)
        return 0
    os.makedirs(args.output, exist_ok=True)
    write_zipf_corpus(corpus, args.tokens, args.types)
    print(f"corpus: {args.tokens} tokens of {args.types} words; model {args.model_config}; "
          f"batch {args.batch_size}; {args.epochs} epochs", flush=True)
    rows, finals, failed = {}, {}, []
    for precision in args.precisions.split(","):
        for variant in args.variants.split(","):
            run_name = f"{variant}/{precision}"
            run = subprocess.run([sys.executable, __file__, "--child", variant,
                                  "--precision", precision, "--output", args.output,
                                  "--epochs", str(args.epochs), "--batch-size",
                                  str(args.batch_size), "--model-config", args.model_config],
                                 capture_output=True, text=True)
            lines = [json.loads(line) for line in run.stdout.splitlines()
                     if line.startswith('{"variant"')]
            rows[run_name] = [row for row in lines if "epoch" in row]
            finals[run_name] = next((row for row in lines if "perplexity" in row), {})
            if run.returncode:
                failed.append(run_name)
                print(f"{run_name} failed ({run.returncode}):\n{run.stderr[-3000:]}", flush=True)
            for row in rows[run_name]:
                _print_epoch(run_name, row)
            if finals[run_name]:
                print(f"{run_name}: trained in {finals[run_name]['precision']}, perplexity "
                      f"{finals[run_name]['perplexity']}", flush=True)
    _print_growth(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"epochs": rows, "final": finals, "args": vars(args)}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
