"""The language model step on CPU: corpus reading, assets the text trainer takes, resume."""

import collections
import json
import math
import os
import re

import numpy as np
import pandas as pd
import pytest
import torch
from fastai.text.all import Callback, load_pickle

from components.common.fastai_text import TOKENIZER_WORKERS, language_model_loaders
from components.formats.lm_assets import make_tokenizer
from components.prepare_text.preparation import PrepareConfig, prepare_text_dataset
from components.train_lm.contract import (
    METRICS_FILE,
    LMConfig,
    LMTrainingError,
    console_metrics,
)
from components.train_lm.corpus import paragraphs, read_corpus
from components.train_lm.training import (
    MAX_FOUND_LR,
    MIN_FOUND_LR,
    split_documents,
    train_language_model,
    unigram_of,
)
from components.train_lm.unigram import compare, lm_target_batches, unigram_baseline
from components.train_text.assets import UnlearntAssetsError, fetch_assets
from components.train_text.contract import TrainConfig, required_files
from components.train_text.training import train_text_classifier
from tests.test_text_train import TINY, Capture, StopAfter
from tests.test_text_train import (
    _no_vertex_checkpoint_dir_nor_forks as _no_vertex_checkpoint_dir_nor_forks,
)
from tools.datamakers.demo_text import write_reviews_csv
from tools.datamakers.zipf_corpus import write_zipf_corpus

FAST = dict(batch_size=8, min_freq=1, seq_len=16, model_config=TINY, epochs=2)
# Long enough for the tiny model to beat a unigram model of its training tokens on the
# reviews (FAST does not: held-out perplexity 60 vs 44), as the text trainer requires.
LEARNT = {**FAST, "epochs": 6, "learning_rate": 3e-2}


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "reviews.csv"
    write_reviews_csv(str(path), rows=60, seed=99)
    return str(path)


# ------------------------------------------------------------------------------ corpus


