"""Pure logic of the text trainer: stage plan, precision, checkpoint folder, state, LM assets."""

import numpy as np
import pytest

from components.common import run_state
from components.common.fastai_text import choose_precision, choose_rate, sweep_length
from components.text_common import scores as text_scores
from components.train_text import assets, contract, schedule
from components.train_text.contract import TextTrainingError


def _summary(plan):
    return [(s.name, s.model, s.epochs, s.freeze_to, s.discriminative) for s in plan]


def test_plan_ulmfit_defaults():
    plan = schedule.plan_stages(lm_epochs=4, epochs=8, lm_lr=2e-3, lr=2e-2, pretrained=True)
    assert _summary(plan) == [
        ("lm-head", "lm", 1, -1, False),
        ("lm-all", "lm", 3, None, False),
        ("classifier-head", "classifier", 1, -1, False),
        ("classifier-top2", "classifier", 1, -2, True),
        ("classifier-top3", "classifier", 1, -3, True),
        ("classifier-all", "classifier", 5, None, True),
    ]
    assert [s.lr for s in plan] == pytest.approx([2e-2, 2e-3, 2e-2, 1e-2, 5e-3, 1e-3])
    assert sum(s.epochs for s in plan if s.model == "classifier") == 8


@pytest.mark.parametrize("epochs, names", [
    (1, ["classifier-all"]),
    (2, ["classifier-head", "classifier-all"]),
    (3, ["classifier-head", "classifier-top2", "classifier-all"]),
    (4, ["classifier-head", "classifier-top2", "classifier-top3", "classifier-all"]),
])
def test_short_runs_keep_the_final_unfrozen_stage(epochs, names):
    plan = schedule.plan_stages(0, epochs, 2e-3, 2e-2, pretrained=True)
    assert [s.name for s in plan] == names
    assert sum(s.epochs for s in plan) == epochs


def test_random_encoder_trains_unfrozen_and_lm_from_scratch_has_no_frozen_epoch():
    assert _summary(schedule.plan_stages(0, 3, 2e-3, 2e-2, pretrained=False)) == [
        ("classifier-all", "classifier", 3, None, False)]
    plan = schedule.plan_stages(2, 3, 2e-3, 2e-2, pretrained=False)
    assert [(s.name, s.epochs) for s in plan][:1] == [("lm-all", 2)]
    assert plan[1].name == "classifier-head"  # the LM-trained encoder unfreezes gradually


def test_learning_rate_zero_means_found_once_then_shared_by_the_stages():
    plan = schedule.plan_stages(lm_epochs=2, epochs=5, lm_lr=2e-3, lr=0, pretrained=True)
    classifier = [s for s in plan if s.model == "classifier"]
    assert [s.lr for s in classifier] == [0, 0, 0, 0]  # each: found rate x its share
    assert [s.lr_share for s in classifier] == [1.0, 0.5, 0.25, 0.05]
    assert [s.lr for s in plan if s.model == "lm"] == pytest.approx([2e-2, 2e-3])
    [scratch] = schedule.plan_stages(0, 6, 2e-3, 0, pretrained=False)
    assert (scratch.lr, scratch.lr_share) == (0, 1.0)
    # a fixed rate keeps its shares too, so both ways read alike in metrics.json
    assert [s.lr_share for s in schedule.plan_stages(0, 4, 2e-3, 2e-2, True)] == \
        [1.0, 0.5, 0.25, 0.05]


NAN = float("nan")


