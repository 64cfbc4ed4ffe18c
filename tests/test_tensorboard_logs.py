"""TensorBoard logs of the fastai trainers: where they go, one point per epoch, no repeats."""

import glob
import json
import math
import os

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from components.common.tensorboard import ScalarLog, epoch_scalars, log_folder, model_step
from components.prepare_text.preparation import PrepareConfig, prepare_text_dataset
from components.text_common.contract import TRAINING_METRICS_FILE
from components.train_lm.contract import METRICS_FILE, LMConfig
from components.train_lm.training import tensorboard_prefix, train_language_model
from components.train_text import schedule
from components.train_text.contract import TrainConfig
from components.train_text.training import train_text_classifier
from tests.test_text_train import TINY, StopAfter
from tools.datamakers.demo_text import write_reviews_csv

FIELDS = ("train_loss", "valid_loss", "seconds")


@pytest.fixture(autouse=True)
def _no_vertex_folders(monkeypatch):
    for name in ("AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "reviews.csv"
    write_reviews_csv(str(path), rows=60, seed=1)
    return str(path)


def read_points(folder: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar point of every event file in `folder`, repeats included, by tag."""
    points: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        for event in LegacyEventFileLoader(path).Load():  # the events as written
            for value in event.summary.value:
                points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return points


def assert_points_are_the_history(points: dict, prefix: str, rows: list[dict]) -> None:
    """One point per epoch row for each field, steps 1..N, values of the row (float32)."""
    fields = [name for name in rows[0] if name not in ("stage", "model", "epoch")]
    assert set(FIELDS) <= set(fields)
    for name in fields:
        expected = [(step, float(np.float32(row[name]))) for step, row in enumerate(rows, 1)]
        assert points.pop(f"{prefix}/{name}") == expected, name


def test_the_folder_is_the_given_one_else_this_tasks_under_the_vertex_variable():
    model = "/gcs/root/123/text-job-7/train-text-classifier/model"
    vertex = {"AIP_TENSORBOARD_LOG_DIR": "gs://b/out/logs/"}
    assert log_folder(model, None, vertex) == "/gcs/b/out/logs/text-job-7/train-text-classifier"
    assert log_folder(model, "", vertex) == log_folder(model, None, vertex)
    assert log_folder(model, "gs://b/tb", vertex) == "/gcs/b/tb"  # given: used as it is
    assert log_folder(model, "/tmp/tb", {}) == "/tmp/tb"
    # nothing set: no logs (the model folder keeps exactly its own files)
    assert log_folder(model, None, {}) is None
    assert log_folder(model, None, {"AIP_TENSORBOARD_LOG_DIR": " "}) is None


def test_an_epoch_row_becomes_one_scalar_per_number():
    row = {"stage": "classifier-all", "model": "classifier", "epoch": 3, "seconds": 1.5,
           "train_loss": 0.5, "valid_loss": math.nan, "f1_score": 0.25}
    assert epoch_scalars("classifier", row) == pytest.approx(
        {"classifier/seconds": 1.5, "classifier/train_loss": 0.5,
         "classifier/valid_loss": math.nan, "classifier/f1_score": 0.25}, nan_ok=True)
    history = [{"model": "lm"}, {"model": "lm"}, {"model": "classifier"}, {"model": "classifier"}]
    assert [model_step(history[:i], history[i - 1]["model"]) for i in range(1, 5)] == [1, 2, 1, 2]
    assert (tensorboard_prefix("forward"), tensorboard_prefix("backward")) == \
        ("lm", "lm_backward")


def test_the_log_writes_nothing_without_a_folder_and_flushes_each_point(tmp_path):
    ScalarLog(None).write({"lm/valid_loss": 1.0}, 1)  # no folder: nothing, no error
    log = ScalarLog(str(tmp_path / "tb"))
    log.write({"lm/valid_loss": 2.0}, 1)
    # readable before the writer is closed: the uploader sees each epoch as it ends
    assert read_points(str(tmp_path / "tb")) == {"lm/valid_loss": [(1, 2.0)]}
    log.write({"lm/valid_loss": 1.5}, 2)
    log.close()
    assert read_points(str(tmp_path / "tb")) == {"lm/valid_loss": [(1, 2.0), (2, 1.5)]}


@pytest.mark.slow
def test_the_classifier_logs_each_epoch_once_across_a_resume(reviews, tmp_path, monkeypatch):
    # The tiny model learns too little to count as learning: no restarts here.
    monkeypatch.setattr(schedule, "MAX_RESTARTS", 0)
    prepare_text_dataset(reviews, str(tmp_path / "dataset"), PrepareConfig())
    model, logs = str(tmp_path / "model"), str(tmp_path / "tb")
    config = TrainConfig(pretrained=False, lm_epochs=2, epochs=3, model_config=TINY,
                         learning_rate=1e-2, batch_size=8, min_freq=1, seq_len=24, lang="fr")
    with pytest.raises(KeyboardInterrupt):  # killed after the classifier's first epoch
        train_text_classifier(str(tmp_path / "dataset"), model, config,
                              callbacks=[StopAfter("TextLearner", 1)], tensorboard_folder=logs)
    assert [step for step, _ in read_points(logs)["classifier/valid_loss"]] == [1]
    train_text_classifier(str(tmp_path / "dataset"), model, config, tensorboard_folder=logs)

    history = json.loads(open(os.path.join(model, TRAINING_METRICS_FILE)).read())["history"]
    points = read_points(logs)
    assert_points_are_the_history(points, "lm", [h for h in history if h["model"] == "lm"])
    assert_points_are_the_history(points, "classifier",
                                  [h for h in history if h["model"] == "classifier"])
    assert points == {}  # nothing else: the resumed run wrote no epoch twice
    assert len(glob.glob(os.path.join(logs, "events.out.tfevents.*"))) == 2  # one per run
    assert sorted(os.listdir(model)) == ["export.pkl", "labels.json", "metrics.json",
                                         "per_label_metrics.json"]


@pytest.mark.slow
def test_the_language_model_logs_under_vertexs_folder_for_this_task(reviews, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("AIP_TENSORBOARD_LOG_DIR", str(tmp_path / "vertex-logs"))
    out = tmp_path / "job-1" / "train-language-model" / "lm_assets"
    config = LMConfig(lang="fr", backwards=True, epochs=3, batch_size=8, min_freq=1, seq_len=16,
                      model_config=TINY)
    with pytest.raises(KeyboardInterrupt):  # killed after the backward model's first epoch
        train_language_model(reviews, str(out), config, callbacks=[StopAfter("LMLearner", 4)])
    result = train_language_model(reviews, str(out), config)

    logs = tmp_path / "vertex-logs" / "job-1" / "train-language-model"
    points = read_points(str(logs))
    assert {"lm/perplexity", "lm/accuracy", "lm_backward/perplexity"} <= set(points)
    for name, prefix in (("forward", "lm"), ("backward", "lm_backward")):
        assert_points_are_the_history(points, prefix, result["directions"][name]["history"])
    assert points == {}
    assert sorted(os.listdir(out)) == ["fr", METRICS_FILE]  # the assets folder as before
