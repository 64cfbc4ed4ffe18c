"""Tests of the evaluation step: metrics by hand, the evaluator end to end, the KFP component."""

import json
import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import pytest
from PIL import Image

from components.common import metrics as m


def one_hot_probs(y_pred, k, high=0.6):
    """Probabilities whose argmax is y_pred: `high` on it, the rest shared."""
    probs = np.full((len(y_pred), k), (1 - high) / (k - 1))
    probs[np.arange(len(y_pred)), y_pred] = high
    return probs


def assert_no_nan(value):
    json.dumps(value, allow_nan=False)  # raises on NaN or infinity anywhere


# --------------------------------------------------------------------------- single-label


def test_single_label_three_classes_by_hand():
    y_true = [0, 0, 0, 1, 1, 2, 2, 2]
    y_pred = [0, 0, 1, 1, 1, 2, 0, 0]
    # Counted by hand: rows true a/b/c, columns predicted a/b/c.
    expected_matrix = [[2, 1, 0], [0, 2, 0], [2, 0, 1]]
    result = m.single_label_metrics(np.array(y_true), one_hot_probs(y_pred, 3), ["a", "b", "c"])

    assert result["confusion_matrix"] == {"labels": ["a", "b", "c"], "matrix": expected_matrix}
    assert result["accuracy"] == pytest.approx(5 / 8)
    per = result["per_class"]
    # precision = tp / column sum, recall = tp / row sum, F1 = 2tp / (2tp + fp + fn)
    assert [per[c]["precision"] for c in "abc"] == pytest.approx([2 / 4, 2 / 3, 1 / 1])
    assert [per[c]["recall"] for c in "abc"] == pytest.approx([2 / 3, 2 / 2, 1 / 3])
    assert [per[c]["f1"] for c in "abc"] == pytest.approx([4 / 7, 4 / 5, 1 / 2])
    assert [per[c]["support"] for c in "abc"] == [3, 2, 3]
    assert [per[c]["predicted"] for c in "abc"] == [4, 3, 1]
    assert result["macro_f1"] == pytest.approx(float(Fraction(131, 210)))
    assert result["weighted_f1"] == pytest.approx(float(Fraction(337, 560)))
    assert "roc" not in result and "roc_auc" not in result
    assert result["num_examples"] == 8 and result["task"] == "single_label"


def test_zero_support_and_never_predicted_classes_give_zero_not_nan():
    # "c" never occurs and is never predicted; "d" is predicted once but never occurs.
    result = m.single_label_metrics(np.array([0, 1, 0, 1]), one_hot_probs([0, 1, 3, 1], 4),
                                    ["a", "b", "c", "d"])
    c, d = result["per_class"]["c"], result["per_class"]["d"]
    assert [(v["precision"], v["recall"], v["f1"], v["support"], v["predicted"])
            for v in (c, d)] == [(0.0, 0.0, 0.0, 0, 0), (0.0, 0.0, 0.0, 0, 1)]
    # Macro averages count absent classes as 0 (scikit-learn's convention with labels given).
    assert result["macro_f1"] == pytest.approx((2 / 3 + 1.0 + 0 + 0) / 4)
    assert_no_nan(result)


def test_binary_roc_known_example():
    # scikit-learn's documented example; its first threshold is inf, ours is 1.0.
    y_true = np.array([0, 0, 1, 1])
    scores = np.array([0.1, 0.4, 0.35, 0.8])
    result = m.single_label_metrics(y_true, np.c_[1 - scores, scores], ["neg", "pos"])
    roc = result["roc"]
    assert roc["fpr"] == pytest.approx([0, 0, 0.5, 0.5, 1])
    assert roc["tpr"] == pytest.approx([0, 0.5, 0.5, 1, 1])
    assert roc["thresholds"] == pytest.approx([1.0, 0.8, 0.4, 0.35, 0.1])
    assert result["roc_auc"] == pytest.approx(0.75) and roc["auc"] == result["roc_auc"]
    assert result["positive_class"] == "pos"