@pytest.mark.parametrize("suggestions, used, rule", [
    ({"valley": 4e-3, "steep": 6.3e-7, "minimum": 7.6e-8}, 4e-3, "valley"),  # noise ignored
    ({"valley": 8.3e-4, "steep": 3e-3}, 3e-3, "valley, held to the bounds"),
    ({"valley": 2.3e-2, "steep": 7.6e-7}, 5e-3, "valley, held to the bounds"),
    ({"valley": NAN, "steep": 3e-3}, (3e-3 * 5e-3) ** 0.5, "middle of the bounds"),
    ({"valley": 0.0}, (3e-3 * 5e-3) ** 0.5, "middle of the bounds"),
])
def test_found_rate_is_the_valley_held_to_the_bounds(suggestions, used, rule):
    whole = schedule.Stage("classifier-all", "classifier", 6, 0)
    rate, why = choose_rate(suggestions, *schedule.found_rate_bounds(whole))
    assert rate == pytest.approx(used) and why.startswith(rule)


def test_lr_find_sweeps_no_longer_than_the_training_but_long_enough_for_a_valley():
    assert sweep_length(12 * 3) == 36  # 12 epochs of 3 batches
    assert sweep_length(4) == 30  # the fewest that leave a valley a few points a decade
    assert sweep_length(100) == sweep_length(12 * 500) == 100  # fastai's own from there


def test_narrower_models_take_higher_rates():
    whole = schedule.Stage("classifier-all", "classifier", 6, 0)
    assert schedule.found_rate_bounds(whole) == (3e-3, 5e-3)  # fastai's default 1152 units
    floor, ceiling = schedule.found_rate_bounds(whole, n_hid=256)
    assert (floor, ceiling) == pytest.approx((3e-3 * 4.5, 5e-3 * 4.5))
    assert schedule.found_rate_bounds(whole, n_hid=64) == (5e-2, 5e-2)  # the head's cap
    # a head on a frozen encoder may take higher rates than a whole model, whatever its width
    head = schedule.Stage("classifier-head", "classifier", 1, 0, freeze_to=-1)
    assert schedule.found_rate_bounds(head) == schedule.found_rate_bounds(head, 64) == (3e-3, 5e-2)
    assert choose_rate({"valley": 3e-2}, *schedule.found_rate_bounds(head))[0] == 3e-2
    assert choose_rate({"valley": 3e-2}, *schedule.found_rate_bounds(whole))[0] == 5e-3


@pytest.mark.parametrize("mode, batches, used", [
    ("auto", schedule.GRADUAL_MIN_BATCHES, "gradual"),
    ("auto", schedule.GRADUAL_MIN_BATCHES - 1, "all"),
    ("gradual", 3, "gradual"),
    ("all", 10_000, "all"),
])
def test_auto_unfreezes_gradually_only_with_enough_batches_per_stage(mode, batches, used):
    resolved, reason = schedule.resolve_unfreeze(mode, batches)
    assert resolved == used
    expected = f"{batches} batches per epoch" if mode == "auto" else f"unfreeze={mode}"
    assert expected in reason


def test_unfreeze_all_trains_a_learnt_encoder_in_one_stage_at_the_scratch_rate():
    plan = schedule.plan_stages(2, 6, 2e-3, 4e-2, pretrained=True, unfreeze="all")
    assert _summary(plan) == [("lm-head", "lm", 1, -1, False), ("lm-all", "lm", 1, None, False),
                              ("classifier-all", "classifier", 6, None, False)]
    assert plan[-1].lr == 4e-2 and plan[-1].lr_share == 1.0
    with pytest.raises(ValueError, match="resolve_unfreeze"):
        schedule.plan_stages(0, 6, 2e-3, 0, pretrained=True, unfreeze="auto")
    with pytest.raises(TextTrainingError, match="unfreeze must be one of"):
        contract.TrainConfig(unfreeze="top")


def test_learning_rate_zero_is_valid_and_negative_or_nan_is_not():
    assert contract.TrainConfig().learning_rate == 0  # found by default
    contract.TrainConfig(learning_rate=0.01)
    for bad in (-1e-3, float("nan")):
        with pytest.raises(TextTrainingError, match="learning_rate must be >= 0"):
            contract.TrainConfig(learning_rate=bad)
    with pytest.raises(TextTrainingError, match="lm_learning_rate must be > 0"):
        contract.TrainConfig(lm_learning_rate=0)


