"""bench/transformer_gpu.py: its figures from a run's files, and its smoke on a CPU (the
figures it printed on an H100 are in docs/measurements.md)."""

import pytest

from bench import transformer_gpu
from tests.bench_runs import run_bench


def test_a_runs_figures_come_from_its_metrics_and_its_evaluation():
    result = {"run": {"precision": "bf16", "world_size": 1, "device": "cuda:0",
                      "train_tokens": 6000, "seconds": 12.5},
              "history": [{"epoch": 1, "seconds": 3.0}, {"epoch": 2, "seconds": 1.0}]}
    evaluation = {"micro_f1": 0.7, "macro_f1": 0.6, "baseline": {"tfidf_logreg": {
        "micro_f1": 0.65}}}
    row = transformer_gpu.run_row(result, evaluation, dataset="debian", mixed=True, batch=16,
                                  seed=2, launcher=False, memory_mib=414.0)
    assert row["epochs"] == 2 and row["epoch_seconds"] == 2.0  # the mean of the epochs
    assert row["train_tokens_per_second"] == 3000.0  # the training split once an epoch
    assert (row["precision"], row["step_seconds"], row["peak_gpu_mib"]) == ("bf16", 12.5, 414.0)
    assert (row["test_micro_f1"], row["tfidf_micro_f1"]) == (0.7, 0.65)


@pytest.mark.slow
def test_smoke_trains_and_scores_directly_and_through_the_launcher(tmp_path):
    results, _ = run_bench(tmp_path, "transformer_gpu.py", "--smoke", "--seeds", "1",
                           "--precisions", "mixed", "--launcher")
    direct, launched = results["rows"]
    assert (direct["launcher"], launched["launcher"]) == (False, True)
    for row in (direct, launched):
        # mixed precision asked for, none on a CPU; one process either way
        assert (row["precision"], row["world_size"]) == ("fp32", 1)
        assert row["device"].startswith("cpu")  # "cpu:0" in a launched process
        assert row["epochs"] == 1 and row["peak_gpu_mib"] is None
        assert 0 <= row["test_micro_f1"] <= 1 and 0 < row["tfidf_micro_f1"] <= 1
    # The launched process trains the same model from the same seed.
    assert launched["test_micro_f1"] == direct["test_micro_f1"]
