"""Tuning trials report their metric through cloudml-hypertune's file, as Vertex reads it."""

import json

import pytest

from components.common.hypertune import TrialReporter


def read_reports(path) -> list[dict]:
    """The metric file hypertune writes (one JSON object per report, last 100 kept)."""
    return [json.loads(line) for line in open(path).read().splitlines()]


@pytest.fixture
def metric_file(tmp_path, monkeypatch):
    path = tmp_path / "hypertune" / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(path))
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "7")
    return path


def test_each_epoch_reports_the_named_value_at_its_step(metric_file):
    reporter = TrialReporter("val_accuracy")
    reporter.report({"loss": 0.9, "val_accuracy": 0.5}, 1)
    reporter.report({"loss": 0.7, "val_accuracy": 0.75}, 2)
    reports = read_reports(metric_file)
    assert [(r["val_accuracy"], r["global_step"], r["trial"]) for r in reports] == [
        ("0.5", "1", "7"), ("0.75", "2", "7")]


def test_nothing_is_reported_outside_a_trial_or_for_a_diverged_epoch(metric_file):
    TrialReporter("").report({"loss": 1.0}, 1)
    TrialReporter(None).report({"loss": 1.0}, 1)
    assert not metric_file.exists()
    reporter = TrialReporter("valid_loss")
    reporter.report({"valid_loss": 0.6}, 1)
    reporter.report({"valid_loss": float("nan")}, 2)  # must not rank as a best loss
    assert [r["valid_loss"] for r in read_reports(metric_file)] == ["0.6"]


def test_a_metric_the_trainer_does_not_compute_is_a_clear_error(metric_file):
    with pytest.raises(ValueError, match=r"'val_auc' is not among .*\['loss', 'val_loss'\]"):
        TrialReporter("val_auc").report({"loss": 1.0, "val_loss": 1.1}, 1)