@pytest.mark.parametrize("requested, cuda, capability, expected", [
    (True, False, None, "fp32"),       # CPU: never
    (True, True, (7, 5), "fp16"),      # T4: no bfloat16 tensor cores
    (True, True, (7, 0), "fp16"),      # V100
    (True, True, (8, 0), "bf16"),      # A100: no loss scaling, no skipped steps
    (True, True, (8, 9), "bf16"),      # L4
    (True, True, (9, 0), "bf16"),      # H100 (measured there: see choose_precision)
    (True, True, (6, 0), "fp32"),      # P100: no tensor cores
    (False, True, (9, 0), "fp32"),     # switched off
    (True, True, None, "fp32"),
])
def test_precision_follows_the_gpu(requested, cuda, capability, expected):
    assert choose_precision(requested, cuda, capability) == expected


def test_mixed_precision_sets_the_learner_up():
    import torch
    from fastai.callback.fp16 import AMPMode, MixedPrecision
    from fastai.data.core import DataLoaders
    from fastai.data.load import DataLoader
    from fastai.text.all import AWD_LSTM, get_text_classifier
    from fastai.text.learner import TextLearner

    from components.common.fastai_text import mixed_precision

    items = [(torch.arange(2, 6), torch.zeros(2))]
    dls = DataLoaders(DataLoader(items, bs=1), DataLoader(items, bs=1))

    def learner():
        model = get_text_classifier(AWD_LSTM, 20, 2, seq_len=4,
                                    config={"emb_sz": 4, "n_hid": 4, "n_layers": 1})
        return TextLearner(dls, model, loss_func=torch.nn.BCEWithLogitsLoss())

    assert not any(isinstance(cb, MixedPrecision) for cb in mixed_precision(learner(), "fp32").cbs)
    for name, mode in (("fp16", AMPMode.FP16), ("bf16", AMPMode.BF16)):
        callbacks = [cb for cb in mixed_precision(learner(), name).cbs
                     if isinstance(cb, MixedPrecision)]
        assert [cb.amp_mode for cb in callbacks] == [mode]
    with pytest.raises(ValueError, match="precision must be one of"):
        mixed_precision(learner(), "fp8")


def test_the_state_file_keeps_its_keys_and_refuses_another_run(tmp_path):
    """run_state's round trip, and what a refusal leaves, are test_run_state's; here the
    text trainer's keys (state.json's since its first version) and its own error."""
    run = {"config": {"epochs": 2}}
    resume = run_state.open_run(str(tmp_path), schedule.STATE, run, fresh=schedule.new_state())
    assert list(resume.state)[:4] == ["version", "fingerprint", "stage", "epochs_done"]
    assert resume.state["fingerprint"] == run_state.fingerprint(run)
    assert resume.state["version"] == 1
    resume.save()
    with pytest.raises(TextTrainingError, match="holds the state of a different run"):
        run_state.open_run(str(tmp_path), schedule.STATE, {"config": {"epochs": 3}})


def test_monitor_direction():
    assert schedule.improved(0.4, 0.5, "valid_loss")
    assert not schedule.improved(0.6, 0.5, "valid_loss")
    assert schedule.improved(0.6, 0.5, "f1_score") and not schedule.improved(0.4, 0.5, "accuracy")
    assert schedule.improved(1.0, None, "accuracy")


