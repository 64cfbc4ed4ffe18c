"""bench/lm_memory_bench.py's smoke on a CPU (what it printed on an H100 and here is in
docs/measurements.md)."""

import pytest

from tests.bench_runs import run_bench


@pytest.mark.slow
def test_smoke_reports_every_epoch_of_each_variant(tmp_path):
    report, printed = run_bench(
        tmp_path, "lm_memory_bench.py", "--tokens", "4000", "--types", "300", "--epochs", "2",
        "--model-config", '{"emb_sz": 16, "n_hid": 32, "n_layers": 1}', "--batch-size", "8",
        "--output", str(tmp_path / "runs"))
    runs = ["fixed/mixed", "before/mixed"]
    assert sorted(report["epochs"]) == sorted(runs)
    for name in runs:
        epochs = report["epochs"][name]
        assert [row["epoch"] for row in epochs] == [1, 2]
        assert all(row["rss_mb"] > 0 and row["wall_s"] > 0 for row in epochs)
        assert not any("gpu_mb" in row for row in epochs)  # no GPU, no GPU figures
        assert report["final"][name]["precision"] == "fp32"  # mixed asked, none on a CPU
    # Handing freed memory back changes memory, not what is learned.
    losses = {name: [row["valid_loss"] for row in report["epochs"][name]] for name in runs}
    assert losses["fixed/mixed"] == losses["before/mixed"]
    assert "MB RSS from the end of epoch 1 to the end of epoch 2" in printed
