"""Preemption of both fastai trainers (the AWD-LSTM LM and the ULMFiT classifier): a real
SIGTERM mid-epoch seals that step and exits 143, and the restart resumes inside the epoch,
ending as an uninterrupted run does; `checkpoint_every_steps` seals without a notice."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastai.text.all import Callback

from components.common import fastai_text
from components.train_lm.contract import LMConfig, LMTrainingError
from components.train_lm.training import train_language_model
from components.train_text import schedule
from components.train_text.contract import TextTrainingError, TrainConfig
from components.train_text.training import train_text_classifier
from tests.test_text_train import TINY, prepared_reviews
from tests.test_text_train import (
    _no_vertex_checkpoint_dir_nor_forks as _no_vertex_checkpoint_dir_nor_forks,
)
from tools.datamakers.zipf_corpus import write_zipf_corpus

REPO = Path(__file__).resolve().parents[1]
# ~190 batches an epoch: a SIGTERM sent when an epoch's line is logged lands in the next.
LM = dict(lang="fr", batch_size=8, min_freq=1, seq_len=16, model_config=TINY, epochs=3)
# Gradual unfreezing after an LM from scratch: lm-all, classifier-head, -top2, -all.
TEXT = dict(pretrained=False, lm_epochs=1, epochs=3, model_config=TINY, unfreeze="gradual",
            learning_rate=1e-2, batch_size=8, min_freq=1, seq_len=24, lang="fr")

# Both trainers in a process of their own; the tiny models learn nothing worth judging.
_SCRIPT = """
import json, logging, sys
from components.train_text import schedule
schedule.LM_ACCURACY_MARGIN, schedule.MAX_RESTARTS = -1.0, 0
from components.train_lm.training import LMConfig, train_language_model
from components.train_text.training import TrainConfig, train_text_classifier
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
kind, data, out, config, result = sys.argv[1:]
train, settings = ((train_language_model, LMConfig) if kind == "lm" else
                   (train_text_classifier, TrainConfig))
