"""Batch prediction's own rules: decisions, bad input, whole-or-nothing output, gs:// both ways,
with tiny hand-made models (trained ones predict in test_run_local and test_text_pipeline)."""

import json

import numpy as np
import pytest
from PIL import Image

from components.predict.contract import PredictionError, model_family, read_predictions
from components.predict.prediction import predict_to_file, prediction_line
from pipelines import predict as predict_cli
from tests.test_evaluate import save_model

COLOURS = {"blue": (20, 40, 220), "green": (30, 200, 40), "red": (210, 30, 30)}


def test_prediction_line_single_and_multi_label():
    scores, labels = np.array([0.2, 0.5, 0.3]), ["a", "b", "c"]
    assert prediction_line(scores, labels, None) == {
        "labels": ["b"], "scores": {"a": 0.2, "b": 0.5, "c": 0.3}}
    assert prediction_line(scores, labels, 0.3)["labels"] == ["b", "c"]  # >= the threshold
    assert prediction_line(scores, labels, 0.6)["labels"] == []  # multi-label may predict none


@pytest.fixture(scope="module")
def colour_model(tmp_path_factory):
    folder = save_model(tmp_path_factory.mktemp("m") / "model", sorted(COLOURS))
    (folder / "preprocessing.json").write_text(json.dumps(
        {"image_size": 32, "resize_method": "crop", "image_format": "jpeg", "jpeg_quality": 95}))
    return folder


def _images(root):
    for name, colour in COLOURS.items():
        (root / "new" / name).mkdir(parents=True)
        Image.new("RGB", (48, 40), colour).save(root / "new" / name / "a.jpg")
    (root / "new" / "broken.png").write_bytes(b"\x89PNG not really")
    return root / "new"


def test_images_from_gcs_to_gcs_with_unreadable_files_as_error_lines(colour_model, tmp_path,
                                                                       gcs):
    bucket = gcs.create_bucket("incoming")
    for path in sorted(_images(tmp_path).rglob("*")):
        if path.is_file():
            bucket.blob(f"batch/{path.relative_to(tmp_path / 'new')}").upload_from_filename(
                str(path))
    counts = predict_to_file(str(colour_model), "gs://incoming/batch",
                             "gs://incoming/out/predictions.jsonl", batch_size=2)
    assert counts | {"output": None} == {"family": "image", "inputs": 4, "predicted": 3,
                                         "errors": 1, "hidden_left_out": 0,
                                         "hidden_examples": [], "output": None}
    lines = [json.loads(line) for line in
             bucket.blob("out/predictions.jsonl").download_as_text().splitlines()]
    assert [line["input"] for line in lines] == [
        "gs://incoming/batch/blue/a.jpg", "gs://incoming/batch/broken.png",
        "gs://incoming/batch/green/a.jpg", "gs://incoming/batch/red/a.jpg"]
    assert lines[1] == {"input": "gs://incoming/batch/broken.png",
                        "error": "not a recognised image format"}
    for line in lines[::2] + lines[3:]:
        assert line["labels"] == [line["input"].split("/")[-2]]  # the colour's own class


def test_bad_requests_fail_clearly_and_leave_no_output(colour_model, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    with pytest.raises(PredictionError, match="does not exist"):
        model_family(str(tmp_path / "broken"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PredictionError, match="is not a trained model folder: it holds nothing"):
        model_family(str(tmp_path / "empty"))
    with pytest.raises(PredictionError, match="does not exist"):
        predict_to_file(str(colour_model), str(tmp_path / "nowhere"), str(out))
    only_broken = tmp_path / "broken"
    only_broken.mkdir()
    (only_broken / "x.jpg").write_bytes(b"")
    with pytest.raises(PredictionError, match="none of the 1 inputs"):
        predict_to_file(str(colour_model), str(only_broken), str(out))
    assert not out.exists() and list(tmp_path.glob("*.jsonl")) == []  # nothing half-written
    # the CLI says it in one line and exits 2
    assert predict_cli.main(["--model", str(tmp_path), "--data", str(only_broken),
                             "--output", str(out)]) == 2
    assert "is not a trained model folder" in capsys.readouterr().err


def test_cli_writes_one_line_per_image(colour_model, tmp_path, capsys):
    data = _images(tmp_path)
    out = tmp_path / "deep" / "p.jsonl"
    assert predict_cli.main(["--model", str(colour_model), "--data", str(data),
                             "--output", str(out), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted"] == 3
    assert len(read_predictions(str(out))) == 4


@pytest.mark.parametrize("name", ["IMG [1].jpg", "a*b?.jpg", "[x].jpg"])
def test_file_names_with_glob_characters_are_predicted(colour_model, tmp_path, name):
    """fsspec's cat expands "[", "*" and "?": such names must be read as they are."""
    folder = tmp_path / "photos [2024]"
    folder.mkdir()
    Image.new("RGB", (40, 40), COLOURS["red"]).save(folder / name, "JPEG")
    Image.new("RGB", (40, 40), COLOURS["blue"]).save(folder / "plain.jpg")
    for data, expected in [(folder, {name: ["red"], "plain.jpg": ["blue"]}),
                           (folder / name, {name: ["red"]})]:  # a folder, or the one file
        out = tmp_path / "p.jsonl"
        counts = predict_to_file(str(colour_model), str(data), str(out))
        assert (counts["predicted"], counts["errors"]) == (len(expected), 0)
        assert {line["input"].split("/")[-1]: line["labels"]
                for line in read_predictions(str(out))} == expected


def test_cli_refuses_an_output_that_is_the_input(colour_model, tmp_path, capsys, monkeypatch):
    data = tmp_path / "new.jpg"
    Image.new("RGB", (40, 40), COLOURS["red"]).save(data)
    before = data.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jpg").symlink_to(data)
    monkeypatch.chdir(tmp_path)
    for output in [str(data), "new.jpg", "sub/../new.jpg", str(tmp_path / "link.jpg")]:
        assert predict_cli.main(["--model", str(colour_model), "--data", str(data),
                                 "--output", output, "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "--output" in err and "--data" in err and "same file" in err, err
        assert data.read_bytes() == before  # the input untouched
    with pytest.raises(PredictionError, match="is the same file as the input"):
        predict_to_file(str(colour_model), "new.jpg", str(tmp_path / "link.jpg"))
    assert data.read_bytes() == before
    # gs:// URIs compare as strings: the same one is refused before anything is read
    assert predict_cli.main(["--model", str(colour_model), "--data", "gs://b/new.csv",
                             "--output", "gs://b/new.csv"]) == 2
    assert "same file" in capsys.readouterr().err


def test_the_cli_names_the_file_a_model_folder_lacks_not_another_kind(tmp_path, capsys):
    """The issue's case: a transformer folder without labels.json was told it had
    'neither model.keras nor export.pkl or config.json' while config.json was there."""
    model = tmp_path / "transformer"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (model / name).write_text("{}")
    data = tmp_path / "new.csv"
    data.write_text("text\nhello\n")
    assert predict_cli.main(["--model", str(model), "--data", str(data), "--output",
                             str(tmp_path / "out.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"model folder '{model}' looks like a transformer text model folder (config.json, " \
           "model.safetensors found) but has no labels.json" in err
    assert "neither" not in err and not (tmp_path / "out.jsonl").exists()
    (model / "labels.json").write_text("[]")  # there, but not what a labels.json holds
    assert predict_cli.main(["--model", str(model), "--data", str(data), "--output",
                             str(tmp_path / "out.jsonl"), "--no-progress"]) == 2
    assert "labels.json' must hold a JSON object, found a list" in capsys.readouterr().err
