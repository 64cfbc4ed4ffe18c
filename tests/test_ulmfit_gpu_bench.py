"""bench/ulmfit_gpu.py: its figures from a run's files, and its smoke on a CPU (the figures
it printed on a GPU are in docs/measurements.md)."""

import pytest

from bench import ulmfit_gpu
from tests.bench_runs import run_bench


def test_a_runs_figures_come_from_its_metrics_and_its_evaluation():
    result = {"run": {"precision": "bf16", "device": "cuda:0", "train_tokens": 9000,
                      "seconds": 40.5, "classifier_epoch_seconds": [4.0, 2.0, 3.0],
                      "lm_discarded": False}}
    evaluation = {"micro_f1": 0.7, "macro_f1": 0.6, "baseline": {
        "tfidf_logreg": {"micro_f1": 0.72}, "every_label": {"micro_f1": 0.25}}}
    held = {"lm": [900.0], "classifier": [310.0, 312.5, 312.5]}
    row = ulmfit_gpu.run_row(result, evaluation, held, dataset="debian", mixed=True, batch=16,
                             seed=2, peak_mib=1800.0)
    assert row["epochs"] == 3 and row["epoch_seconds"] == 3.0  # the classifier's, averaged
    assert row["train_tokens_per_second"] == 3000.0
    assert (row["precision"], row["step_seconds"], row["peak_gpu_mib"]) == ("bf16", 40.5, 1800.0)
    assert row["held_gpu_mib"] == held
    assert (row["test_micro_f1"], row["tfidf_micro_f1"], row["constant_micro_f1"]) == (
        0.7, 0.72, 0.25)


@pytest.mark.slow
def test_smoke_trains_and_scores_beside_the_baselines(tmp_path):
    results, _ = run_bench(tmp_path, "ulmfit_gpu.py", "--smoke", "--seeds", "1",
                           "--precisions", "mixed", timeout=300)
    (row,) = results["rows"]
    # mixed precision asked for, none on a CPU; no GPU memory to count
    assert (row["precision"], row["device"], row["peak_gpu_mib"]) == ("fp32", "cpu", None)
    assert row["held_gpu_mib"]["lm"] == [None] and row["held_gpu_mib"]["classifier"]
    assert 0 <= row["test_micro_f1"] <= 1 and 0 < row["tfidf_micro_f1"] <= 1
    assert 0 < row["constant_micro_f1"] <= 1
