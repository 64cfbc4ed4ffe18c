"""The preflight step: settings a later step would refuse are refused first; the data
fingerprint changes exactly when the data does."""

import importlib.util
import inspect
import json
import os
import time

import pytest

from components.formats.lm_assets import TokenizerError, check_language, make_tokenizer
from components.preflight.checks import input_fingerprints, preflight
from components.preflight.component import preflight_function
from components.preflight.data import _HEAD_BYTES, check_predict_uri, data_fingerprint
from components.preflight.parameters import PreflightError, typed_parameter
from components.preflight.pipeline_checks import (
    CHECKS,
    check_image_run,
    check_text_run,
    lang_problems,
    model_config_problems,
)
from components.train_image.contract import weights_problem
from pipelines.definitions import image, lm, text, transformer
from tests.conftest import write_class_images, write_densenet_weights
from tests.hostile import LM_FILE_BYTES

PIPELINES = {"image": image.build("img:1"), "text": text.build("img:1"),
             "lm": lm.build("img:1"), "transformer": transformer.build("img:1")}


def _defaults(kind: str) -> dict:
    """The preflight's defaults: its pipeline's, and the compile-time tensorboard's ("")."""
    inputs = PIPELINES[kind].component_spec.inputs
    return {**{name: spec.default for name, spec in inputs.items()
               if spec.default is not None}, "tensorboard": ""}


IMAGE_DEFAULTS, TEXT_DEFAULTS, LM_DEFAULTS = (_defaults(kind) for kind in ("image", "text", "lm"))


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_preflight_takes_exactly_the_pipeline_parameters_and_passes_their_defaults(kind):
    pipeline = PIPELINES[kind]
    inputs = pipeline.component_spec.inputs
    preflight = pipeline.pipeline_spec.components[f"comp-preflight-{kind}"]
    taken = preflight.input_definitions.parameters
    # and the compile-time settings the pipeline passes (vertex.preflight_inputs)
    assert sorted(taken) == sorted([*inputs, "tensorboard"])
    root = pipeline.pipeline_spec.root.input_definitions.parameters
    for name in inputs:
        assert taken[name].default_value == root[name].default_value, name
        assert taken[name].parameter_type == root[name].parameter_type, name
    CHECKS[kind](_defaults(kind))


def test_values_arrive_as_text_or_typed():
    # Vertex writes whole numbers as "32", kfp.local as "32.0"; both are 32.
    assert {typed_parameter({"n": value}, "n", int) for value in ("32", "32.0", 32.0)} == {32}
    assert typed_parameter({"b": "true"}, "b", bool) is True
    assert typed_parameter({}, "b", bool, False) is False
    assert typed_parameter({"b": "yes"}, "b", bool) is True  # the one rule: the command line's
    # refused: a number that is not whole or not finite (rows of the tables below), and
    with pytest.raises(PreflightError, match="b: .*true or false"):
        typed_parameter({"b": "maybe"}, "b", bool)


@pytest.mark.parametrize("changes, message", [
    ({"epochs": -1}, "training: epochs must be >= 0"),
    ({"unfreeze_blocks": 7}, "unfreeze_blocks must be in 1..4"),
    ({"train_fraction": 0.0, "validation_fraction": 0.5, "test_fraction": 0.5},
     "train_fraction must be > 0"),
    ({"test_fraction": 0.0, "train_fraction": 0.9}, "test_fraction must be > 0"),
    ({"precision": "fp8"}, "precision must be one of"),
    ({"image_format": "webp"}, "sharding: "),
    ({"registration_metric": "auc"}, "registration_metric must be"),
    ({"registration_threshold": 1.5}, "registration_threshold must be in"),
    ({"batch_size": "2.5"}, "batch_size: expected a whole number"),
    ({"learning_rate": float("inf")}, "training: learning_rate: expected a finite number, got inf"),
    ({"target_shard_mb": "inf"}, "sharding: target_shard_mb: expected a finite number"),
    ({"train_fraction": float("nan")}, "train_fraction: expected a finite number, got nan"),
    ({"weights": "resnet"}, "weights 'resnet' is neither 'imagenet', 'none' nor an existing file"),
])
def test_image_settings_a_later_step_refuses(changes, message):
    with pytest.raises(PreflightError, match=message):
        check_image_run({**IMAGE_DEFAULTS, **changes})


