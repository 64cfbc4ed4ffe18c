"""A learned start for the image trainer (its worth: `bench/image_pretrain_bench.py`): letters
of real fonts as class folders, a trained model's DenseNet121 as the no-top file `weights=`
takes, and BatchNorm in inference mode whenever a pretrained base trains, not from scratch.
"""

import json
import os
import shutil

import matplotlib
import numpy as np
import pytest
import tf_keras
from PIL import Image

from components.formats.image_models import load_keras_model
from components.train_image import model as model_lib
from components.train_image.contract import DENSENET121, TrainConfig
from components.train_image.model import compile_model, plan_phases
from pipelines import base_weights
from tests.conftest import ONE_BLOCK_DENSENET, assert_arrays_equal, write_densenet_weights
from tools.datamakers import font_glyphs, glyph_start

SIZE = 32
# Fonts every venv has: matplotlib ships DejaVu, STIX and Computer Modern faces, and
# LastResort, cmex10 and cmsy10, which map Latin letters to boxes and math symbols.
MPL_FONTS = os.path.join(matplotlib.get_data_path(), "fonts", "ttf")


def test_glyphs_are_letters_of_distinct_real_faces(tmp_path):
    paths = font_glyphs.find_fonts([MPL_FONTS])
    # The same file under another name is one face, not two.
    twin = tmp_path / "fonts" / "copy-of-dejavu.ttf"
    twin.parent.mkdir()
    shutil.copy(os.path.join(MPL_FONTS, "DejaVuSans.ttf"), twin)
    counts = font_glyphs.write_glyphs(str(tmp_path / "out"), [*paths, str(twin)], "AbQ", SIZE)

    faces = dict(font_glyphs.select_fonts([*paths, str(twin)], "AbQ"))
    names = {os.path.basename(p) for p in faces}
    assert "copy-of-dejavu.ttf" not in names and "DejaVuSans.ttf" in names
    # Symbol fonts whose cmap sends Latin letters to other glyphs are left out.
    assert not names & {"LastResortHE-Regular.ttf", "cmex10.ttf", "cmsy10.ttf"}
    assert {"cmr10.ttf", "STIXGeneral.ttf", "DejaVuSerif-Italic.ttf"} <= names
    assert counts == {"fonts": len(faces), "images": len(faces) * 3 * 2, "classes": 3}
    assert sorted(os.listdir(tmp_path / "out")) == ["lower_b", "upper_A", "upper_Q"]

    upper = np.asarray(Image.open(tmp_path / "out" / "upper_A" / "dejavu-sans-book-0.png"))
    lower = np.asarray(Image.open(tmp_path / "out" / "lower_b" / "dejavu-sans-book-0.png"))
    assert upper.shape == (SIZE, SIZE) and upper.dtype == np.uint8
    assert upper.max() == 255 and upper[0].max() == 0 and upper[:, 0].max() == 0  # ink on black
    assert upper[SIZE // 2 - 4:SIZE // 2 + 4].max() > 128  # centred
    # One baseline, one cap height per face: `b` stands on the line `A` stands on.
    assert np.nonzero(upper.max(axis=1) > 64)[0][-1] == np.nonzero(lower.max(axis=1) > 64)[0][-1]


def test_a_scanned_glyph_is_made_as_the_uci_digits_were():
    font = os.path.join(MPL_FONTS, "DejaVuSans.ttf")
    glyph = font_glyphs.render(font, "l", SIZE)
    scanned = font_glyphs.scan(glyph, 8)
    assert scanned.size == glyph.size and scanned.mode == "L"
    # A thin letter fills the scan's height, as a digit fills the UCI box: ink on the
    # top and bottom rows of pixels, none at the left and right edges.
    rows = np.asarray(scanned).max(axis=1)
    cols = np.asarray(scanned).max(axis=0)
    assert rows[1] > 0 and rows[-2] > 0 and cols[0] == 0 and cols[-1] == 0
    # Its grey levels are 4x4 block counts (0..16): an 8x8 scan drawn back at 8 px holds
    # only those 17 levels.
    at_eight = np.asarray(font_glyphs.scan(glyph.resize((8, 8)), 8))
    assert set(np.unique(at_eight)) <= {int(k * 255 / 16) for k in range(17)}
    assert font_glyphs.scan(Image.new("L", (SIZE, SIZE), 0), 8).getbbox() is None  # no ink
    with pytest.raises(ValueError, match="at least 1 pixel"):
        font_glyphs.scan(glyph, 0)
    for command in (font_glyphs.main, glyph_start.main):  # refused before any work
        with pytest.raises(SystemExit):
            command(["/tmp/never-written.h5", "--scan-side", "-8"])


def test_glyphs_command_line(tmp_path, capsys):
    assert font_glyphs.main([str(tmp_path), "--fonts", MPL_FONTS, "--chars", "xy",
                             "--variants", "1"]) == 0
    assert "of 2 characters from" in capsys.readouterr().out
    assert all(len(os.listdir(tmp_path / name)) > 5 for name in ("lower_x", "lower_y"))
    empty = tmp_path / "no-fonts"
    empty.mkdir()
    assert font_glyphs.main([str(tmp_path / "o"), "--fonts", str(empty)]) == 2
    assert font_glyphs.class_name("7") == "digit_7" and font_glyphs.class_name("é") == "u00e9"
    assert font_glyphs.main(["--debian-packages"]) == 0
    packages = capsys.readouterr().out.split()
    assert "fonts-urw-base35" in packages and len(packages) == len(set(packages)) > 40


def test_base_weights_finds_the_model_of_a_run(tmp_path):
    folder = tmp_path / "kfp" / "train" / "model"
    folder.mkdir(parents=True)
    (folder / "model.keras").write_bytes(b"")
    (tmp_path / "summary.json").write_text(json.dumps({"artifacts": {"model": str(folder)}}))
    assert base_weights.model_file(str(tmp_path)) == str(folder / "model.keras")
    assert base_weights.model_file(str(folder)) == str(folder / "model.keras")
    with pytest.raises(FileNotFoundError, match="summary.json"):
        base_weights.model_file(str(tmp_path / "kfp"))
    assert base_weights.main([str(tmp_path / "kfp"), str(tmp_path / "w.h5")]) == 2


@pytest.mark.slow  # trains a DenseNet121 for two steps, saves and loads it (~1 min)
def test_a_glyph_start_is_a_weights_file_the_trainer_starts_from(tmp_path, capsys):
    out = tmp_path / "start.h5"
    assert glyph_start.main([str(out), "--work", str(tmp_path / "work"), "--fonts", MPL_FONTS,
                             "--epochs", "1", "--steps-per-epoch", "2"]) == 0
    assert "typefaces" in capsys.readouterr().out
    facts = json.loads((tmp_path / "start.json").read_text())
    assert facts["classes"] == 52 and facts["epochs_run"] == 1 and facts["fonts"] > 10
    trained = load_keras_model(str(tmp_path / "work" / "model" / "model.keras"), compile=False)
    assert not (tmp_path / "work" / "model" / "saved_model").exists()  # kept for its weights
    # Another number of classes, another size: the head is not in the file.
    started = model_lib.build_model(3, 48, str(out))
    assert_arrays_equal(model_lib.get_base(started).weights, model_lib.get_base(trained).weights)


def _batchnorm_state(model) -> list[np.ndarray]:
    return [w.numpy().copy() for layer in model_lib.get_base(model).layers
            if isinstance(layer, tf_keras.layers.BatchNormalization) for w in layer.weights]


def _one_step(model, phase: str) -> dict[str, np.ndarray]:
    """Weights by name before one optimizer step of `phase` on random pixels."""
    model_lib.set_trainable(model, phase, unfreeze_blocks=1)
    compile_model(model, 1e-2)
    before = {w.name: w.numpy().copy() for w in model.weights}
    rng = np.random.default_rng(1)
    model.fit(rng.uniform(0, 255, (8, SIZE, SIZE, 3)).astype("float32"),
              rng.integers(0, 3, 8), batch_size=8, epochs=1, verbose=0)
    return before


def _changed(model, before, name_part: str) -> list[bool]:
    return [not np.array_equal(before[w.name], w.numpy()) for w in model.weights
            if name_part in w.name]


# densenet_weights (conftest): a one-block-per-stage DenseNet; what BatchNorm does in each
# phase is the same in every layout.
def test_batchnorm_modes_pretrained_and_from_scratch(densenet_weights):
    """Forward passes only: what `training=True` (as `fit` calls it) does to BatchNorm."""
    pixels = np.random.default_rng(2).uniform(0, 255, (4, SIZE, SIZE, 3)).astype("float32")
    pretrained = model_lib.build_model(3, SIZE, densenet_weights, dropout=0.0)
    statistics = _batchnorm_state(pretrained)
    # training=True reaches no BatchNorm of a pretrained base: the output of inference,
    # and the moving statistics stay as the file had them.
    np.testing.assert_allclose(pretrained(pixels, training=True),
                               pretrained(pixels, training=False), atol=1e-6)
    assert_arrays_equal(_batchnorm_state(pretrained), statistics)

    scratch = model_lib.build_model(3, SIZE, None, dropout=0.0, layout=ONE_BLOCK_DENSENET)
    statistics = _batchnorm_state(scratch)
    assert not np.allclose(scratch(pixels, training=True), scratch(pixels, training=False))
    moving = [not np.array_equal(got, want) for got, want in
              zip(_batchnorm_state(scratch), statistics, strict=True)]
    assert sum(moving) == 2 * len(moving) // 4  # every moving mean and variance, no gamma/beta
    assert moving[2::4] == moving[3::4] == [True] * (len(moving) // 4)


@pytest.mark.slow
def test_batchnorm_stays_frozen_through_both_phases_of_a_pretrained_base(densenet_weights):
    model = model_lib.build_model(3, SIZE, densenet_weights, dropout=0.0)
    statistics = _batchnorm_state(model)

    before = _one_step(model, "head")
    assert all(_changed(model, before, "probabilities"))
    assert not any(_changed(model, before, "conv"))  # the base is frozen whole
    assert_arrays_equal(_batchnorm_state(model), statistics)  # gamma, beta, moving statistics

    before = _one_step(model, "fine_tune")
    assert all(_changed(model, before, "conv5_block1_2_conv"))
    assert not any(_changed(model, before, "conv4_block1_2_conv"))
    assert_arrays_equal(_batchnorm_state(model), statistics)  # still the file's


@pytest.mark.slow  # builds DenseNet121 three times (~40 s alone, minutes on a busy machine)
def test_the_default_start_is_imagenets_as_keras_fetches_it(tmp_path, monkeypatch):
    """The trainer's default asks Keras for ImageNet's no-top DenseNet121 file and starts
    pretrained from it (frozen BatchNorm, head then fine-tuning). The download is the one
    part that cannot happen here (Keras checks the file's MD5, so no stand-in can sit in
    its cache): it is served a random-init file of the same shape."""
    from tf_keras.src.applications import densenet

    random_base = write_densenet_weights(tmp_path / "densenet121_notop.h5", SIZE,
                                         layout=DENSENET121)

    asked = []

    def download(fname, origin, cache_subdir, file_hash):
        asked.append((fname, origin, cache_subdir))
        return random_base

    monkeypatch.setattr(densenet.data_utils, "get_file", download)
    config = TrainConfig()
    assert config.weights == "imagenet"
    model = model_lib.build_model(3, SIZE, config.weights, dropout=0.0)
    assert asked == [("densenet121_weights_tf_dim_ordering_tf_kernels_notop.h5",
                      densenet.DENSENET121_WEIGHT_PATH_NO_TOP, "models")]
    from_file = model_lib.build_model(3, SIZE, random_base, dropout=0.0)
    assert_arrays_equal(model_lib.get_base(model).weights, model_lib.get_base(from_file).weights)
    pixels = np.random.default_rng(3).uniform(0, 255, (2, SIZE, SIZE, 3)).astype("float32")
    np.testing.assert_allclose(model(pixels, training=True), model(pixels, training=False),
                               atol=1e-6)
    assert [phase.name for phase in plan_phases(config)] == ["head", "fine_tune"]
