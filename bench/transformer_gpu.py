"""The transformer trainer on the device at hand: speed, memory and test scores per precision
and batch, over seeds, next to TF-IDF on the same split.

    python bench/transformer_gpu.py --dataset DIR [--dataset DIR ...] --model FOLDER
        [--precisions mixed,fp32] [--batches 16] [--seeds 1,2,3] [--epochs 4]
        [--learning-rate 1e-4] [--launcher] [--json FILE] [--smoke]

Each run is the training step's own entry (`launch.train`) on a prepared text dataset (one
fixed split; the seed draws the head's initialisation and the batch order), then the
evaluation step's scoring on its test split beside TF-IDF + logistic regression. `mixed` is
the step's default (bf16 on compute capability 8.0+, fp16 on 7.x, fp32 on a CPU); `fp32`
turns it off. Prints per run the precision chosen, the mean epoch, training tokens a
second, the step's seconds, torch's peak GPU memory and test micro / macro F1.

--launcher: one more run per dataset through torch's elastic launcher (one process: the
path of a machine with several GPUs), at the first precision, batch and seed.
--smoke: a tiny BERT made here on generated reviews, one epoch: for the test suite on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from components.evaluate_text.evaluation import evaluate_text_model  # noqa: E402
from components.train_transformer import launch  # noqa: E402
from components.train_transformer.contract import TransformerConfig  # noqa: E402

PRECISIONS = {"mixed": True, "fp32": False}
SMOKE = dict(max_length=48, epochs=1, learning_rate=1e-3, early_stopping_patience=0)


def peak_memory_reset() -> None:
    """Starts counting the peak of torch's GPU allocations afresh (nothing without a GPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def gpu_memory_mib(peak: bool = True) -> float | None:
    """The most GPU memory torch allocated in this process since the reset or, not `peak`,
    what it holds now, in MiB (None without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    held = torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()
    return round(held / 2**20, 1)


def figures(run: dict, epoch_seconds: list[float], evaluation: dict, **where) -> dict:
    """The figures both text GPU benches give of a run: `where` (its settings), the mean
    epoch, tokens a second, the step's seconds and the test scores beside TF-IDF's."""
    mean_epoch = sum(epoch_seconds) / len(epoch_seconds)
    return {
        **where, "precision": run["precision"], "device": run["device"],
        "epochs": len(epoch_seconds), "epoch_seconds": round(mean_epoch, 3),
        "train_tokens_per_second": round(run["train_tokens"] / mean_epoch, 1),
        "step_seconds": run["seconds"],
        "test_micro_f1": evaluation["micro_f1"], "test_macro_f1": evaluation["macro_f1"],
        "tfidf_micro_f1": evaluation["baseline"]["tfidf_logreg"]["micro_f1"],
    }


def run_row(result: dict, evaluation: dict, *, dataset: str, mixed: bool, batch: int, seed: int,
            launcher: bool, memory_mib: float | None) -> dict:
    """One run's figures from the trainer's result (metrics.json) and the test evaluation."""
    return figures(result["run"], [row["seconds"] for row in result["history"]], evaluation,
                   dataset=dataset, mixed_precision=mixed, batch=batch, seed=seed,
                   launcher=launcher, world_size=result["run"]["world_size"],
                   peak_gpu_mib=memory_mib)


def one_run(dataset: str, config: TransformerConfig, launcher: bool) -> dict:
    """Trains and evaluates once in a scratch folder it removes; the row of figures."""
    with tempfile.TemporaryDirectory(prefix="transformer_gpu_",
                                     ignore_cleanup_errors=True) as scratch:
        model_dir = os.path.join(scratch, "model")
        peak_memory_reset()
        if launcher:
            from torch.distributed.launcher.api import elastic_launch

            result = elastic_launch(launch.launch_config(None, 1), launch.launched_process)(
                (dataset, model_dir, config, {}))[0]
        else:
            result = launch.train(dataset, model_dir, config)
        memory = None if launcher else gpu_memory_mib()  # a launched process's is its own
        evaluation = evaluate_text_model(model_dir, dataset, os.path.join(scratch, "eval"))
        return run_row(result, evaluation, dataset=os.path.basename(dataset.rstrip("/")),
                       mixed=config.mixed_precision, batch=config.batch_size,
                       seed=config.seed, launcher=launcher, memory_mib=memory)


def smoke_dataset(folder: str) -> str:
    """A prepared multi-label review dataset (120 generated rows), for a CPU run."""
    from components.prepare_text.preparation import PrepareConfig, prepare_text_dataset
    from tools.datamakers.demo_text import write_reviews_csv

    csv, dataset = os.path.join(folder, "reviews.csv"), os.path.join(folder, "reviews")
    write_reviews_csv(csv, rows=120, seed=3)
    prepare_text_dataset(csv, dataset, PrepareConfig())
    return dataset


def smoke_inputs(folder: str) -> tuple[str, str]:
    """`smoke_dataset` and a tiny BERT made on its texts, for a CPU run."""
    from components.prepare_text.contract import read_split
    from components.train_transformer.tiny import write_tiny_model

    dataset, model = smoke_dataset(folder), os.path.join(folder, "tiny")
    write_tiny_model(read_split(dataset, "train")["text"], model, hidden_size=32, heads=2,
                     max_length=64)
    return dataset, model


def grid_parser(doc: str, epochs: int, learning_rate: float) -> argparse.ArgumentParser:
    """The options both text GPU benches share (the runs' grid, epochs, rate, --json, --smoke)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--dataset", action="append", default=[])
    parser.add_argument("--precisions", default="mixed,fp32")
    parser.add_argument("--batches", default="16")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--learning-rate", type=float, default=learning_rate)
    parser.add_argument("--json", default="")
    parser.add_argument("--smoke", action="store_true")
    return parser


def grid(parser: argparse.ArgumentParser, args: argparse.Namespace
         ) -> list[tuple[str, bool, int, int]]:
    """(dataset, mixed precision, batch, seed) of each run the grid's options ask for."""
    unknown = set(args.precisions.split(",")) - set(PRECISIONS)
    if unknown:
        parser.error(f"--precisions: {sorted(unknown)} not among {sorted(PRECISIONS)}")
    return [(dataset, PRECISIONS[precision], int(batch), int(seed))
            for dataset in args.dataset for precision in args.precisions.split(",")
            for batch in args.batches.split(",") for seed in args.seeds.split(",")]


def run_plan(plan: list[tuple], run, print_row, path: str) -> None:
    """`run(*entry)` for each entry of `plan`, its row printed; the rows so far written to
    `path` (if any) after every run, for a time limit's sake."""
    rows, started = [], time.monotonic()
    for entry in plan:
        rows.append(run(*entry))
        print_row(rows[-1])
        if path:
            with open(path, "w") as f:
                json.dump({"rows": rows, "seconds": round(time.monotonic() - started, 1)}, f,
                          indent=1)


def print_row(row: dict) -> None:
    memory = "-" if row["peak_gpu_mib"] is None else f"{row['peak_gpu_mib']:.0f}"
    print(f"{row['dataset']:<12} {row['precision']:<5} {row['batch']:>5} {row['seed']:>4} "
          f"{'elastic' if row['launcher'] else 'direct':<7} {row['epochs']:>2} "
          f"{row['epoch_seconds']:>8.2f} {row['train_tokens_per_second']:>10.0f} "
          f"{row['step_seconds']:>7.1f} {memory:>7} | {row['test_micro_f1']:.3f} / "
          f"{row['test_macro_f1']:.3f} | {row['tfidf_micro_f1']:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = grid_parser(__doc__, epochs=4, learning_rate=1e-4)
    parser.add_argument("--model", default="")
    parser.add_argument("--launcher", action="store_true")
    args = parser.parse_args(argv)
    settings = dict(epochs=args.epochs, learning_rate=args.learning_rate)
    if args.smoke:
        dataset, args.model = smoke_inputs(tempfile.mkdtemp(prefix="transformer_smoke_"))
        args.dataset = [dataset]
        settings = SMOKE
    if not args.dataset or not args.model:
        parser.error("--dataset and --model are needed (or --smoke)")
    plan = [(*run, False) for run in grid(parser, args)]
    if args.launcher:
        plan += [(dataset, *plan[0][1:4], True) for dataset in args.dataset]
    print("dataset      prec  batch seed launch  ep  s/epoch   tokens/s  step s peakMiB "
          "| test micro / macro F1 | TF-IDF micro")
    run_plan(plan, lambda dataset, mixed, batch, seed, launcher: one_run(
        dataset, TransformerConfig(model_name=args.model, batch_size=batch, seed=seed,
                                   mixed_precision=mixed, **settings), launcher),
        print_row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