@pytest.mark.parametrize("changes, message", [
    ({"threshold": 1.5}, "threshold must be > 0 and < 1, got 1.5"),
    ({"threshold": float("nan")}, "threshold: expected a finite number, got nan"),
    ({"epochs": 0}, "epochs must be >= 1"),
    ({"monitor": "auc"}, "monitor must be one of"),
    ({"validation_fraction": 0.0}, "preparation: validation_fraction must be > 0 and < 1"),
    ({"test_fraction": 0.0}, "test_fraction must be > 0 when eval_split is test"),
    ({"eval_split": "holdout"}, "eval_split must be"),
    # pretrained by default: only English has fastai's model without lm_assets
    ({"lang": "fr"}, "pretrained is true but lm_assets is empty"),
    # accuracy is the image pipeline's: multi-label evaluations have no top-level accuracy
    ({"registration_metric": "accuracy"},
     r"registration_metric must be one of \['micro_f1', 'macro_f1'\]"),
    ({"registration_threshold": -0.1}, "registration_threshold must be in"),
    ({"eval_batch_size": "0"}, "eval_batch_size must be >= 1, got 0"),
    ({"pretrained": True, "lang": "en", "model_config": '{"emb_sz": 400}'},
     "model_config applies to training from scratch"),
    # every problem is reported at once
    ({"threshold": 2.0, "eval_split": "x"}, "threshold must be .*; eval_split must be"),
])
def test_text_settings_a_later_step_refuses(changes, message):
    with pytest.raises(PreflightError, match=message):
        check_text_run({**TEXT_DEFAULTS, **changes})


def test_language_model_assets_missing_files_or_that_learnt_nothing_are_refused(tmp_path):
    """Missing files are listed; assets whose lm_metrics.json says the LM is no better than
    a unigram model are refused before any step runs, as the trainer refuses them; without
    the file (converted or staged weights) they pass."""
    run = {**TEXT_DEFAULTS, "lang": "fr", "lm_assets": str(tmp_path)}
    (tmp_path / "fr" / "forward").mkdir(parents=True)
    (tmp_path / "fr" / "forward" / "weights.pth").write_bytes(b"x")
    with pytest.raises(PreflightError, match="lacks .*fr/forward/config.json.*vocab.pkl"):
        check_text_run(run)
    for name, data in LM_FILE_BYTES.items():
        (tmp_path / "fr" / "forward" / name).write_bytes(data)
    check_text_run(run)
    (tmp_path / "lm_metrics.json").write_text(json.dumps({"lang": "fr", "directions": {
        "forward": {"perplexity": 15.0, "unigram": {"perplexity": 12.5},
                    "beats_unigram": False}}}))
    with pytest.raises(PreflightError, match=r"lm_assets refused: .*lm_metrics.json says its "
                                             r"forward language model .*no better than a "
                                             r"unigram model.*perplexity 15.00 vs the "
                                             r"unigram's 12.50.*Train the language model"):
        check_text_run(run)


def test_files_read_by_uri_are_fingerprinted_for_the_steps_that_read_them(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"a")
    weights = tmp_path / "densenet.h5"
    weights.write_bytes(b"w")
    image = {"weights": str(weights), "predict_uri": str(photos)}
    first = input_fingerprints("image", image)
    assert first == {"weights_fingerprint": data_fingerprint(str(weights), "weights"),
                     "predict_fingerprint": data_fingerprint(str(photos), "predict_uri")}
    assert input_fingerprints("image", {"weights": "imagenet", "predict_uri": ""}) == {
        "weights_fingerprint": "", "predict_fingerprint": ""}
    assets = tmp_path / "assets"
    (assets / "fr" / "forward").mkdir(parents=True)
    (assets / "fr" / "forward" / "weights.pth").write_bytes(b"lm")
    text = {"pretrained": True, "lm_assets": str(assets), "predict_uri": ""}
    assert input_fingerprints("text", text)["lm_assets_fingerprint"].endswith(":1")
    assert input_fingerprints("text", {**text, "pretrained": False}) == {
        "lm_assets_fingerprint": "", "predict_fingerprint": ""}


