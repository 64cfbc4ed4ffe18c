"""The ULMFiT text classifier on the device at hand: speed, GPU memory epoch by epoch and test
scores per precision and batch, over seeds, next to the baselines on the same split.

    python bench/ulmfit_gpu.py --dataset DIR [--dataset DIR ...] [--precisions mixed,fp32]
        [--batches 16] [--seeds 1,2,3] [--epochs 12] [--learning-rate 0] [--json FILE]
        [--smoke]

Each run is the training step's own entry (`train_text_classifier`) from random weights
(no language model to carry to a device) on a prepared text dataset, then the evaluation
step's scoring beside TF-IDF + logistic regression and the constant answer, as
bench/transformer_gpu.py does; the other settings are the step's defaults (the rate found
by lr_find when `--learning-rate` is 0). Prints per run what transformer_gpu prints, with
the GPU memory torch holds at the end of the first and of the last epoch.
--smoke: a tiny AWD-LSTM on generated reviews, one epoch: for the test suite on a CPU.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.transformer_gpu import (  # noqa: E402
    figures,
    gpu_memory_mib,
    grid,
    grid_parser,
    peak_memory_reset,
    run_plan,
    smoke_dataset,
)
from components.evaluate_text.evaluation import evaluate_text_model  # noqa: E402
from components.train_text.contract import TrainConfig  # noqa: E402

SMOKE = dict(lm_epochs=1, epochs=1, learning_rate=1e-2,
             model_config={"emb_sz": 16, "n_hid": 24, "n_layers": 1})


def run_row(result: dict, evaluation: dict, held_mib: dict, *, dataset: str, mixed: bool,
            batch: int, seed: int, peak_mib: float | None) -> dict:
    """One run's figures (`figures`) with the GPU memory held at each epoch's end
    (`{"lm": [...], "classifier": [...]}`) and the constant answer's micro F1."""
    run = result["run"]
    (constant,) = [v for k, v in evaluation["baseline"].items() if k != "tfidf_logreg"]
    return figures(run, run["classifier_epoch_seconds"], evaluation, dataset=dataset,
                   mixed_precision=mixed, batch=batch, seed=seed,
                   lm_discarded=run["lm_discarded"], held_gpu_mib=held_mib,
                   peak_gpu_mib=peak_mib, constant_micro_f1=constant["micro_f1"])


def one_run(dataset: str, config: TrainConfig) -> dict:
    """Trains and evaluates once in a scratch folder it removes; the row of figures."""
    from fastai.callback.core import Callback
    from fastai.text.models.core import LinearDecoder

    from components.train_text.training import train_text_classifier

    held = {"lm": [], "classifier": []}  # at each epoch's end, lr_find's left out

    class HeldAtEpochEnd(Callback):
        order = 99

        def after_epoch(self):
            if not hasattr(self.learn, "lr_finder"):
                lm = isinstance(self.learn.model[-1], LinearDecoder)
                held["lm" if lm else "classifier"].append(gpu_memory_mib(peak=False))

    with tempfile.TemporaryDirectory(prefix="ulmfit_gpu_", ignore_cleanup_errors=True) as scratch:
        model_dir = os.path.join(scratch, "model")
        peak_memory_reset()
        result = train_text_classifier(dataset, model_dir, config, callbacks=[HeldAtEpochEnd()])
        peak = gpu_memory_mib()
        evaluation = evaluate_text_model(model_dir, dataset, os.path.join(scratch, "eval"))
        return run_row(result, evaluation, held, dataset=os.path.basename(dataset.rstrip("/")),
                       mixed=config.mixed_precision, batch=config.batch_size, seed=config.seed,
                       peak_mib=peak)


def print_row(row: dict) -> None:
    held = row["held_gpu_mib"]["classifier"]
    memory = ("-" if held[0] is None else
              f"{held[0]:.0f}->{held[-1]:.0f} ({row['peak_gpu_mib']:.0f})")
    print(f"{row['dataset']:<12} {row['precision']:<5} {row['batch']:>5} {row['seed']:>4} "
          f"{row['epochs']:>2} {row['epoch_seconds']:>8.2f} "
          f"{row['train_tokens_per_second']:>10.0f} {row['step_seconds']:>7.1f} "
          f"{memory:>18} | {row['test_micro_f1']:.3f} / {row['test_macro_f1']:.3f} | "
          f"{row['tfidf_micro_f1']:.3f} {row['constant_micro_f1']:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = grid_parser(__doc__, epochs=TrainConfig.epochs, learning_rate=0.0)
    args = parser.parse_args(argv)
    settings = dict(epochs=args.epochs, learning_rate=args.learning_rate)
    if args.smoke:
        args.dataset = [smoke_dataset(tempfile.mkdtemp(prefix="ulmfit_smoke_"))]
        settings = SMOKE
    if not args.dataset:
        parser.error("--dataset is needed (or --smoke)")
    plan = grid(parser, args)
    print("dataset      prec  batch seed ep  s/epoch   tokens/s  step s  GPU MiB 1st->last "
          "(peak) | test micro / macro F1 | TF-IDF, constant micro")
    run_plan(plan, lambda dataset, mixed, batch, seed: one_run(dataset, TrainConfig(
        pretrained=False, batch_size=batch, seed=seed, mixed_precision=mixed, **settings)),
        print_row, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