def test_a_folder_of_text_files_is_read_as_paragraphs_and_skips_are_counted(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("First  paragraph\nstill first.\n\n  \nSecond one.\n")
    (corpus / "sub" / "b.txt").write_text("Third.")
    (corpus / "empty.txt").write_text("\n\n")
    (corpus / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (corpus / "notes.md").write_text("not read")
    result = read_corpus(str(corpus))
    assert result.documents == ["First paragraph still first.", "Second one.", "Third."]
    skipped = result.report["skipped"]
    assert skipped["empty file"] == {"count": 1, "examples": ["empty.txt"]}
    assert skipped["not text"]["count"] == 1
    assert "'latin1.txt' is not UTF-8 text: byte 0xe9 at offset 3" in \
        skipped["not text"]["examples"][0]
    assert skipped["not a .txt file"] == {"count": 1, "examples": ["notes.md"]}
    assert result.report["files"] == 4 and result.report["documents"] == 3


@pytest.mark.parametrize("raw", [b"\0" * 20_000, "two paragraphs\n\nof text".encode("utf-16"),
                                 bytes(range(256)) * 80], ids=["nul", "utf-16", "binary"])
def test_a_corpus_that_is_not_text_never_becomes_a_model(tmp_path, raw):
    """The issue's case: two 20 KB files of NUL bytes trained an LM of perplexity 15."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.txt", "b.txt"):
        (corpus / name).write_bytes(raw)
    with pytest.raises(LMTrainingError, match=r"2 of its 2 .txt files are not text, e.g. "
                                              r"corpus file 'a.txt' .*offset \d+"):
        read_corpus(str(corpus))
    with pytest.raises(LMTrainingError, match=r"corpus file 'a.txt' is not .*offset"):
        read_corpus(str(corpus / "a.txt"))
    (corpus / "c.txt").write_text("One paragraph.\n\nAnother.\n\nA third.")
    with pytest.raises(LMTrainingError, match="2 of its 3"):  # mostly not text
        read_corpus(str(corpus))


def test_csv_rows_that_are_not_text_are_counted_or_refused(tmp_path):
    path = tmp_path / "c.csv"
    pd.DataFrame({"text": ["one text", "nul\0here" * 3, "two text"]}).to_csv(path, index=False)
    result = read_corpus(str(path))
    assert result.documents == ["one text", "two text"]
    assert result.report["skipped"]["not text"]["count"] == 1
    assert "line 3: not text: a NUL" in result.report["skipped"]["not text"]["examples"][0]
    pd.DataFrame({"text": ["\0\0\0"] * 5 + ["fine text"]}).to_csv(path, index=False)
    with pytest.raises(LMTrainingError, match="5 of its rows in column 'text' are not text"):
        read_corpus(str(path))


def test_a_csv_column_is_read_row_by_row(tmp_path):
    path = tmp_path / "c.csv"
    pd.DataFrame({"body": ["one text", "", "two  text"], "x": [1, 2, 3]}).to_csv(path, index=False)
    result = read_corpus(str(path), "body")
    assert result.documents == ["one text", "two text"]
    assert result.report["skipped"] == {"empty text": {"count": 1, "examples": [f"{path} line 3"]}}
    with pytest.raises(LMTrainingError, match=r"no column 'text' \(its header: \['body', 'x'\]\)"):
        read_corpus(str(path), "text")


def test_unusable_corpora_are_clear_errors(tmp_path):
    with pytest.raises(LMTrainingError, match="does not exist"):
        read_corpus(str(tmp_path / "nowhere"))
    (tmp_path / "only.md").write_text("x")
    with pytest.raises(LMTrainingError, match="holds no .txt files"):
        read_corpus(str(tmp_path))
    (tmp_path / "one.txt").write_text("a single paragraph")
    with pytest.raises(LMTrainingError, match="gave 1 document.*at least two"):
        read_corpus(str(tmp_path / "one.txt"))
    with pytest.raises(LMTrainingError, match="neither a folder"):
        read_corpus(str(tmp_path / "only.md"))


def test_a_corpus_is_read_from_cloud_storage(gcs, tmp_path):
    bucket = gcs.create_bucket("lm-corpus")
    bucket.blob("wiki/a.txt").upload_from_string("Alpha text.\n\nBeta text.")
    bucket.blob("wiki/b.txt").upload_from_string("Gamma text.")
    result = read_corpus("gs://lm-corpus/wiki")
    assert result.documents == ["Alpha text.", "Beta text.", "Gamma text."]


def test_paragraphs_and_the_held_out_draw():
    assert paragraphs("a\n \nb\n\n\nc d\ne") == ["a", "b", "c d e"]
    mask = split_documents(10, 0.2, seed=1)
    assert mask.sum() == 2 and (mask == split_documents(10, 0.2, seed=1)).all()
    assert split_documents(2, 0.01, 0).sum() == 1 and split_documents(2, 0.99, 0).sum() == 1


def test_bad_settings_name_the_setting():
    with pytest.raises(LMTrainingError, match="validation_fraction must be > 0 and < 1"):
        LMConfig(validation_fraction=0)
    with pytest.raises(LMTrainingError, match="epochs must be >= 1.*learning_rate must be >= 0"):
        LMConfig(epochs=0, learning_rate=-1)
    with pytest.raises(LMTrainingError, match="lang must be a language code"):
        LMConfig(lang="")


def test_the_unigram_baseline_by_hand():
    """Training ids [2, 2, 2, 3] over 4 ids: add-one probabilities 1/8, 1/8, 4/8, 2/8. The
    held-out stream [0, 2, 2, 3, 2, 2, 1] in 2 rows of 3 (the loader drops no token here),
    batches of 2 columns: targets [[2, 2], [2, 2]] then [[3], [1]]. Batch losses log 2 and
    (log 4 + log 8) / 2 = 2.5 log 2, averaged per batch as fastai does: 1.75 log 2, so
    perplexity 2 ** 1.75 (a per-token mean would say 1.5 log 2); accuracy of always saying
    2: (1 + 0) / 2."""
    stream = np.array([0, 2, 2, 3, 2, 2, 1])
    batches = lm_target_batches(stream, bs=2, seq_len=2)
    assert [b.tolist() for b in batches] == [[[2, 2], [2, 2]], [[3], [1]]]
    result = unigram_baseline([2, 2, 2, 3], stream, vocab_size=4, bs=2, seq_len=2)
    assert result["perplexity"] == pytest.approx(2 ** 1.75)
    assert result["valid_loss"] == pytest.approx(1.75 * math.log(2))
    assert result["accuracy"] == pytest.approx(0.5)
    assert (result["most_frequent_id"], result["train_tokens"], result["targets"]) == (2, 4, 6)
    # a held-out id never seen in training (0, 1) still has a probability: add-one
    assert unigram_baseline([2], [2, 0, 1], 4, bs=1, seq_len=8)["perplexity"] == pytest.approx(5.0)
    # the loader's tail: 8 tokens in 3 rows keep (8 - 1) // 3 = 2 targets a row
    assert [b.tolist() for b in lm_target_batches(np.arange(8), 3, 5)] == [[[1, 2], [3, 4],
                                                                             [5, 6]]]
    assert unigram_baseline([1], [1], 2, bs=1, seq_len=4)["perplexity"] is None
    with pytest.raises(ValueError, match="outside the vocabulary of 4"):
        unigram_baseline([2], [2, 9], 4, bs=1, seq_len=4)


def test_a_model_that_does_not_beat_the_unigram_says_why():
    unigram = {"perplexity": 20.0, "accuracy": 0.25}
    assert compare(19.9, 0.3, unigram) == (True, None)
    for ppl in (20.0, 31.0, float("nan"), None):
        beats, why = compare(ppl, 0.2, unigram)
        assert beats is False and "no better than a unigram model" in why and "20.00" in why
    assert "accuracy 0.200 vs 0.250" in compare(25.0, 0.2, unigram)[1]
    assert compare(5.0, 0.5, None) == (None, None)  # a run from before it was measured


def _zipf_lm_datasets(tmp_path, tokens: int, types: int, every: int):
    """fastai's LM `Datasets` of a Zipf corpus, every `every`-th paragraph held out."""
    from fastai.text.all import ColReader, ColSplitter, DataBlock, TextBlock

    corpus = tmp_path / "corpus.txt"
    write_zipf_corpus(str(corpus), tokens=tokens, types=types)
    texts = corpus.read_text().split("\n\n")
    frame = pd.DataFrame({"text": texts, "valid": [i % every == 0 for i in range(len(texts))]})
    return DataBlock(blocks=TextBlock.from_df("text", is_lm=True, seq_len=16,
                                              n_workers=TOKENIZER_WORKERS),
                     get_x=ColReader("text"), splitter=ColSplitter("valid")).datasets(frame)


def test_the_unigram_is_scored_on_the_targets_the_loader_gives(tmp_path):
    """The targets `lm_target_batches` lays out are those of fastai's held-out batches, and
    the unigram's figures are those fastai's metrics would give it there."""
    dsets = _zipf_lm_datasets(tmp_path, 3_000, 300, every=4)
    dls = language_model_loaders(dsets, bs=8, val_bs=5, seq_len=16)
    stream = np.concatenate([np.asarray(dls.valid.items[i]) for i in range(len(dsets.valid))])
    ours = lm_target_batches(stream, dls.valid.bs, dls.valid.seq_len)
    theirs = [y.numpy() for _, y in dls.valid]
    assert len(ours) == len(theirs) > 1 and theirs[-1].shape[1] < 16  # a shorter last batch
    for mine, loaders in zip(ours, theirs, strict=True):
        assert np.array_equal(mine, loaders)
    unigram = unigram_of(dls)
    train = torch.cat([x[0] for x in dsets.train])
    counts = torch.bincount(train, minlength=len(dls.vocab)).double()
    log_p = torch.log((counts + 1) / (counts.sum() + len(dls.vocab)))
    losses = [-log_p[torch.as_tensor(y)].mean() for y in theirs]  # fastai: mean of batch means
    assert unigram["perplexity"] == pytest.approx(float(torch.exp(torch.stack(losses).mean())))
    top = int(counts.argmax())
    assert unigram["accuracy"] == pytest.approx(np.mean([(y == top).mean() for y in theirs]))
    assert unigram["train_tokens"] == len(train)


# ---------------------------------------------------------------------------- training


def test_a_found_rate_sweeps_no_more_batches_than_the_training_and_is_kept(reviews, tmp_path):
    from components.common.fastai_text import LR_FIND_MIN_ITERATIONS

    result = train_language_model(reviews, str(tmp_path / "assets"),
                                  LMConfig(lang="fr", **{**FAST, "learning_rate": 0}))
    found = result["directions"]["forward"]["found_learning_rates"]
    # 2 epochs of 60 short reviews are fewer batches than the sweep's floor
    assert found["sweep"] == LR_FIND_MIN_ITERATIONS
    assert MIN_FOUND_LR <= found["used"] <= MAX_FOUND_LR


def test_assets_in_the_text_trainers_layout_with_held_out_metrics(reviews, tmp_path):
    out = tmp_path / "assets"
    result = train_language_model(reviews, str(out), LMConfig(lang="fr", **LEARNT))
    for relative in required_files("fr", backwards=False):
        assert (out / relative).is_file(), relative
    assert not (out / "fr" / "backward").exists()
    assert sorted(os.listdir(out)) == ["fr", METRICS_FILE]  # no checkpoints left behind
    assets = fetch_assets(str(out), "fr", False, str(tmp_path / "copy"))
    assert {k: assets.config[k] for k in TINY} == TINY
    forward = result["directions"]["forward"]
    assert forward["epochs"] == 6 and len(forward["history"]) == 6
    assert result["perplexity"] == pytest.approx(math.exp(forward["valid_loss"]), rel=1e-3)
    assert 0 < result["accuracy"] < 1
    assert result["corpus"]["documents"] == 60 and result["tokens"]["validation"] > 0
    assert json.loads((out / METRICS_FILE).read_text())["perplexity"] == result["perplexity"]
    # beside a unigram model of its training tokens on the same held-out targets: beaten
    unigram = forward["unigram"]
    assert 1 < unigram["perplexity"] < result["vocab_size"] and 0 < unigram["accuracy"] < 1
    assert forward["perplexity"] < unigram["perplexity"]
    assert (forward["beats_unigram"], forward["learnt_nothing"], result["learnt_nothing"]) == (
        True, None, None)
    scalars = console_metrics(result)  # the step's Metrics artifact
    assert scalars["unigram_perplexity"] == unigram["perplexity"]
    assert scalars["beats_unigram"] == 1.0
    # 2 epochs at 1e-2 do not beat it: flagged, and the text trainer refuses the assets
    short = train_language_model(reviews, str(tmp_path / "short"), LMConfig(lang="fr", **FAST))
    flagged = short["directions"]["forward"]
    assert flagged["unigram"] == unigram  # the same tokens, the same targets
    assert flagged["beats_unigram"] is False and flagged["perplexity"] >= unigram["perplexity"]
    assert short["learnt_nothing"].startswith("forward: no better than a unigram model")
    assert console_metrics(short)["beats_unigram"] == 0.0
    with pytest.raises(UnlearntAssetsError, match="forward language model .*no better than"):
        fetch_assets(str(tmp_path / "short"), "fr", False, str(tmp_path / "copy2"))
    # the weights are the trained model's: they load into a fresh one of config.json's shape
    weights = torch.load(assets.weights, weights_only=False)
    assert weights["0.encoder.weight"].shape == (len(load_pickle(assets.vocab)), 16)


@pytest.mark.slow
def test_an_interrupted_run_resumes_and_never_retrains_a_finished_direction(reviews, tmp_path):
    out, config = str(tmp_path / "assets"), LMConfig(lang="fr", backwards=True,
                                                    **{**FAST, "epochs": 3})
    first = Capture()
    with pytest.raises(KeyboardInterrupt):  # forward's 3 epochs, then the backward's first
        train_language_model(reviews, out, config, callbacks=[first, StopAfter("LMLearner", 4)])
    # forward, then the backward's first epoch
    assert (len(first.fits), [epoch for _, epoch in first.epochs]) == (2, [0, 1, 2, 0])
    assert not os.path.exists(os.path.join(out, "fr"))  # nothing published half-done
    second = Capture()
    result = train_language_model(reviews, out, config, callbacks=[second])
    # the backward model only, from its second epoch
    assert (len(second.fits), [epoch for _, epoch in second.epochs]) == (1, [1, 2])
    assert [h["epoch"] for h in result["directions"]["backward"]["history"]] == [1, 2, 3]
    assert [h["epoch"] for h in result["directions"]["forward"]["history"]] == [1, 2, 3]
    for relative in required_files("fr", backwards=True) + required_files("fr", False):
        assert os.path.isfile(os.path.join(out, relative))


def test_another_runs_checkpoints_are_refused(reviews, tmp_path):
    folder = str(tmp_path / "ckpt")
    with pytest.raises(KeyboardInterrupt):
        train_language_model(reviews, str(tmp_path / "a"), LMConfig(**FAST), folder,
                             callbacks=[StopAfter("LMLearner", 1)])
    with pytest.raises(LMTrainingError, match="state of a different run"):
        train_language_model(reviews, str(tmp_path / "a"), LMConfig(**{**FAST, "epochs": 3}),
                             folder)


def test_sentencepiece_languages_ship_the_model_they_were_cut_with(tmp_path):
    sentences = ["配達がとても早かったです", "価格が高すぎると思います", "品質は良いが配達が遅い",
                 "サービスの対応が丁寧でした", "値段の割に品質が良い", "梱包が丁寧で安心しました"]
    corpus = tmp_path / "ja"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"{i}.txt").write_text("\n\n".join(sentences[i:] + sentences[:i]) * 5)
    out = tmp_path / "assets"
    with pytest.raises(LMTrainingError, match="spm_vocab_size=40 .*Vocabulary size is smaller"):
        train_language_model(str(corpus), str(out), LMConfig(lang="ja", spm_vocab_size=40, **FAST))
    # 12 epochs: enough to beat a unigram model (perplexity 14.6 vs 22.9), as fetch_assets asks
    train_language_model(str(corpus), str(out), LMConfig(lang="ja", spm_vocab_size=80,
                                                         **{**LEARNT, "epochs": 12}))
    assets = fetch_assets(str(out), "ja", False, str(tmp_path / "copy"))
    tokenizer = make_tokenizer("ja", assets.spm_model, str(tmp_path / "cache"))
    tokens = list(tokenizer(["配達が早い"]))[0]
    assert "".join(tokens).replace("▁", "") == "配達が早い"
    # the vocabulary is made of that model's pieces
    assert set(next(iter(tokenizer([sentences[0]])))) <= set(load_pickle(assets.vocab))


@pytest.mark.slow
def test_the_text_trainer_starts_from_these_assets_new_tokens_at_the_mean(reviews, tmp_path):
    """A task word the LM never saw is not an error: ULMFiT gives it the mean embedding."""
    texts = pd.read_csv(reviews)["text"]
    words = collections.Counter(w for t in texts for w in re.findall(r"[a-zé]{5,}", t.lower()))
    unseen = words.most_common(1)[0][0]
    corpus = tmp_path / "corpus.csv"
    without = texts.str.replace(re.escape(unseen), "", case=False, regex=True)
    pd.DataFrame({"text": without}).to_csv(corpus, index=False)
    assets = tmp_path / "assets"
    train_language_model(str(corpus), str(assets), LMConfig(lang="fr", **LEARNT))
    dataset = tmp_path / "dataset"
    prepare_text_dataset(reviews, str(dataset), PrepareConfig())
    capture = Capture()
    config = TrainConfig(lang="fr", pretrained=True, lm_epochs=0, epochs=1, batch_size=8,
                         min_freq=1, seq_len=16)
    train_text_classifier(str(dataset), str(tmp_path / "model"), config,
                          lm_assets_uri=str(assets), callbacks=[capture])
    old = torch.load(assets / "fr/forward/weights.pth", weights_only=False)["0.encoder.weight"]
    old_index = {tok: i for i, tok in enumerate(load_pickle(assets / "fr/forward/vocab.pkl"))}
    _, weights, vocab = capture.fits[0]
    assert unseen in vocab and unseen not in old_index
    for i, token in enumerate(vocab):
        expected = old[old_index[token]] if token in old_index else old.mean(0)
        assert torch.allclose(weights[i], expected), token
    assert np.mean([t in old_index for t in vocab]) > 0.5


class _TensorCount(Callback):
    """Counts the tensors alive (gc-visible) at training batches `at` counted from the first
    batch of the second epoch: by then the loaders hold every text's token ids (made once,
    kept for the fit), so what grows after that grows per batch."""

    order = 99

    def __init__(self, at):
        self.at, self.counts, self.batches = set(at), {}, 0

    def after_batch(self):
        if self.training and self.epoch >= 1:
            self.batches += 1
            if self.batches in self.at:
                import gc

                gc.collect()
                self.counts[self.batches] = sum(isinstance(o, torch.Tensor)
                                                for o in gc.get_objects())


def test_training_keeps_no_tensor_per_batch(tmp_path):
    """fastai's Recorder kept a 0-d loss tensor per batch for the whole fit; at a real
    model's size those small blocks fragment the heap, and resident memory grew epoch by
    epoch (bench/lm_memory_bench.py measures that). Counted here instead of measured:
    tiny tensors do not fragment. Before the fix: +120 tensors over these 60 batches."""
    corpus = tmp_path / "corpus.txt"
    write_zipf_corpus(str(corpus), tokens=12_000, types=3000)
    probe = _TensorCount(at=(5, 65))  # the second epoch has ~80 batches
    train_language_model(str(corpus), str(tmp_path / "out"), LMConfig(**FAST),
                         callbacks=[probe])
    assert probe.batches >= 65
    assert probe.counts[65] - probe.counts[5] < 30, probe.counts


def test_language_model_loaders_make_each_texts_ids_once(tmp_path):
    """fastai's LM loader kept the ids of the last 2 texts read; its batches read streams
    far apart, so every epoch made every text's ids again (78% of an AWD-LSTM epoch on an
    H100). Kept for the fit, each is made once, and the batches are the same."""
    dsets = _zipf_lm_datasets(tmp_path, 6_000, 500, every=5)

    def two_epochs(dls):
        torch.manual_seed(0)
        import random
        random.seed(0)
        return [torch.cat([x.flatten() for x, _ in dls.train]) for _ in range(2)]

    kept = language_model_loaders(dsets, bs=8, val_bs=8, seq_len=16)
    batches = two_epochs(kept)
    assert kept.train.items._get.cache_info().misses == len(dsets.train)
    assert kept.train.items._get.cache_info().hits > len(dsets.train)
    for _ in range(2):
        list(kept.valid)
    assert kept.valid.items._get.cache_info().misses == len(dsets.valid)
    fastai_default = dsets.dataloaders(bs=8, val_bs=8, seq_len=16, num_workers=0)
    for ours, theirs in zip(batches, two_epochs(fastai_default), strict=True):
        assert torch.equal(ours, theirs)
    assert not torch.equal(batches[0], batches[1])  # shuffled per epoch all the same
