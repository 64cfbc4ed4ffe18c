"""fastai's pretrained English LM out of the box, offline: a stand-in for the WikiText-103
AWD-LSTM (default size, random weights, the archive's names) lies where `untar_data`
extracts it; everything after is the real path."""

import json
import os

import pandas as pd
import pytest
import torch
from fastai.data.external import fastai_cfg
from fastai.text.all import load_pickle

from components.train_text import assets
from components.train_text.contract import TrainConfig
from pipelines import stage_wt103
from tests.conftest import write_fastai_lm_stand_in
from tools.datamakers.demo_text import write_reviews_csv

# Tokens the task has and the stand-in's vocabulary shares, and ones it lacks.
SHARED = ["xxunk", "xxpad", "xxbos", "xxeos", "xxfld", "xxrep", "xxwrep", "xxup", "xxmaj",
          "the", "le", "la", "et", ".", ","]


@pytest.fixture
def fastai_home(tmp_path, monkeypatch):
    home = tmp_path / "fastai_home"
    monkeypatch.setenv("FASTAI_HOME", str(home))
    monkeypatch.delenv("AIP_CHECKPOINT_DIR", raising=False)
    fastai_cfg.cache_clear()  # fastai reads FASTAI_HOME once per process
    yield home
    fastai_cfg.cache_clear()


def test_english_without_assets_resolves_to_fastais_folder(fastai_home, tmp_path):
    folder = write_fastai_lm_stand_in(fastai_home, SHARED + ["wikipedia"])
    found = assets.fetch_assets("", "en", False, str(tmp_path))
    assert found.weights == os.path.join(folder, "lstm_fwd.pth")
    assert found.vocab == os.path.join(folder, "itos_wt103.pkl")
    assert found.config == {}  # fastai's default AWD-LSTM
    assert found.source.endswith("/wt103-fwd.tgz")  # the URL fastai's pretrained=True takes
    # other languages have no such model: lm_assets stays required, and says so
    with pytest.raises(assets.MissingAssetsError, match="only lang='en'"):
        assets.fetch_assets("", "fr", False, str(tmp_path))


def test_an_incomplete_fastai_folder_is_named(fastai_home, tmp_path):
    folder = write_fastai_lm_stand_in(fastai_home, SHARED)
    os.remove(os.path.join(folder, "itos_wt103.pkl"))
    with pytest.raises(assets.MissingAssetsError, match=r"lacks a \.pkl"):
        assets.fetch_assets("", "en", False, str(tmp_path))


def test_staged_copy_is_ordinary_assets_with_the_same_files(fastai_home, tmp_path):
    folder = write_fastai_lm_stand_in(fastai_home, SHARED, backwards=True)
    write_fastai_lm_stand_in(fastai_home, SHARED + ["forward"])
    out = tmp_path / "bucket" / "lm"
    assert stage_wt103.main(["--output", str(out), "--direction", "both"]) == 0
    staged = assets.fetch_assets(str(out), "en", True, str(tmp_path / "copy"))
    assert load_pickle(staged.vocab) == SHARED
    original = torch.load(os.path.join(folder, "lstm_bwd.pth"))
    copied = torch.load(staged.weights)
    assert original.keys() == copied.keys()
    assert all(torch.equal(original[k], copied[k]) for k in original)
    config = json.loads((out / "en" / "backward" / "config.json").read_text())
    assert config == {"arch": "AWD_LSTM", "emb_sz": 400, "n_hid": 1152, "n_layers": 3}
    assert load_pickle(str(out / "en" / "forward" / "vocab.pkl"))[-1] == "forward"


def test_unreachable_download_says_how_to_stage_a_copy(fastai_home, tmp_path, monkeypatch):
    # No stand-in and no internet (a proxy on a closed loopback port makes sure of it, on
    # any machine): fastai's download fails, and the error says what to do.
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with pytest.raises(assets.MissingAssetsError, match="pipelines.stage_wt103") as err:
        assets.fetch_assets("", "en", False, str(tmp_path))
    # and the two ways out that need no internet at all
    assert "the LM pipeline wrote" in str(err.value) and "pretrained=false" in str(err.value)


@pytest.mark.slow
def test_a_text_pipeline_given_only_its_data_starts_from_fastais_english_model(fastai_home,
                                                                              tmp_path):
    """What a console user who sets only data_uri runs, through kfp.local: every setting at
    its default, from the stand-in (the task's 40 most frequent words and fastai's tokens)."""
    from pipelines import local_run

    data = tmp_path / "reviews.csv"
    write_reviews_csv(str(data), rows=60, seed=3)
    words = pd.read_csv(data)["text"].str.split().explode().str.lower()
    write_fastai_lm_stand_in(fastai_home, SHARED + sorted(set(words.value_counts().index[:40])))
    summary = local_run.run("text", str(data), str(tmp_path / "run"), {})
    with open(os.path.join(summary["artifacts"]["model"], "metrics.json")) as f:
        trained = json.load(f)
    assert trained["config"]["lang"] == "en" and trained["config"]["pretrained"] is True
    assert trained["run"]["pretrained_from"].endswith("/wt103-fwd.tgz")
    assert trained["run"]["pretrained"] is True
    assert trained["run"]["arch_config"] == {  # fastai's AWD-LSTM, not ours
        "emb_sz": 400, "n_hid": 1152, "n_layers": 3, "pad_token": 1, "bidir": False}
    assert os.path.exists(os.path.join(summary["artifacts"]["model"], "export.pkl"))
    stages = [h["stage"] for h in trained["history"]]
    # the pretrained LM: its head first, then all of it, on the task's texts; then the classifier
    assert stages[:4] == ["lm-head", "lm-all", "lm-all", "lm-all"]
    defaults = TrainConfig()  # the whole default budget ran, its best epoch kept by F1
    assert len([s for s in stages if s.startswith("classifier")]) == defaults.epochs
    assert trained["config"]["monitor"] == defaults.monitor == "f1_score"
    assert summary["metrics"]["num_examples"] == summary["preparation"]["splits"]["test"]