@pytest.mark.parametrize("scores, auc", [
    ([0.1, 0.2, 0.3, 0.8, 0.9], 1.0),   # perfect
    ([0.9, 0.8, 0.7, 0.2, 0.1], 0.0),   # reversed
    ([0.5, 0.5, 0.5, 0.5, 0.5], 0.5),   # all tied
])
def test_binary_roc_endpoints_and_auc(scores, auc):
    y_true = np.array([0, 0, 0, 1, 1])
    scores = np.array(scores)
    roc = m.single_label_metrics(y_true, np.c_[1 - scores, scores], ["no", "yes"])["roc"]
    assert (roc["fpr"][0], roc["tpr"][0]) == (0.0, 0.0)
    assert (roc["fpr"][-1], roc["tpr"][-1]) == (1.0, 1.0)
    assert roc["auc"] == pytest.approx(auc)
    assert all(math.isfinite(t) for t in roc["thresholds"])


def test_roc_first_threshold_stays_finite_when_a_score_is_one():
    scores = np.array([0.0, 1.0, 1.0, 0.3])
    roc = m.single_label_metrics(np.array([0, 1, 1, 0]), np.c_[1 - scores, scores],
                                 ["a", "b"])["roc"]
    assert 1.0 < roc["thresholds"][0] < 1.0 + 1e-9
    assert_no_nan(roc)


@pytest.mark.parametrize("y_true, y_pred", [([1, 1, 1], [1, 0, 1]), ([0, 0], [0, 1])])
def test_roc_of_one_class_data_is_none(y_true, y_pred):
    result = m.single_label_metrics(np.array(y_true), one_hot_probs(y_pred, 2), ["a", "b"])
    assert result["roc"] is None and result["roc_auc"] is None
    assert_no_nan(result)
    assert m.roc_curve(np.zeros(len(y_true), bool), np.array(y_pred, float)) is None  # no positives


def test_roc_keeps_the_top_scores_point_on_a_straight_first_segment():
    # Perfect ranking: (0, 0) -> (0, 0.5) -> (0, 1) is straight, but (0, 0.5) is a real
    # operating point (threshold 0.9, one true positive) and scikit-learn keeps it.
    scores = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    roc = m.roc_curve(np.array([0, 0, 0, 1, 1]) == 1, scores)
    assert roc["fpr"] == [0.0, 0.0, 0.0, 1.0]
    assert roc["tpr"] == [0.0, 0.5, 1.0, 1.0]
    assert roc["thresholds"] == [1.0, 0.9, 0.8, 0.1]
    assert roc["auc"] == 1.0