def test_fingerprint_follows_the_listing(tmp_path):
    root = tmp_path / "images"
    write_class_images(str(root), per_class=2)
    first = data_fingerprint(str(root))
    assert first == data_fingerprint(str(root)) and first.endswith(":6")
    path = root / "cat" / "000.jpg"
    data = path.read_bytes()
    time.sleep(0.01)
    path.write_bytes(data)  # same bytes, rewritten: a new version
    rewritten = data_fingerprint(str(root))
    assert rewritten != first
    os.rename(path, root / "cat" / "renamed.jpg")
    assert data_fingerprint(str(root)) not in (first, rewritten)
    with pytest.raises(PreflightError, match="does not exist"):
        data_fingerprint(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreflightError, match="empty folder"):
        data_fingerprint(str(tmp_path / "empty"))


def test_fingerprint_enters_linked_folders_as_sharding_does(tmp_path):
    root = tmp_path / "images"
    write_class_images(str(root), per_class=2)
    elsewhere = tmp_path / "more-cats"
    elsewhere.mkdir()
    (elsewhere / "a.jpg").write_bytes(b"a")
    (root / "cat" / "more").symlink_to(elsewhere)
    (elsewhere / "loop").symlink_to(elsewhere)  # a loop is listed once, not followed
    first = data_fingerprint(str(root))
    # 6 images, the one in the linked folder, the loop (named: not entered, as sharding does)
    assert first.endswith(":8")
    (elsewhere / "b.jpg").write_bytes(b"b")  # a new image inside the linked folder
    assert data_fingerprint(str(root)) != first


def test_fingerprint_of_a_gcs_object_follows_its_generation(gcs):
    bucket = gcs.create_bucket("fp-data")
    blob = bucket.blob("texts/reviews.csv")
    blob.upload_from_string("text,a\nhello,1\n")
    first = preflight("text", "gs://fp-data/texts/reviews.csv", TEXT_DEFAULTS)
    assert first == data_fingerprint("gs://fp-data/texts/reviews.csv")
    blob.upload_from_string("text,a\nhello,0\n")  # same size, new generation
    assert data_fingerprint("gs://fp-data/texts/reviews.csv") != first