def test_missing_assets_are_all_listed(tmp_path):
    root = tmp_path / "lm"
    (root / "fr" / "forward").mkdir(parents=True)
    (root / "fr" / "forward" / "config.json").write_text('{"arch": "AWD_LSTM"}')
    with pytest.raises(assets.MissingAssetsError) as err:
        assets.fetch_assets(str(root), "fr", False, str(tmp_path / "copy"))
    message = str(err.value)
    assert f"{root}/fr/forward/vocab.pkl" in message
    assert f"{root}/fr/forward/weights.pth" in message
    assert "config.json" not in message.split("missing:")[1]
    assert "pretrained=False" in message
    with pytest.raises(assets.MissingAssetsError) as err:
        assets.fetch_assets(str(root), "ja", True, str(tmp_path / "copy"))
    for name in ("ja/backward/config.json", "ja/backward/vocab.pkl", "ja/backward/weights.pth",
                 "ja/spm/spm.model"):  # the layout: contract.required_files
        assert f"{root}/{name}" in str(err.value)
    with pytest.raises(assets.MissingAssetsError, match="needs lm_assets_uri"):
        assets.fetch_assets("", "fr", False, str(tmp_path / "copy"))


def _lm_metrics(root, lang="fr", **directions):
    """An lm_metrics.json as the LM step writes it: per direction, whether it beat the
    unigram model (None: a file from before that was measured)."""
    import json

    root.mkdir(parents=True, exist_ok=True)
    (root / "lm_metrics.json").write_text(json.dumps({"lang": lang, "directions": {
        name: {"perplexity": 60.38, "unigram": {"perplexity": 43.5, "accuracy": 0.069},
               "beats_unigram": beats} for name, beats in directions.items()}}))


def test_assets_whose_language_model_learnt_nothing_are_refused(tmp_path):
    """The LM step's own metrics say the model is no better than a unigram model: the
    trainer refuses its assets before copying them, naming the file and the perplexities."""
    from tests.hostile import LM_FILE_BYTES

    root = tmp_path / "lm"
    for name in contract.required_files("fr", False) + contract.required_files("fr", True):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(LM_FILE_BYTES[name.rsplit("/", 1)[-1]])
    assert assets.fetch_assets(str(root), "fr", False, str(tmp_path / "c")).config == {}
    _lm_metrics(root, forward=False, backward=True)
    with pytest.raises(assets.UnlearntAssetsError) as err:
        assets.fetch_assets(str(root), "fr", False, str(tmp_path / "c"))
    message = str(err.value)
    assert f"{root}/lm_metrics.json says its forward language model (lang='fr') is no better " \
           "than a unigram model of its training tokens: held-out perplexity 60.38 vs the " \
           "unigram's 43.50" in message
    assert "Train the language model longer or on more text" in message
    assert "other lm_assets" in message
    # the backward model beat it: a backward run takes it
    assert assets.fetch_assets(str(root), "fr", True, str(tmp_path / "c")).config == {}
    for kept in ({"lang": "de", "forward": False},  # another language's report
                 {"forward": None}):  # written before the unigram was measured
        _lm_metrics(root, **kept)
        assert contract.unlearnt_lm(str(root), "fr", False) is None
    (root / "lm_metrics.json").write_text("not json")
    assert contract.unlearnt_lm(str(root), "fr", False) is None


def test_asset_config_forms():
    assert assets.parse_config('{"arch": "AWD_LSTM", "emb_sz": 8}', "c") == (
        "AWD_LSTM", {"emb_sz": 8})
    assert assets.parse_config('{"config": {"n_hid": 4}}', "c") == ("AWD_LSTM", {"n_hid": 4})
    with pytest.raises(assets.AssetConfigError, match="AWD_QRNN.*no longer ships"):
        assets.parse_config('{"arch": "AWD_QRNN"}', "c")
    with pytest.raises(assets.AssetConfigError, match="c is not JSON"):
        assets.parse_config("{", "c")