def test_single_class_data_among_three_classes_by_hand():
    # Every example is "a"; predicted a, a, b, c.
    result = m.single_label_metrics(np.array([0, 0, 0, 0]), one_hot_probs([0, 0, 1, 2], 3),
                                    ["a", "b", "c"])
    a, b = result["per_class"]["a"], result["per_class"]["b"]
    assert (a["precision"], a["recall"], a["f1"]) == pytest.approx((1.0, 0.5, 2 / 3))
    assert (b["precision"], b["recall"], b["f1"], b["support"], b["predicted"]) == (0, 0, 0, 0, 1)
    assert result["accuracy"] == 0.5
    assert result["macro_f1"] == pytest.approx(2 / 9)
    assert result["weighted_f1"] == pytest.approx(2 / 3)  # all the support is on "a"
    assert result["confusion_matrix"]["matrix"] == [[2, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert_no_nan(result)


def test_argmax_ties_pick_the_lowest_class():
    result = m.single_label_metrics(np.array([1, 1]), np.full((2, 3), 1 / 3), ["a", "b", "c"])
    assert result["confusion_matrix"]["matrix"] == [[0, 0, 0], [2, 0, 0], [0, 0, 0]]
    assert result["accuracy"] == 0.0


def test_roc_is_thinned_but_auc_is_exact():
    metrics_sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 2, 5000)
    scores = np.clip(rng.normal(0.4 + 0.2 * y_true, 0.2), 0, 1).round(4)
    result = m.single_label_metrics(y_true, np.c_[1 - scores, scores], ["a", "b"])
    roc = result["roc"]
    fpr_sk, tpr_sk, thresholds_sk = metrics_sk.roc_curve(y_true, scores)
    full = m.roc_curve(y_true == 1, scores, max_points=10**9)
    assert full["fpr"] == pytest.approx(fpr_sk) and full["tpr"] == pytest.approx(tpr_sk)
    assert full["thresholds"][1:] == pytest.approx(thresholds_sk[1:])
    assert len(fpr_sk) > 2 * m.ROC_MAX_POINTS  # so the thinning below ran
    assert 2 <= len(roc["fpr"]) <= m.ROC_MAX_POINTS
    assert (roc["fpr"][0], roc["tpr"][0], roc["fpr"][-1], roc["tpr"][-1]) == (0, 0, 1, 1)
    assert np.all(np.diff(roc["fpr"]) >= 0) and np.all(np.diff(roc["tpr"]) >= 0)
    assert np.all(np.diff(roc["thresholds"]) < 0)
    assert result["roc_auc"] == pytest.approx(metrics_sk.roc_auc_score(y_true, scores))
    # The thinned curve still traces the same area closely.
    assert np.trapezoid(roc["tpr"], roc["fpr"]) == pytest.approx(result["roc_auc"], abs=2e-3)


def test_single_label_agrees_with_sklearn():
    metrics_sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    k = 5
    y_true = rng.integers(0, k - 1, 300)  # the last class never occurs
    y_prob = rng.dirichlet(np.ones(k), 300)
    y_prob[np.arange(150), y_true[:150]] += 1  # better than chance
    result = m.single_label_metrics(y_true, y_prob, list("abcde"))
    y_pred = y_prob.argmax(1)
    labels = list(range(k))
    assert result["accuracy"] == pytest.approx(metrics_sk.accuracy_score(y_true, y_pred))
    for average, key in (("macro", "macro_f1"), ("weighted", "weighted_f1")):
        assert result[key] == pytest.approx(metrics_sk.f1_score(
            y_true, y_pred, labels=labels, average=average, zero_division=0))
    assert [v["f1"] for v in result["per_class"].values()] == pytest.approx(
        metrics_sk.f1_score(y_true, y_pred, labels=labels, average=None, zero_division=0))
    assert result["confusion_matrix"]["matrix"] == metrics_sk.confusion_matrix(
        y_true, y_pred, labels=labels).tolist()


@pytest.mark.parametrize("call, words", [
    (lambda: m.single_label_metrics(np.array([0, 1]), one_hot_probs([0, 1], 2), ["a"]),
     "class names"),
    (lambda: m.single_label_metrics(np.array([0, 2]), one_hot_probs([0, 1], 2), ["a", "b"]),
     "labels must be in"),
    (lambda: m.single_label_metrics(np.zeros(0, int), np.zeros((0, 2)), ["a", "b"]),
     "no examples"),
    (lambda: m.multi_label_metrics(np.zeros((0, 2), int), np.zeros((0, 2)), ["x", "y"]),
     "no examples"),
    (lambda: m.multi_label_metrics(np.array([[2, 0]]), np.array([[0.5, 0.5]]), ["x", "y"]),
     "only 0 and 1"),
    (lambda: m.tune_thresholds(np.zeros((2, 2), int), np.zeros((2, 3))), "must both be"),
    (lambda: m.tune_thresholds(ML_TRUE, ML_PROB, grid=[]), "grid is empty"),
], ids=["too-few-names", "label-out-of-range", "single-empty", "multi-empty", "not-0-or-1",
        "shapes", "empty-grid"])
def test_bad_input_is_refused(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# --------------------------------------------------------------------------- multi-label

ML_TRUE = np.array([[1, 0], [1, 1], [0, 0], [0, 1]])
ML_PROB = np.array([[0.9, 0.2], [0.6, 0.4], [0.7, 0.1], [0.2, 0.3]])


def test_multi_label_micro_and_macro_by_hand():
    result = m.multi_label_metrics(ML_TRUE, ML_PROB, ["x", "y"], threshold=0.5)
    # Predicted at 0.5: x = [1, 1, 1, 0] (tp 2, fp 1, fn 0); y = [0, 0, 0, 0] (tp 0, fp 0, fn 2).
    x, y = result["per_label"]["x"], result["per_label"]["y"]
    assert (x["precision"], x["recall"], x["f1"]) == pytest.approx((2 / 3, 1.0, 4 / 5))
    assert (y["precision"], y["recall"], y["f1"]) == (0.0, 0.0, 0.0)
    assert (x["accuracy"], y["accuracy"]) == pytest.approx((3 / 4, 2 / 4))
    assert (x["support"], y["support"], x["predicted"], y["predicted"]) == (2, 2, 3, 0)
    # Micro pools the counts: tp 2, fp 1, fn 2 -> F1 = 4 / 7; macro is the mean of 0.8 and 0.
    assert result["micro_f1"] == pytest.approx(4 / 7)
    assert result["micro_precision"] == pytest.approx(2 / 3)
    assert result["micro_recall"] == pytest.approx(1 / 2)
    assert result["macro_f1"] == pytest.approx(0.4)
    assert result["subset_accuracy"] == pytest.approx(1 / 4)
    assert result["hamming_loss"] == pytest.approx(3 / 8)
    assert result["thresholds"] == [0.5, 0.5]
    assert_no_nan(result)
    # one threshold per label
    result = m.multi_label_metrics(ML_TRUE, ML_PROB, ["x", "y"], threshold=[0.5, 0.25])
    assert result["per_label"]["y"]["f1"] == 1.0
    assert result["per_label"]["y"]["threshold"] == 0.25
    assert result["micro_f1"] == pytest.approx(8 / 9)  # tp 4, fp 1, fn 0
    assert result["macro_f1"] == pytest.approx(0.9)


def test_multi_label_agrees_with_sklearn():
    metrics_sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    y_true = (rng.random((200, 6)) < 0.3).astype(int)
    y_true[:, 5] = 0  # a label that never occurs
    y_prob = np.clip(0.35 * y_true + rng.random((200, 6)) * 0.7, 0, 1)
    result = m.multi_label_metrics(y_true, y_prob, list("abcdef"), threshold=0.5)
    y_pred = (y_prob >= 0.5).astype(int)
    for average in ("micro", "macro"):
        assert result[f"{average}_f1"] == pytest.approx(
            metrics_sk.f1_score(y_true, y_pred, average=average, zero_division=0))
    assert result["hamming_loss"] == pytest.approx(metrics_sk.hamming_loss(y_true, y_pred))
    assert result["subset_accuracy"] == pytest.approx(metrics_sk.accuracy_score(y_true, y_pred))


def test_multi_label_with_one_label_by_hand():
    # One column must stay one label (scikit-learn would read it as two classes).
    result = m.multi_label_metrics(ML_TRUE[:, :1], ML_PROB[:, :1], ["x"], threshold=0.5)
    assert list(result["per_label"]) == ["x"]
    x = result["per_label"]["x"]  # predicted [1, 1, 1, 0]: tp 2, fp 1, fn 0, tn 1
    assert (x["precision"], x["recall"], x["f1"]) == pytest.approx((2 / 3, 1.0, 4 / 5))
    assert (x["accuracy"], x["support"], x["predicted"]) == (0.75, 2, 3)
    assert (result["micro_f1"], result["macro_f1"]) == pytest.approx((4 / 5, 4 / 5))
    assert (result["subset_accuracy"], result["hamming_loss"]) == (0.75, 0.25)
    assert m.tune_thresholds(ML_TRUE[:, :1], ML_PROB[:, :1]).tolist() == [0.5]


def test_multi_label_with_nothing_true_and_nothing_predicted_is_zero_not_nan():
    result = m.multi_label_metrics(np.zeros((3, 2), int), np.full((3, 2), 0.1), ["x", "y"])
    for key in ("micro_precision", "micro_recall", "micro_f1", "macro_f1", "hamming_loss"):
        assert result[key] == 0.0
    assert result["subset_accuracy"] == 1.0
    assert result["per_label"]["x"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                        "accuracy": 1.0, "support": 0, "predicted": 0,
                                        "threshold": 0.5}
    assert_no_nan(result)


def test_tuned_f1_is_the_best_f1_on_the_grid():
    # tune_thresholds counts F1 itself (speed); it must agree with multi_label_metrics'.
    rng = np.random.default_rng(4)
    y_true = (rng.random((250, 5)) < [0.0, 0.05, 0.2, 0.4, 0.6]).astype(int)
    y_prob = np.clip(0.3 * y_true + rng.random((250, 5)) * 0.7, 0, 1).round(2)
    names = list("abcde")
    grid = [0.1, 0.3, 0.5, 0.7]
    tuned = m.multi_label_metrics(y_true, y_prob, names, m.tune_thresholds(y_true, y_prob, grid))
    for name in names:
        at_grid = [m.multi_label_metrics(y_true, y_prob, names, t)["per_label"][name]["f1"]
                   for t in grid]
        assert tuned["per_label"][name]["f1"] == max(at_grid)
    assert tuned["per_label"]["a"]["threshold"] == 0.5  # no positives: F1 0 everywhere
    # so never below a fixed 0.5 (in the grid); on this data tuning helps, not just ties
    assert tuned["macro_f1"] > m.multi_label_metrics(y_true, y_prob, names, 0.5)["macro_f1"]


def test_tune_thresholds_by_hand():
    # x: F1 0.8 for any threshold in (0.2, 0.6]: 0.5 is nearest 0.5. y: F1 1 in (0.2, 0.3].
    assert m.tune_thresholds(ML_TRUE, ML_PROB).tolist() == [0.5, 0.3]
    # (a label without positives keeps 0.5: test_tuned_f1_is_the_best_f1_on_the_grid's "a")


# --------------------------------------------------------------------------- summaries


def test_scalar_summary_and_markdown_report():
    result = m.single_label_metrics(np.array([0, 0, 1, 1]), one_hot_probs([0, 1, 1, 1], 2),
                                    ["cat|dog", "bird 2"])
    scalars = m.scalar_summary(result)
    assert scalars["accuracy"] == pytest.approx(0.75)
    assert scalars["num_examples"] == 4.0
    assert set(scalars) >= {"macro_f1", "weighted_f1", "roc_auc", "f1_cat_dog", "f1_bird_2"}
    assert "f1_cat_dog" not in m.scalar_summary(result, max_per_class=1)

    report = m.markdown_report({"split": "test", **result}, "Eval")
    assert report.startswith("# Eval\n")
    assert "**Accuracy:** 0.7500" in report and "**ROC AUC**" in report
    assert "| cat\\|dog | 1.0000 | 0.5000 | 0.6667 | 2 | 1 |" in report  # pipe escaped
    assert "| bird 2 | 0 | 2 |" in report  # confusion matrix row
    assert "split: `test`" in report

    multi = m.multi_label_metrics(ML_TRUE, ML_PROB, ["x", "y"])
    assert set(m.scalar_summary(multi)) >= {"micro_f1", "macro_f1", "f1_x", "f1_y"}
    report = m.markdown_report(multi, "Text")
    assert "**Micro F1:** 0.5714" in report and "| y | 0.50 |" in report


# --------------------------------------------------------------------------- end to end

COLOURS = {"blue": (30, 40, 220), "green": (40, 200, 50), "red": (220, 30, 40)}


def make_dataset(tmp_path_factory, classes, per_class=20):
    """Shards tiny noisy single-colour images, one class per colour."""
    from components.shard.sharding import ShardConfig, shard_dataset

    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    for name in classes:
        (root / "raw" / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(np.array(COLOURS[name]) + rng.normal(0, 25, (40, 40, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8)).save(root / "raw" / name / f"{i}.png")
    config = ShardConfig(image_size=32, min_shards_per_split=2, num_workers=1,
                         train_fraction=0.6, validation_fraction=0.2, test_fraction=0.2)
    shard_dataset(str(root / "raw"), str(root / "shards"), config, progress=False)
    return root / "shards"


def save_model(folder, classes, scale=10.0):
    """A tiny tf-keras classifier of mean colour, weights set by hand, saved as the trainer does.

    Pixels 0..255 -> /255 -> mean over the image -> Dense(softmax) whose weight
    links each class to its colour's channel, so it classifies the colours above.
    """
    import tf_keras

    inputs = tf_keras.Input((32, 32, 3))
    x = tf_keras.layers.Rescaling(1 / 255)(inputs)
    x = tf_keras.layers.GlobalAveragePooling2D()(x)
    outputs = tf_keras.layers.Dense(len(classes), activation="softmax")(x)
    model = tf_keras.Model(inputs, outputs)
    channel = {"red": 0, "green": 1, "blue": 2}
    kernel = np.zeros((3, len(classes)), np.float32)
    for j, name in enumerate(classes):
        kernel[channel[name], j] = scale
    model.layers[-1].set_weights([kernel, np.zeros(len(classes), np.float32)])
    folder.mkdir(parents=True, exist_ok=True)
    model.save(folder / "model.keras")
    (folder / "labels.json").write_text(json.dumps({"classes": list(classes)}))
    return folder


@pytest.fixture(scope="module")
def rgb_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory, ["blue", "green", "red"])


@pytest.fixture(scope="module")
def rgb_model(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("model") / "model", ["blue", "green", "red"])


def test_evaluate_image_model_end_to_end(rgb_dataset, rgb_model, tmp_path):
    from components.evaluate_image.evaluation import evaluate_image_model
    from components.shard.contract import read_manifest

    manifest = read_manifest(str(rgb_dataset))
    test_counts = manifest["splits"]["test"]["class_counts"]
    out = tmp_path / "eval"
    result = evaluate_image_model(str(rgb_model), str(rgb_dataset), str(out), batch_size=5)

    written = json.loads((out / "metrics.json").read_text())
    assert written == result
    assert result["num_examples"] == manifest["splits"]["test"]["count"] == 12
    assert result["split"] == "test" and result["model_dir"] == str(rgb_model)
    assert result["accuracy"] == 1.0
    assert result["confusion_matrix"]["labels"] == ["blue", "green", "red"]
    assert np.diag(result["confusion_matrix"]["matrix"]).tolist() == [
        test_counts[c] for c in ("blue", "green", "red")]
    assert {c: v["support"] for c, v in result["per_class"].items()} == test_counts
    report = (out / "report.md").read_text()
    assert "**Examples:** 12" in report and "| red | 0 | 0 | 4 |" in report
    # Beside it, on the same 12 images: pixels (one colour per class: all right) and the
    # majority class of the train split (a third of a balanced test split).
    linear, majority = result["baseline"]["pixels_logreg"], result["baseline"]["majority_class"]
    assert linear["accuracy"] == 1.0 and linear["C"] in (1.0, 10.0, 100.0)
    train_counts = manifest["splits"]["train"]["class_counts"]
    most = max(sorted(train_counts), key=train_counts.get)
    assert majority["accuracy"] == pytest.approx(test_counts[most] / 12)
    assert set(linear) - {"C"} == set(majority) == {"accuracy", "micro_f1", "macro_f1",
                                                     "weighted_f1"}
    assert "| pixels_logreg | 1.0000 |" in report and "| majority_class |" in report

    validation = evaluate_image_model(str(rgb_model), str(rgb_dataset), str(tmp_path / "v"),
                                      split="validation")
    assert validation["num_examples"] == manifest["splits"]["validation"]["count"]


def test_class_list_mismatch_or_no_labels_file_fails_clearly(rgb_dataset, tmp_path):
    from components.evaluate_image.evaluation import EvaluationError, evaluate_image_model
    from components.train_image.contract import ContractError

    with pytest.raises(ContractError, match="labels.json not found"):
        evaluate_image_model(str(tmp_path), str(rgb_dataset), str(tmp_path / "o"))
    reordered = tmp_path / "reordered"
    reordered.mkdir()
    (reordered / "labels.json").write_text(json.dumps({"classes": ["red", "green", "blue"]}))
    with pytest.raises(EvaluationError, match="different order"):
        evaluate_image_model(str(reordered), str(rgb_dataset), str(tmp_path / "o"))

    other = tmp_path / "other"
    other.mkdir()
    (other / "labels.json").write_text(json.dumps({"classes": ["blue", "green", "cyan"]}))
    with pytest.raises(EvaluationError, match=r"only in the model: \['cyan'\]; only in the "
                                              r"dataset: \['red'\]"):
        evaluate_image_model(str(other), str(rgb_dataset), str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_settings_an_evaluation_refuses_are_refused_before_it_reads_anything(tmp_path):
    """The rules the preflight holds the pipeline's eval_* parameters to (`contract`)."""
    from components.evaluate_image.evaluation import EvaluationError, evaluate_image_model
    from components.evaluate_text.evaluation import evaluate_text_model

    with pytest.raises(EvaluationError, match="^batch_size must be >= 1, got 0$"):
        evaluate_image_model(str(tmp_path), str(tmp_path), str(tmp_path / "o"), batch_size=0)
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0; split must be one "
                                         r"of \['train', 'validation', 'test'\], got 'dev'$"):
        evaluate_text_model(str(tmp_path), str(tmp_path), str(tmp_path / "o"), "dev", None, 0)


# --------------------------------------------------------------------------- KFP component


@pytest.mark.slow
def test_component_runs_in_kfp_local(tmp_path_factory, tmp_path):
    from kfp import dsl, local
    from kfp.dsl import Artifact, ClassificationMetrics, Dataset, Metrics, Model

    from components.evaluate_image.component import evaluate_image_classifier
    from pipelines.definitions.steps import component

    dataset_dir = make_dataset(tmp_path_factory, ["blue", "red"])
    model_dir = save_model(tmp_path / "model", ["blue", "red"], scale=3.0)
    local.init(runner=local.SubprocessRunner(use_venv=False),
               pipeline_root=str(tmp_path / "root"), workspace_root=str(tmp_path / "ws"))
    evaluate = component(evaluate_image_classifier, "python:3.11")

    class Outputs(NamedTuple):
        metrics: Metrics
        classification_metrics: ClassificationMetrics
        evaluation: Artifact

    @dsl.pipeline
    def evaluate_pipeline() -> Outputs:
        model = dsl.importer(artifact_uri=str(model_dir), artifact_class=Model)
        dataset = dsl.importer(artifact_uri=str(dataset_dir), artifact_class=Dataset)
        task = evaluate(model=model.output, dataset=dataset.output, batch_size=3)
        return Outputs(metrics=task.outputs["metrics"],
                       classification_metrics=task.outputs["classification_metrics"],
                       evaluation=task.outputs["evaluation"])

    run = evaluate_pipeline()
    scalars = run.outputs["metrics"].metadata
    assert scalars["accuracy"] == 1.0
    assert scalars["num_examples"] == 8
    assert {"macro_f1", "roc_auc", "f1_blue", "f1_red"} <= set(scalars)
    classification = run.outputs["classification_metrics"].metadata
    assert classification["confusionMatrix"]["rows"] == [{"row": [4, 0]}, {"row": [0, 4]}]
    roc = classification["confidenceMetrics"]
    assert roc[0]["falsePositiveRate"] == 0 and roc[-1]["recall"] == 1
    folder = run.outputs["evaluation"].path
    written = json.loads(open(f"{folder}/metrics.json").read())
    # The console's curve is metrics.json's ROC, thresholds clipped to [0, 1], falling.
    thresholds = [point["confidenceThreshold"] for point in roc]
    assert thresholds == [min(max(t, 0.0), 1.0) for t in written["roc"]["thresholds"]]
    assert all(a > b for a, b in zip(thresholds, thresholds[1:]))
    assert [point["falsePositiveRate"] for point in roc] == written["roc"]["fpr"]
    assert written["num_examples"] == 8 and written["roc_auc"] == 1.0
    assert open(f"{folder}/report.md").read().startswith("# Image classifier evaluation")


def test_the_worst_mistakes_are_the_most_confident_wrong_predictions():
    from components.evaluate_image.report import pick, worst_mistakes
    from components.evaluate_text.report import worst_mistakes as worst_texts

    y_true = np.array([0, 1, 2, 0, 1])
    y_prob = np.array([[0.9, 0.1, 0], [0.8, 0.2, 0], [0.3, 0.3, 0.4], [0.1, 0.6, 0.3],
                       [0.2, 0.1, 0.7]])
    assert worst_mistakes(y_true, y_prob) == [1, 4, 3]  # right ones (0, 2) never
    assert worst_mistakes(y_true, y_prob, limit=2) == [1, 4]
    assert list(pick(iter(["a", "b", "c", "d", "e"]), [3, 1])) == [1, 3]
    truth = np.array([[1, 0], [0, 1], [1, 1]])
    probs = np.array([[0.9, 0.1], [0.6, 0.3], [0.5, 0.55]])
    predicted = (probs >= 0.5).astype(int)
    assert worst_texts(truth, probs, predicted) == [1]


def test_image_report_shows_confusions_training_and_mistakes_in_a_browser(
        rgb_dataset, tmp_path):
    """A model that takes red for green: the report (rendered in Chromium) has every plot,
    the phases of the trainer's history, and the red test images shown as mistakes."""
    from components.evaluate_image.evaluation import evaluate_image_model
    from components.shard.contract import read_manifest
    from tests.browser import check_report

    model = save_model(tmp_path / "model", ["blue", "green", "red"])
    import tf_keras

    keras_model = tf_keras.models.load_model(model / "model.keras")
    kernel, bias = keras_model.layers[-1].get_weights()
    kernel[0] = [0, 10, 0]  # red pixels vote green
    keras_model.layers[-1].set_weights([kernel, bias])
    keras_model.save(model / "model.keras")
    rows = [{"epoch": e, "loss": 1 / (e + 1), "val_loss": 1.2 / (e + 1),
             "accuracy": e / 4, "val_accuracy": e / 5} for e in range(3)]
    (model / "history.json").write_text(json.dumps({"head": rows[:2], "fine_tune": rows[2:]}))
    result = evaluate_image_model(str(model), str(rgb_dataset), str(tmp_path / "eval"))
    manifest = read_manifest(str(rgb_dataset))
    red = manifest["splits"]["test"]["class_counts"]["red"]
    assert result["confusion_matrix"]["matrix"][2] == [0, red, 0]
    page = check_report(tmp_path / "eval" / "report.html", tmp_path / "shot.png",
                        {"confusion", "per-class", "curves", "training"},
                        ["blue", "green", "red"], manifest["splits"]["test"]["count"],
                        ["pixels_logreg", "majority_class"])
    assert page.count("true red") == red and "head" in page and "fine_tune" in page