def test_a_corpus_the_language_model_could_not_read_is_refused_first(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(PreflightError, match="holds no .txt files"):
        preflight("lm", str(tmp_path), LM_DEFAULTS)
    csv = tmp_path / "c.csv"
    csv.write_text("body,label\nsome text,1\n")
    with pytest.raises(PreflightError, match=r"no column 'text' \(its header: \['body', 'label'\]"):
        preflight("lm", str(csv), LM_DEFAULTS)
    assert preflight("lm", str(csv), {**LM_DEFAULTS, "text_column": "body"}).startswith("sha256:")
    with pytest.raises(PreflightError, match="corpus .* does not exist"):
        preflight("lm", str(tmp_path / "gone"), LM_DEFAULTS)
    with pytest.raises(PreflightError, match="training: .*validation_fraction must be > 0 and < 1"):
        preflight("lm", str(csv), {**LM_DEFAULTS, "text_column": "body",
                                   "validation_fraction": "1.5"})


def test_a_corpus_that_is_not_text_is_refused_before_training(tmp_path):
    """The issue's case: two 20 KB files of NUL bytes became an LM."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.txt", "b.txt"):
        (corpus / name).write_bytes(b"\0" * 20_000)
    with pytest.raises(PreflightError, match=r"2 of its 2 .txt files are not text, e.g. corpus "
                                             r"file 'a.txt' is not text: 20000 of its .*offset 0"):
        preflight("lm", str(corpus), LM_DEFAULTS)
    (corpus / "c.txt").write_text("Plain text.\n" * 100)
    (corpus / "d.txt").write_text("More text.\n" * 100)
    (corpus / "e.txt").write_text("And more.\n" * 100)
    assert preflight("lm", str(corpus), LM_DEFAULTS).startswith("sha256:")  # mostly text
    single = tmp_path / "one.txt"
    single.write_bytes("a corpus saved as UTF-16".encode("utf-16"))
    with pytest.raises(PreflightError, match=r"file 'one.txt' is not UTF-8 text: byte 0xff at "
                                             r"offset 0 .*looks like UTF-16"):
        preflight("lm", str(single), LM_DEFAULTS)
    binary = tmp_path / "c.csv"
    binary.write_bytes(b"\x1f\x8b\x08" + bytes(range(256)))
    with pytest.raises(PreflightError, match="gzip archive"):
        preflight("lm", str(binary), LM_DEFAULTS)


@pytest.mark.parametrize("kind", ["text", "lm"])
@pytest.mark.parametrize("changes, message", [
    ({"learning_rate": float("inf")}, "training: learning_rate: expected a finite number, got inf"),
    ({"validation_fraction": "nan"}, "validation_fraction: expected a finite number"),
    ({"model_config": "[1]"}, "model_config must be a JSON object"),
    ({"model_config": '{"embsz": 400}'},
     r"model_config: unknown AWD_LSTM setting\(s\) \['embsz'\]"),
    ({"lang": "klingon"}, "lang: spaCy has no tokenizer for lang='klingon'.*give a language code"),
])
def test_settings_the_text_and_lm_trainers_both_refuse(kind, changes, message):
    with pytest.raises(PreflightError, match=message):
        CHECKS[kind]({**_defaults(kind), **changes})


def test_model_config_values_take_the_type_of_fastais_defaults():
    defaults = {"emb_sz": 400, "hidden_p": 0.15, "bidir": False}
    assert model_config_problems({"emb_sz": 200, "hidden_p": 0, "bidir": True}, defaults) == []
    problems = model_config_problems(
        {"emb_sz": 400.5, "hidden_p": float("nan"), "bidir": 1, "init": "x"}, defaults)
    assert problems == [
        "model_config: unknown AWD_LSTM setting(s) ['init']; known: ['bidir', 'emb_sz', "
        "'hidden_p']",
        "model_config: emb_sz must be a whole number like the default 400, got 400.5",
        "model_config: hidden_p must be a finite number like the default 0.15, got nan",
        "model_config: bidir must be true or false like the default False, got 1",
    ]


# th and vi: spaCy has their rules, but their tokenizers need packages the image lacks.
@pytest.mark.parametrize("lang", ["en", "de", "xx", "ja", "th", "vi", "klingon"])
def test_the_language_check_agrees_with_the_tokenizer_the_trainers_build(lang, tmp_path):
    """The preflight's check (no fastai, no torch) passes where the trainers' tokenizer
    can be built, and fails with the same message where it cannot."""
    errors = []
    for call in (lambda: check_language(lang), lambda: make_tokenizer(lang, None, str(tmp_path))):
        try:
            call()
            errors.append(None)
        except TokenizerError as err:
            errors.append(str(err))
    assert errors[0] == errors[1]
    assert (errors[0] is None) is (lang in ("en", "de", "xx", "ja"))


def test_a_sentencepiece_language_without_the_package_is_refused(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sentencepiece" else find_spec(name, *a))
    [problem] = lang_problems("zh")
    assert "sentencepiece package is not installed" in problem and "fastai image" in problem


def test_weights_are_imagenet_none_or_an_existing_file(tmp_path):
    pytest.importorskip("tensorflow")
    weights = write_densenet_weights(tmp_path / "densenet_notop.h5", 32)
    for ok in ("imagenet", "none", "", weights, "gs://bucket/w/densenet121_notop.h5"):
        assert weights_problem(ok) == "", ok
    # A file that holds no DenseNet is refused before the data is sharded.
    not_weights = tmp_path / "densenet121_notop.h5"
    not_weights.write_bytes(b"x")
    problem = weights_problem(str(not_weights))
    assert problem.startswith(f"weights file {str(not_weights)!r} is not the no-top weights "
                              "of a tf-keras DenseNet"), problem
    for wrong in (str(tmp_path / "gone.h5"), str(tmp_path), "resnet", "ImageNet"):
        problem = weights_problem(wrong)
        assert problem.startswith(f"weights {wrong!r} is neither 'imagenet', 'none' nor an "
                                  "existing file: give"), problem


TENSORBOARD = "projects/p/locations/us-central1/tensorboards/123"


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_a_tensorboard_run_without_a_job_account_is_refused_naming_both_ways_out(tmp_path, kind):
    """compile.py --tensorboard checks its own --service-account; the run may clear it."""
    settings = {**_defaults(kind), "tensorboard": TENSORBOARD, "job_service_account": ""}
    with pytest.raises(PreflightError) as refused:
        preflight(kind, str(tmp_path / "data"), settings)
    message = str(refused.value)
    assert "set job_service_account" in message, message
    assert "compile without --tensorboard" in message


def test_a_tensorboard_run_with_a_job_account_goes_on(tmp_path):
    csv = tmp_path / "c.csv"
    csv.write_text("text\nsome text\n")
    settings = {**LM_DEFAULTS, "tensorboard": TENSORBOARD,
                "job_service_account": "trainer@p.iam.gserviceaccount.com"}
    assert preflight("lm", str(csv), settings).startswith("sha256:")


# ------------------------------------------------------------------ predict_uri's contents


@pytest.mark.parametrize("content, message", [
    (b"", r"is empty: give a CSV with a header row naming the text column \('text'\)"),
    (b"review,stars\nnice,5\n", r"has no column 'text' \(its header: \['review', 'stars'\]\)"),
    (b"text,stars\n", "has no text in column 'text' in its first rows"),
    (b"text\n  \n\"\"\n", "has no text in column 'text'"),
    (b"text\n\xff\xfeb\x00a\x00d\x00\n", "is not UTF-8 text: byte 0xff at offset 5"),
    (b"text\n" + b"\x00" * 100 + b"\n",
     r"holds 1 texts that are not text in its first 1 rows \(the first: not text: a NUL"),
    # pandas (prediction's reader) refuses a row with more cells than the header
    (b"id,text\n0,Aa aa.\n1,Bb,extra,cells\n", "has data row 2 of 4 cells, its header 2"),
])
def test_a_predict_csv_that_cannot_be_labelled_is_refused_before_training(
        tmp_path, content, message):
    """Before, only the file's existence was checked: an empty export trained and
    evaluated, then died in prediction with pandas' EmptyDataError."""
    path = tmp_path / "new.csv"
    path.write_bytes(content)
    with pytest.raises(PreflightError, match=f"predict_uri '{path}' {message}"):
        check_predict_uri(str(path), "text")
    # BOM, accents, a quoted comma (one cell)
    path.write_bytes(b'\xef\xbb\xbftext,id\n"\xc3\xa9t\xc3\xa9, bien",1\n')
    check_predict_uri(str(path), "text")


def test_a_predict_csv_is_read_for_the_training_text_column_and_its_head_only(tmp_path):
    path = tmp_path / "new.csv"
    path.write_text("body\n" + "word " * 5 + "\n")
    with pytest.raises(PreflightError, match="has no column 'text'"):
        preflight("text", str(path), {**TEXT_DEFAULTS, "predict_uri": str(path)})
    check_predict_uri(str(path), "text", "body")
    # a file far larger than the head, cut inside a two-byte character, is read by its head
    row = "é" * 40 + "\n"
    path.write_text("body\n" + row * 20000, encoding="utf-8")
    assert os.path.getsize(path) > 20 * _HEAD_BYTES
    check_predict_uri(str(path), "text", "body")


def test_an_image_predict_folder_with_nothing_in_it_is_refused(tmp_path):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    (folder / ".DS_Store").write_bytes(b"x")
    with pytest.raises(PreflightError, match=r"predict_uri: no files under .*photos.* \(1 hidden"):
        check_predict_uri(str(folder), "image")
    (folder / "sub" / "cat.jpg").write_bytes(b"jpeg")
    check_predict_uri(str(folder), "image")


def test_a_written_preflight_reads_as_source_and_refuses_like_its_pipeline():
    """KFP pastes the written function's source; the function itself checks the run."""
    written = preflight_function("lm", [inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=type(default))
        for name, default in (("corpus_uri", "/no/such/corpus.txt"), ("epochs", 0))])
    source = inspect.getsource(written)
    assert source.startswith("def preflight_lm(\n    corpus_uri: str = \"/no/such/corpus.txt\",")
    assert "    tensorboard: str = \"\",\n) -> str:" in source
    with pytest.raises(PreflightError, match="epochs"):
        written()

