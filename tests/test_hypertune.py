"""Tuning trials report their metric through cloudml-hypertune's file, as Vertex reads it."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

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


_AS_TRIAL_USER = """
import sys
from components.tune.trial import TrialError, check_metric_file
try:
    print(check_metric_file({"CLOUD_ML_HP_METRIC_FILE": sys.argv[1]}))
except TrialError as err:
    print(err)
    sys.exit(3)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to act as the image's user, and a Python it can run")
def test_a_trial_refuses_to_start_when_its_user_cannot_write_the_metric_file():
    """As uid 1000 (the images' user): a folder under root's /var cannot be made (what
    cloudml-hypertune#6 reports of Vertex); one the user owns can."""
    root = pathlib.Path(tempfile.mkdtemp())  # pytest's own tmp is root-only (0700)
    try:
        os.chmod(root, 0o755)
        (root / "mine").mkdir()
        os.chown(root / "mine", 1000, 1000)

        def as_trial_user(path):
            # the system's Python: the venv's lies under root's home, closed to uid 1000;
            # what is imported is pure Python
            return subprocess.run(["/usr/bin/python3", "-c", _AS_TRIAL_USER, str(path)], user=1000,
                                  group=1000, capture_output=True, text=True,
                                  cwd=os.path.dirname(os.path.dirname(__file__)))

        refused = as_trial_user(root / "hypertune" / "output.metrics")
        assert refused.returncode == 3, refused.stderr
        assert f"cannot write the tuning metric file {root}/hypertune/output.metrics as uid " \
               "1000 (Permission denied)" in refused.stdout
        allowed = as_trial_user(root / "mine" / "hypertune" / "output.metrics")
        assert allowed.returncode == 0, allowed.stdout + allowed.stderr
        assert (root / "mine" / "hypertune" / "output.metrics").stat().st_uid == 1000
    finally:
        shutil.rmtree(root)
