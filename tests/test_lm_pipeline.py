"""The language model pipeline: run locally and rehearsed from its compiled JSON, and the
text pipeline starting from what it wrote."""

import json
import os
import re

import pandas as pd
import pytest
from fastai.text.all import load_pickle

import compile as compile_cli
import tools.rehearsal as rehearse
from pipelines import run_local
from tests.mlflow_reads import metric_history
from tools.datamakers.demo_text import write_reviews_csv

TINY = '{"emb_sz": 16, "n_hid": 24, "n_layers": 2}'
# 6 epochs at 3e-2: the tiny model beats a unigram model of its training tokens (2 epochs
# at 1e-2 did not: held-out perplexity 60 vs 44), so the text pipeline takes its assets.
SMALL = ["--epochs", "6", "--learning-rate", "0.03", "--batch-size", "8", "--seq-len", "16",
         "--min-freq", "1", "--model-config", TINY]


@pytest.fixture(autouse=True)
def _no_vertex_checkpoint_dir(monkeypatch):
    monkeypatch.delenv("AIP_CHECKPOINT_DIR", raising=False)


@pytest.mark.slow
def test_run_local_lm_writes_assets_the_text_pipeline_starts_from(tmp_path, capsys,
                                                                 monkeypatch):
    """A language model from a folder of text files, tracked in an MLflow file store; then
    a text classifier starting from what it wrote."""
    from mlflow import MlflowClient

    from components.track.tracking import FILE_STORE_SWITCH, tracking_store

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_reviews_csv(str(tmp_path / "other.csv"), rows=80, seed=5)
    texts = list(pd.read_csv(tmp_path / "other.csv")["text"])
    for i in range(4):  # a folder of .txt files, paragraphs apart
        (corpus / f"part{i}.txt").write_text("\n\n".join(texts[i::4]))
    out = tmp_path / "lm"
    mlruns = str(tmp_path / "mlruns")
    assert run_local.main(["lm", "--data", str(corpus), "--output", str(out), "--lang", "fr",
                           "--tracking-uri", mlruns, *SMALL]) == 0
    summary = json.loads((out / "summary.json").read_text())
    # better than a uniform guess over its vocabulary (which would be its perplexity)
    vocab = load_pickle(os.path.join(summary["artifacts"]["lm_assets"], "fr", "forward",
                                     "vocab.pkl"))
    assert 1 < summary["metrics"]["perplexity"] < len(vocab)
    assert summary["corpus"]["files"] == 4 and summary["corpus"]["kind"] == "txt"
    assets = summary["artifacts"]["lm_assets"]
    assert sorted(os.listdir(os.path.join(assets, "fr", "forward"))) == [
        "config.json", "vocab.pkl", "weights.pth"]
    assert summary["metrics"]["directions"]["forward"]["beats_unigram"] is True
    assert summary["metrics"]["perplexity"] < summary["metrics"]["unigram"]["perplexity"]
    printed = capsys.readouterr().out
    assert "held-out perplexity" in printed and "a unigram model of the training" in printed
    assert "no better than a unigram" not in printed
    # tracked epoch by epoch, with the corpus it read
    monkeypatch.setenv(FILE_STORE_SWITCH, "true")  # as a reader of a file store sets it
    client = MlflowClient(tracking_uri=tracking_store(mlruns))
    (run,) = client.search_runs([client.get_experiment_by_name("language-model").experiment_id])
    assert [step for step, _ in metric_history(client, run, "lm/perplexity")] == list(range(1, 7))
    assert run.data.metrics["lm/final_perplexity"] == pytest.approx(
        summary["metrics"]["perplexity"])
    assert run.data.params["lang"] == "fr"
    assert re.fullmatch(r"[0-9a-f]{64}", run.data.tags["data_sha256"])

    reviews = tmp_path / "reviews.csv"
    write_reviews_csv(str(reviews), rows=60, seed=1)
    text_out = tmp_path / "text"
    assert run_local.main(["text", "--data", str(reviews), "--output", str(text_out),
                           "--lang", "fr", "--pretrained", "true", "--lm-assets", assets,
                           "--lm-epochs", "1", "--epochs", "2", "--batch-size", "8",
                           "--min-freq", "1", "--seq-len", "16"]) == 0
    training = json.loads((text_out / "summary.json").read_text())["training"]
    assert training["epochs"] == 3  # one LM epoch on the task's texts, then the classifier's two


def test_the_headline_says_when_the_language_model_is_no_better_than_a_unigram_model():
    summary = {"metrics": {"perplexity": 60.4, "accuracy": 0.083,
                           "unigram": {"perplexity": 43.5, "accuracy": 0.069},
                           "learnt_nothing": "forward: no better than a unigram model ..."},
               "artifacts": {"lm_assets": "/out/lm"}}
    first, warning = run_local.headline("lm", summary).splitlines()
    assert first == ("lm pipeline: held-out perplexity 60.4, next-token accuracy 0.083 (a "
                     "unigram model of the training tokens: 43.5, 0.069); lm_assets: /out/lm")
    assert warning.startswith("warning: the language model is no better than a unigram model; "
                              "the text pipeline refuses these lm_assets (forward: no better")
    summary["metrics"].update(perplexity=30.0, learnt_nothing=None)
    assert len(run_local.headline("lm", summary).splitlines()) == 1
    del summary["metrics"]["unigram"]  # a summary from before the unigram was measured
    assert run_local.headline("lm", summary).startswith(
        "lm pipeline: held-out perplexity 30.0, next-token accuracy 0.083; lm_assets")


@pytest.mark.slow
def test_lm_pipeline_rehearsed_from_its_compiled_json(tmp_path):
    """The compiled JSON as Vertex would run it: placeholders resolved, each step a job."""
    build = tmp_path / "build"
    assert compile_cli.main(["--output-dir", str(build), "--pipelines", "lm_pipeline"]) == 0
    corpus = tmp_path / "corpus.csv"
    write_reviews_csv(str(corpus), rows=60, seed=2)
    result = rehearse.rehearse(
        str(build / "lm_pipeline.json"), str(tmp_path / "r"),
        {"corpus_uri": str(corpus), "lang": "fr", "epochs": "1", "batch_size": "8",
         "seq_len": "16", "min_freq": "1", "model_config": TINY})
    states = {t["name"]: t["state"] for t in result["rehearsal"]["tasks"]}
    assert states == {"preflight-lm": "succeeded", "train-language-model": "succeeded",
                      "condition-1": "skipped"}  # no tracking_uri: nothing tracked
    assets = result["artifacts"]["lm_assets"]
    assert os.path.isfile(os.path.join(assets, "fr", "forward", "weights.pth"))
    vocab = load_pickle(os.path.join(assets, "fr", "forward", "vocab.pkl"))
    assert 1 < result["metrics"]["perplexity"] < len(vocab)  # better than a uniform guess
