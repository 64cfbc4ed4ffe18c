"""The LM trainer's resident memory epoch by epoch: as it is, and with fastai's per-batch
loss tensors kept (as before the fix in `components.common.fastai_text.EpochEnd`).

    python bench/lm_memory_bench.py [--tokens 1000000] [--types 15000] [--epochs 3]
        [--model-config '{"emb_sz": 64, "n_hid": 256, "n_layers": 2}'] [--output runs/lm-memory]

Writes one corpus of made-up words drawn by Zipf's law (`--tokens` of them, `--types`
distinct: a vocabulary the size of a real corpus's, whose softmax makes the large per-batch
temporaries that fragment the heap), then trains `train_language_model` on it once per
variant, each in a process of its own and one after the other (they would compete for the
cores). Prints, per variant and epoch, the resident memory at the epoch's end, the peak so
far (ru_maxrss) and the CPU seconds the epoch took; then each variant's growth from the
first epoch's end to the last's. Not a test: at 1M tokens an epoch takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.datamakers.zipf_corpus import write_zipf_corpus  # noqa: E402 (after the path)

VARIANTS = ("fixed", "as-is")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def child(variant: str, corpus: str, output: str, epochs: int, model_config: dict) -> None:
    """One training run, printing a JSON line per epoch."""
    from fastai.text.all import Callback

    from components.common.fastai_text import EpochEnd
    from components.train_lm.contract import LMConfig
    from components.train_lm.training import train_language_model

    if variant == "as-is":
        EpochEnd.after_batch = lambda self: None  # the Recorder's tensors stay, as before

    class Probe(Callback):
        order = 99

        def before_epoch(self):
            self.cpu = time.process_time()

        def after_epoch(self):
            print(json.dumps({"variant": variant, "epoch": self.epoch + 1,
                              "rss_mb": round(_rss_mb(), 1),
                              "peak_mb": round(resource.getrusage(
                                  resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                              "cpu_s": round(time.process_time() - self.cpu, 1)}), flush=True)

    train_language_model(corpus, output, LMConfig(epochs=epochs, model_config=model_config),
                         callbacks=[Probe()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--types", type=int, default=15_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--model-config", default='{"emb_sz": 64, "n_hid": 256, "n_layers": 2}')
    p.add_argument("--output", default="runs/lm-memory")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    corpus = os.path.join(args.output, "corpus.txt")
    if args.child:
        child(args.child, corpus, os.path.join(args.output, args.child), args.epochs,
              json.loads(args.model_config))
        return 0
    os.makedirs(args.output, exist_ok=True)
    write_zipf_corpus(corpus, args.tokens, args.types)
    print(f"corpus: {args.tokens} tokens of {args.types} words; model {args.model_config}; "
          f"{args.epochs} epochs", flush=True)
    rows = {}
    for variant in args.variants.split(","):
        run = subprocess.run([sys.executable, __file__, "--child", variant,
                              "--output", args.output, "--epochs", str(args.epochs),
                              "--model-config", args.model_config],
                             capture_output=True, text=True, check=True)
        rows[variant] = [json.loads(line) for line in run.stdout.splitlines()
                         if line.startswith('{"variant"')]
        for row in rows[variant]:
            print(f"{variant:>7} epoch {row['epoch']}: RSS {row['rss_mb']:8.1f} MB, "
                  f"peak {row['peak_mb']:8.1f} MB, {row['cpu_s']:7.1f} CPU s", flush=True)
    for variant, epochs in rows.items():
        growth = epochs[-1]["rss_mb"] - epochs[0]["rss_mb"]
        print(f"{variant}: RSS from the end of epoch 1 to the end of epoch {len(epochs)}: "
              f"{growth:+.1f} MB ({growth / max(len(epochs) - 1, 1):+.1f} MB an epoch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