metrics = train(data, out, settings(**json.loads(config)), checkpoint_folder=out + "-checkpoints")
open(result, "w").write(json.dumps(metrics, default=str))
"""


@pytest.fixture(autouse=True)
def _not_judged(monkeypatch):  # as the script does: the tiny models are not judged
    monkeypatch.setattr(schedule, "LM_ACCURACY_MARGIN", -1.0)
    monkeypatch.setattr(schedule, "MAX_RESTARTS", 0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    write_zipf_corpus(str(path), tokens=25_000, types=500)
    return str(path)


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    return prepared_reviews(tmp_path_factory.mktemp("reviews"), 1000)


def _preempted_then_resumed(tmp_path: Path, kind: str, data: str, config: dict,
                            marker: str) -> tuple[int, int, str, dict]:
    """Runs the trainer, SIGTERMs it 0.3 s after `marker` is logged, runs it again to the end.

    Returns:
        The epoch and step sealed (their files checked), the second attempt's log and result.
    """
    env = {k: v for k, v in os.environ.items() if k != "AIP_CHECKPOINT_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    logs = []
    for attempt in (1, 2):
        log = tmp_path / f"attempt{attempt}.log"
        with open(log, "w") as sink:
            process = subprocess.Popen(
                [sys.executable, "-c", _SCRIPT, kind, data, str(tmp_path / "out"),
                 json.dumps(config), str(tmp_path / f"attempt{attempt}.json")],
                env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        while attempt == 1 and process.poll() is None and marker not in log.read_text():
            time.sleep(0.01)
        if attempt == 1:
            time.sleep(0.3)  # past the epoch's end (a SIGTERM there stops at it) into the next
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=600)
        logs.append(log.read_text())
        assert process.returncode == (143 if attempt == 1 else 0), logs[-1][-3000:]
        if attempt == 1:
            sealed = re.search(r"sealed in (\S+) at epoch (\d+) step (\d+)", logs[0])
            assert sealed and os.path.isfile(sealed.group(1)), logs[0][-3000:]
            assert os.path.isfile(fastai_text.step_file(sealed.group(1)))
    result = json.loads((tmp_path / "attempt2.json").read_text())
    return int(sealed.group(2)), int(sealed.group(3)), logs[1], result


@pytest.mark.slow
def test_a_sigterm_mid_epoch_seals_the_lm_there_and_the_restart_ends_as_if_never_stopped(
        corpus, tmp_path):
    epoch, step, second, resumed = _preempted_then_resumed(tmp_path, "lm", corpus, LM,
                                                           "epoch 1/3:")
    assert epoch == 1  # inside the second epoch, not at its end
    assert f"resumed mid-epoch: epoch 1 from step {step}" in second
    assert "epoch 1/3:" not in second and "epoch 3/3:" in second
    whole = train_language_model(corpus, str(tmp_path / "whole"), LMConfig(**LM))
    ours, theirs = resumed["directions"]["forward"], whole["directions"]["forward"]
    # no batch repeated or skipped: the same steps, and from the same RNG the same model
    assert ours["optimizer_steps"] == theirs["optimizer_steps"] > step
    assert [h["valid_loss"] for h in ours["history"]] == \
        pytest.approx([h["valid_loss"] for h in theirs["history"]], rel=1e-5)


@pytest.mark.slow
def test_a_sigterm_in_an_unfreezing_stage_resumes_in_that_stage(reviews, tmp_path):
    epoch, step, second, resumed = _preempted_then_resumed(
        tmp_path, "text", reviews, TEXT, "stage classifier-top2: epochs 1..1 of 1")
    assert epoch == 0
    assert resumed["run"]["resumed_from"] == {"stage": "classifier-top2", "epochs_done": 0,
                                              "batches": step}
    assert f"resumed mid-epoch: epoch 0 from step {step}" in second
    assert "stage classifier-head" not in second  # the stages before it are not run again
    whole = train_text_classifier(reviews, str(tmp_path / "whole"), TrainConfig(**TEXT),
                                  checkpoint_folder=str(tmp_path / "whole-checkpoints"))
    assert [h["stage"] for h in resumed["history"]] == \
        ["lm-all", "classifier-head", "classifier-top2", "classifier-all"]
    assert resumed["run"]["optimizer_steps"] == whole["run"]["optimizer_steps"]
    assert [h["valid_loss"] for h in resumed["history"]] == \
        pytest.approx([h["valid_loss"] for h in whole["history"]], rel=1e-5)


class _FailAt(Callback):
    order = 99  # after the seal of that step

    def __init__(self, epoch: int, batch: int):
        self.at = (epoch, batch)

    def after_batch(self):
        if self.training and (self.epoch, self.iter) == self.at:
            raise RuntimeError("killed without notice")


def test_checkpoint_every_steps_seals_mid_epoch_for_a_kill_without_notice(tmp_path, caplog):
    corpus = tmp_path / "corpus.txt"
    write_zipf_corpus(str(corpus), tokens=6_000, types=500)  # ~42 batches an epoch
    config = LMConfig(**{**LM, "epochs": 2, "checkpoint_every_steps": 10})
    out, folder = str(tmp_path / "out"), str(tmp_path / "checkpoints")
    caplog.set_level(logging.INFO, logger=fastai_text.__name__)
    with pytest.raises(RuntimeError, match="killed without notice"):
        train_language_model(str(corpus), out, config, folder, callbacks=[_FailAt(1, 25)])
    resumed = train_language_model(str(corpus), out, config, folder)
    steps = resumed["directions"]["forward"]["optimizer_steps"]
    per_epoch = steps // 2
    sealed = 10 * ((per_epoch + 26) // 10) - per_epoch  # the last seal before the kill
    assert f"resumed mid-epoch: epoch 1 from step {sealed}" in caplog.text
    whole = train_language_model(str(corpus), str(tmp_path / "whole"), config)
    assert steps == whole["directions"]["forward"]["optimizer_steps"]
    with pytest.raises(LMTrainingError, match="checkpoint_every_steps must be >= 0"):
        LMConfig(checkpoint_every_steps=-1)
    with pytest.raises(TextTrainingError, match="checkpoint_every_steps must be >= 0"):
        TrainConfig(checkpoint_every_steps=-1)