def test_constant_answer_is_the_label_frequencies_cut_at_the_threshold():
    train = np.array([[1, 0], [1, 0], [0, 1], [1, 0]])  # frequencies 0.75, 0.25
    valid = np.array([[1, 0], [0, 1]])
    multi = text_scores.constant_answer(valid, train, multi_label=True, threshold=0.3)
    # BCE of (0.75, 0.25) on the two rows, averaged over the 4 decisions
    expected = -(np.log(0.75) + np.log(0.75) + np.log(0.25) + np.log(0.25)) / 4
    assert multi["valid_loss"] == pytest.approx(expected)
    # 0.75 >= 0.3: label 0 always predicted (F1 2/3); 0.25 < 0.3: label 1 never (F1 0)
    assert multi["f1_score"] == pytest.approx((2 / 3 + 0) / 2)
    single = text_scores.constant_answer(valid, train, multi_label=False, threshold=0.3)
    assert single["valid_loss"] == pytest.approx(-(np.log(0.75) + np.log(0.25)) / 2)
    assert single["f1_score"] == pytest.approx((2 / 3) / 2)  # the majority class only


CONSTANT = {"valid_loss": 0.40, "f1_score": 0.10}


@pytest.mark.parametrize("rows, flagged", [
    # the collapse of the issue: loss and score flat at the constant answer's
    ([{"valid_loss": 0.41, "f1_score": 0.0}, {"valid_loss": 0.40, "f1_score": 0.04},
      {"valid_loss": 0.399, "f1_score": 0.11}], True),
    # a loss that falls is learning, even before the score moves (one-cycle warm-up)
    ([{"valid_loss": 0.40, "f1_score": 0.0}, {"valid_loss": 0.35, "f1_score": 0.0}], False),
    # a score clearly above the constant answer's is learning
    ([{"valid_loss": 0.40, "f1_score": 0.30}], False),
    # NaN losses (a diverged run) learnt nothing
    ([{"valid_loss": float("nan"), "f1_score": 0.0}], True),
])
def test_a_stage_that_learnt_nothing_is_told_from_one_that_learns(rows, flagged):
    reason = text_scores.learnt_nothing(rows, CONSTANT)
    assert (reason is not None) == flagged, reason


@pytest.mark.parametrize("accuracies, unigram, discarded", [
    ([0.056, 0.1104, 0.1104, 0.1104], 0.1102, True),   # the docstring corpus, defaults
    ([0.1056, 0.1356, 0.1418], 0.1359, True),           # Debian descriptions: barely moved
    ([0.12, 0.21, 0.26], 0.1102, False),                # a language model that learnt
    ([], 0.1, False),                                   # no LM epochs: nothing to judge
])
def test_a_language_model_stuck_at_the_most_frequent_token_is_not_a_start(
        accuracies, unigram, discarded):
    reason = schedule.lm_learnt_nothing([{"accuracy": a} for a in accuracies], unigram)
    assert (reason is not None) == discarded, reason


def test_a_pretrained_lm_keeps_the_rarer_task_tokens_it_knows_after_fastais_own():
    from collections import Counter

    from components.train_text.training import FAKE, with_pretrained_tokens

    counts = Counter({"xxbos": 9, "the": 9, "codec": 5, "flac": 2, "ogg": 1, "zzq": 1})
    task = ["xxunk", "xxpad", "xxbos", "the", "codec", FAKE, FAKE, FAKE]  # make_vocab, min_freq 3
    lm = ["xxunk", "xxpad", "xxbos", "the", "ogg", "flac", "player", FAKE]
    vocab = with_pretrained_tokens(task, counts, lm, max_vocab=60000)
    # fastai's tokens first and in its order, then the rarer known ones by frequency; the
    # LM's tokens the task never shows ("player") and unknown rare ones ("zzq") stay out
    assert vocab == ["xxunk", "xxpad", "xxbos", "the", "codec", "flac", "ogg", FAKE]
    assert len(with_pretrained_tokens(task, counts, lm, max_vocab=6)) == 8  # 6 + 2 padding
    assert with_pretrained_tokens(task, counts, lm, max_vocab=6)[:6] == vocab[:6]
    assert with_pretrained_tokens(task, counts, [], max_vocab=60000) == task  # knows nothing
