"""The image trainer: selection logic, model surgery, input pipeline, and tiny CPU training
runs (default, mirrored over 2 logical CPUs, interrupted, resumed; two workers:
tests/test_image_replicas.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")

from components.formats.image_models import load_keras_model  # noqa: E402
from components.formats.shards import make_dataset  # noqa: E402
from components.shard.contract import read_manifest  # noqa: E402
from components.train_image import contract, distribute, training  # noqa: E402
from components.train_image import model as model_lib  # noqa: E402
from components.train_image.contract import PIXELS_SIGNATURE  # noqa: E402
from components.train_image.model import INPUT_NAME  # noqa: E402
from components.train_image.training import TrainConfig, TrainingError  # noqa: E402
from tests.conftest import (  # noqa: E402
    ONE_BLOCK_DENSENET,
    assert_arrays_equal,
    shard_colour_classes,
)

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["cat", "dog", "fox"]
IMAGE_SIZE = 32
CLUSTER_ENV = ("TF_CONFIG", "CLUSTER_SPEC", "AIP_CHECKPOINT_DIR", "AIP_TENSORBOARD_LOG_DIR")


@pytest.fixture(scope="session")
def image_dataset(tmp_path_factory) -> str:
    """A sharded dataset of 32x32 images: 3 classes x 10 (24 train, 3 validation, 3 test)."""
    return shard_colour_classes(tmp_path_factory.mktemp("train_image_data"), 10, 40)


@pytest.fixture(scope="module")
def scratch_model():
    return model_lib.build_model(len(CLASSES), IMAGE_SIZE, None)


@pytest.fixture
def no_cluster(monkeypatch):
    """This process outside any cluster and Vertex folder."""
    for name in CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)


def _subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_ENV}
    env.update(PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


def _tf_config(workers: int, chief: bool = False, **extra) -> dict:
    cluster = {"worker": [f"w{i}:2222" for i in range(workers)], **extra}
    if chief:
        cluster["chief"] = ["c0:2222"]
    return {"cluster": cluster, "task": {"type": "worker", "index": 0}}


def _cluster_spec(pool0: int = 1, pool1: int = 0, pool3: int = 0) -> dict:
    cluster = {f"workerpool{pool}": [f"p{pool}-{i}:2222" for i in range(size)]
               for pool, size in ((0, pool0), (1, pool1), (3, pool3)) if size or pool == 0}
    return {"cluster": cluster, "task": {"type": "workerpool0", "index": 0}, "job": "{}"}


@pytest.mark.parametrize("tf_config, cluster_spec, gpus, expected", [
    (None, None, [], "default"),
    (None, None, ["gpu:0"], "default"),
    (None, None, ["gpu:0", "gpu:1"], "mirrored"),
    (_tf_config(2), None, [], "multi_worker"),
    (_tf_config(1, chief=True), None, [], "multi_worker"),
    (_tf_config(0, chief=True), None, ["gpu:0", "gpu:1"], "mirrored"),
    (_tf_config(1, evaluator=["e0:2222"]), None, [], "default"),
    (None, _cluster_spec(1), ["gpu:0"], "default"),
    (None, _cluster_spec(1), ["gpu:0", "gpu:1", "gpu:2", "gpu:3"], "mirrored"),
    (None, _cluster_spec(1, 1), [], "multi_worker"),
    (None, _cluster_spec(1, 0, pool3=1), [], "default"),
    (None, _cluster_spec(1, 3), ["gpu:0"] * 8, "multi_worker"),
    # TF_CONFIG, when it names a cluster, is what TensorFlow will use.
    (_tf_config(1), _cluster_spec(1, 1), [], "default"),
    ({"task": {}}, _cluster_spec(1, 1), [], "multi_worker"),
])
def test_choose_strategy_kind(tf_config, cluster_spec, gpus, expected):
    assert distribute.choose_strategy_kind(tf_config, cluster_spec, gpus) == expected


def test_parameter_servers_are_refused():
    with pytest.raises(ValueError, match="parameter server"):
        distribute.choose_strategy_kind(_tf_config(2, ps=["ps0:2222"]), None, [])
    spec = _cluster_spec(1, 1)
    spec["cluster"]["workerpool2"] = ["ps:2222"]
    with pytest.raises(ValueError, match="parameter server"):
        distribute.choose_strategy_kind(None, spec, [])


def test_tf_config_from_cluster_spec():
    spec = {
        "cluster": {"workerpool0": ["a:2222"], "workerpool1": ["b:2222", "c:2222"],
                    "workerpool3": ["e:2222"]},
        "task": {"type": "workerpool1", "index": 1, "trial": "7"},
        "job": "{}",
    }
    assert distribute.tf_config_from_cluster_spec(spec) == {
        "cluster": {"chief": ["a:2222"], "worker": ["b:2222", "c:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    spec["task"] = {"type": "workerpool0", "index": 0}
    assert distribute.tf_config_from_cluster_spec(spec)["task"] == {"type": "chief", "index": 0}
    with pytest.raises(ValueError, match="unknown worker pool"):
        distribute.tf_config_from_cluster_spec({"cluster": {"pool9": ["x:1"]},
                                                "task": {"type": "pool9"}})


def test_prepare_environment_derives_tf_config_only_when_needed(monkeypatch):
    monkeypatch.setattr(distribute, "gpu_compute_capabilities", lambda: [(8, 0), (8, 0)])
    environ = {"CLUSTER_SPEC": json.dumps(_cluster_spec(1, 1))}
    assert distribute.prepare_environment("auto", environ) == ("multi_worker", "mixed_float16")
    assert json.loads(environ["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}

    given = json.dumps(_tf_config(2))
    environ = {"CLUSTER_SPEC": json.dumps(_cluster_spec(1, 1)), "TF_CONFIG": given}
    assert distribute.prepare_environment("off", environ) == ("multi_worker", "float32")
    assert environ["TF_CONFIG"] == given  # never overwritten

    environ = {"CLUSTER_SPEC": json.dumps(_cluster_spec(1))}  # one replica
    assert distribute.prepare_environment("auto", environ)[0] == "mirrored"
    assert "TF_CONFIG" not in environ

    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        distribute.prepare_environment("auto", {"TF_CONFIG": "{oops"})


@pytest.mark.parametrize("mode, capabilities, expected", [
    ("auto", [(7, 0)], "mixed_float16"),
    ("auto", [(8, 0), (9, 0)], "mixed_float16"),
    ("auto", [(6, 1)], "float32"),
    ("auto", [(7, 5), (6, 0)], "float32"),  # one old GPU would slow every step
    ("auto", [], "float32"),  # CPU: float16 is ~95x slower
    ("on", [], "mixed_float16"),
    ("on", [(6, 1)], "mixed_float16"),
    ("off", [(8, 0)], "float32"),
])
def test_choose_precision(mode, capabilities, expected):
    assert distribute.choose_precision(mode, capabilities) == expected
    with pytest.raises(ValueError, match="precision"):
        distribute.choose_precision("fp16", capabilities)


def test_make_strategy_kinds():
    assert distribute.make_strategy("default") is tf.distribute.get_strategy()
    assert distribute.make_strategy("default").extended.should_checkpoint  # the chief alone
    assert distribute.strategy_kind_of(distribute.make_strategy("default")) == "default"
    with pytest.raises(ValueError, match="strategy kind"):
        distribute.make_strategy("tpu")


def test_plan_phases():
    pretrained = TrainConfig(epochs=3, fine_tune_epochs=2, weights="imagenet")
    assert [(p.name, p.epochs, p.learning_rate) for p in training.plan_phases(pretrained)] == [
        ("head", 3, 1e-3), ("fine_tune", 2, 1e-4)]
    head_only = dataclasses.replace(pretrained, fine_tune_epochs=0)
    assert [p.name for p in training.plan_phases(head_only)] == ["head"]
    scratch = TrainConfig(epochs=3, fine_tune_epochs=2, weights="none")
    assert [(p.name, p.epochs, p.learning_rate) for p in training.plan_phases(scratch)] == [
        ("full", 5, 1e-3)]


@pytest.mark.parametrize("changes, message", [
    ({"epochs": 0, "fine_tune_epochs": 0}, "must be at least 1"),
    ({"batch_size": 0}, "batch_size"),
    ({"precision": "fp16"}, "precision"),
    ({"rotation": 0.7}, "rotation"),
    ({"steps_per_epoch": 0}, "steps_per_epoch"),
    ({"architecture": "resnet50"}, "architecture must be one of"),
    ({"unfreeze_blocks": 5}, "1..4 for densenet121"),
    ({"architecture": "efficientnet_lite0", "unfreeze_blocks": 8}, "1..7 for efficientnet_lite0"),
])
def test_train_config_validation(changes, message):
    with pytest.raises(TrainingError, match=message):
        TrainConfig(**changes)
    assert TrainConfig(architecture="efficientnet_lite0", unfreeze_blocks=7).unfreeze_blocks == 7


def test_resolve_dirs_prefers_explicit_then_vertex():
    environ = {"AIP_CHECKPOINT_DIR": "gs://b/ckpt", "AIP_TENSORBOARD_LOG_DIR": "gs://b/tb"}
    model = "/gcs/root/123/job-1/train_7/model"
    assert training.resolve_dirs(model, "", "", environ) == ("/gcs/b/ckpt/job-1/train_7",
                                                             "/gcs/b/tb/job-1/train_7")
    assert training.resolve_dirs(model, "/c", None, environ) == ("/c", "/gcs/b/tb/job-1/train_7")
    assert training.resolve_dirs(model, None, None, {}) == (None, None)


def test_fetch_weights_copies_gs_files(tmp_path, monkeypatch):
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/bucket/w/notop.h5", b"weights")
    monkeypatch.setattr(training, "filesystem", lambda uri: (memory, "/bucket/w/notop.h5"))
    local = training.fetch_weights("gs://bucket/w/notop.h5", str(tmp_path))
    assert Path(local).read_bytes() == b"weights"
    assert training.fetch_weights("none", str(tmp_path)) is None
    assert training.fetch_weights("imagenet", str(tmp_path)) == "imagenet"
    assert training.fetch_weights("/local/w.h5", str(tmp_path)) == "/local/w.h5"


def test_augment_identity_and_flip():
    images = tf.random.uniform([4, 8, 8, 3], 0, 255, seed=1)
    same = model_lib.augment_images(images, tf.constant([1, 2], tf.int64), False, 0.0, 0.0)
    assert same is images
    flipped = model_lib.augment_images(images, tf.constant([1, 2], tf.int64), True, 0.0, 0.0)
    mirrors = tf.reverse(images, axis=[2])
    kinds = []
    for original, mirror, out in zip(images.numpy(), mirrors.numpy(), flipped.numpy()):
        kinds.append("mirror" if np.allclose(out, mirror, atol=1e-3) else
                     "same" if np.allclose(out, original, atol=1e-3) else "other")
    # each image is itself or its mirror, and with this seed both happen
    assert "other" not in kinds and {"same", "mirror"} <= set(kinds), kinds


def test_augment_rotation_zoom_keeps_range_and_varies():
    images = tf.random.uniform([6, 16, 16, 3], 0, 255, seed=2)
    a = model_lib.augment_images(images, tf.constant([3, 4], tf.int64), True, 0.1, 0.2)
    b = model_lib.augment_images(images, tf.constant([5, 6], tf.int64), True, 0.1, 0.2)
    assert a.shape == images.shape and a.dtype == tf.float32
    assert float(tf.reduce_min(a)) >= 0 and float(tf.reduce_max(a)) <= 255.001  # reflect fill
    assert not np.allclose(a, images) and not np.allclose(a, b)


def test_pipelines_augment_training_only(image_dataset):
    manifest = read_manifest(image_dataset)
    config = TrainConfig(weights="none", flip=True, rotation=0.0, zoom=0.0, seed=3)
    originals = [img.numpy().astype("float32")
                 for img, _ in make_dataset(image_dataset, "train", manifest=manifest)]
    seen_flipped = False
    batches = model_lib.train_input(image_dataset, manifest, config, global_batch=8).take(6)
    for images, _ in batches:
        assert images.dtype == tf.float32 and images.shape == (8, IMAGE_SIZE, IMAGE_SIZE, 3)
        for image in images.numpy():
            plain = any(np.allclose(image, o, atol=1e-3) for o in originals)
            mirrored = any(np.allclose(image, o[:, ::-1], atol=1e-3) for o in originals)
            assert plain or mirrored
            seen_flipped |= mirrored and not plain
    assert seen_flipped

    validation = model_lib.validation_input(image_dataset, manifest, config, global_batch=2)
    got = np.concatenate([images.numpy() for images, _ in validation])
    raw = np.stack([img.numpy() for img, _ in make_dataset(image_dataset, "validation",
                                                           manifest=manifest)])
    np.testing.assert_array_equal(got, raw.astype("float32"))  # never augmented


@pytest.mark.parametrize("blocks, prefixes, count", [
    (1, {"conv5"}, 32),  # 16 bottlenecks x 2 convs
    (2, {"conv4", "pool4", "conv5"}, 32 + 1 + 48),
    (3, {"conv3", "pool3", "conv4", "pool4", "conv5"}, 81 + 1 + 24),
    (4, {"conv2", "pool2", "conv3", "pool3", "conv4", "pool4", "conv5"}, 106 + 1 + 12),
])
def test_set_trainable_unfreezes_top_blocks(scratch_model, blocks, prefixes, count):
    names = model_lib.set_trainable(scratch_model, "fine_tune", blocks)
    base = model_lib.get_base(scratch_model)
    assert names == [layer.name for layer in base.layers
                     if layer.trainable and layer.trainable_weights]
    assert len(names) == count
    assert {re.split(r"[_/]", name)[0] for name in names} == prefixes
    for layer in base.layers:
        if isinstance(layer, tf_keras.layers.BatchNormalization):
            assert not layer.trainable, layer.name  # includes the final "bn"
    assert not base.get_layer("conv1/conv").trainable
    assert scratch_model.get_layer("probabilities").trainable


def test_set_trainable_head_and_full(scratch_model):
    model_lib.set_trainable(scratch_model, "head")
    base = model_lib.get_base(scratch_model)
    assert base.trainable_weights == []
    assert [w.name.split("/")[-1] for w in scratch_model.trainable_weights] == [
        "kernel:0", "bias:0"]
    model_lib.set_trainable(scratch_model, "full")
    assert all(layer.trainable for layer in base.layers)
    batchnorms = [layer for layer in base.layers
                  if isinstance(layer, tf_keras.layers.BatchNormalization)]
    # Everything but the BatchNorm moving statistics.
    assert len(base.trainable_weights) == len(base.weights) - 2 * len(batchnorms)
    with pytest.raises(ValueError, match="unfreeze_blocks"):
        model_lib.set_trainable(scratch_model, "fine_tune", 0)


def test_preprocessing_matches_densenet(scratch_model):
    pixels = np.random.default_rng(1).uniform(0, 255, (2, IMAGE_SIZE, IMAGE_SIZE, 3))
    pixels = pixels.astype("float32")
    inside = scratch_model.get_layer("densenet_preprocess")(pixels).numpy()
    reference = tf_keras.applications.densenet.preprocess_input(pixels.copy())
    np.testing.assert_allclose(inside, reference, atol=1e-4)


def test_output_is_float32_under_mixed_precision():
    with model_lib.dtype_policy("mixed_float16"):  # DenseNet121's layers, one block a stage
        model = model_lib.build_model(len(CLASSES), IMAGE_SIZE, None,
                                      layout=ONE_BLOCK_DENSENET)
    assert tf_keras.mixed_precision.global_policy().name == "float32"  # restored
    assert model_lib.get_base(model).compute_dtype == "float16"
    assert model.get_layer("probabilities").compute_dtype == "float32"
    assert model.output.dtype == tf.float32
    assert model.get_layer("densenet_preprocess").compute_dtype == "float32"


def test_the_densenet_is_the_one_its_weights_file_holds(scratch_model, tmp_path):
    assert contract.dense_layout(layer.name for layer in
                                  model_lib.get_base(scratch_model).layers) == (6, 12, 24, 16)
    assert model_lib.architecture(scratch_model) == "DenseNet121"  # weights none or imagenet
    assert contract.architecture_name((6, 12, 32, 32)) == "DenseNet169"
    assert contract.architecture_name((2, 3, 4, 2)) == "DenseNet(2-3-4-2)"
    # Files that hold no DenseNet are refused with their name, before anything loads.
    not_densenet = tmp_path / "mlp.h5"
    tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(2)]).save_weights(
        str(not_densenet))
    not_hdf5 = tmp_path / "notes.h5"
    not_hdf5.write_text("not weights")
    for path in (not_densenet, not_hdf5):
        with pytest.raises(ValueError, match=f"{path.name}.*not the no-top weights"):
            model_lib.build_model(len(CLASSES), IMAGE_SIZE, str(path))
    with pytest.raises(ValueError, match="'imagenet' is DenseNet121's"):
        model_lib.build_model(len(CLASSES), IMAGE_SIZE, "imagenet", layout=(1, 1, 1, 1))


def test_weights_file_loads_and_snapshot_survives_phase_change(densenet_weights):
    pretrained = model_lib.build_model(len(CLASSES), IMAGE_SIZE, densenet_weights)
    # the file's DenseNet, not DenseNet121
    assert model_lib.architecture(pretrained) == "DenseNet(1-1-1-1)"
    reference = model_lib.keras_densenet(list(ONE_BLOCK_DENSENET), include_top=False,
                                         weights=None, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3))
    reference.load_weights(densenet_weights)
    assert_arrays_equal(model_lib.get_base(pretrained).weights, reference.weights)
    with pytest.raises(ValueError, match="neither 'imagenet', 'none' nor an existing file"):
        model_lib.build_model(len(CLASSES), IMAGE_SIZE, "/no/such/weights.h5")
    # a copy built without the file, as the artifact is, takes the layout from the weights
    scratch_model = model_lib.build_model(
        len(CLASSES), IMAGE_SIZE, None,
        layout=contract.dense_layout(model_lib.weight_snapshot(pretrained)))

    # A snapshot taken in one phase loads into a model set up for another phase
    # (get_weights order would not: it follows the trainable flags).
    model_lib.set_trainable(pretrained, "head")
    model_lib.set_trainable(scratch_model, "fine_tune", 2)
    model_lib.load_snapshot(scratch_model, model_lib.weight_snapshot(pretrained))
    images = np.random.default_rng(2).uniform(0, 255, (2, IMAGE_SIZE, IMAGE_SIZE, 3))
    np.testing.assert_allclose(scratch_model(images, training=False),
                               pretrained(images, training=False), atol=1e-5)


def _failing(hook: str, at: int, message: str) -> tf_keras.callbacks.Callback:
    """Raises RuntimeError(`message`) in its `hook` for epoch or step `at`, after
    BackupAndRestore's own hook (the built-in callbacks run first)."""

    def fail(index, logs=None):
        if index == at:
            raise RuntimeError(message)

    return tf_keras.callbacks.LambdaCallback(**{hook: fail})


def _epochs_logged(records) -> list[tuple[str, int]]:
    found = []
    for record in records:
        match = re.match(r"(\w+) epoch (\d+):", record.getMessage())
        if record.name == training.__name__ and match:
            found.append((match.group(1), int(match.group(2))))
    return found


def _check_artifact(out: Path, image_dataset: str) -> None:
    for name in ("model.keras", "labels.json", "preprocessing.json", "history.json",
                 "saved_model/saved_model.pb"):
        assert (out / name).exists(), name
    assert json.loads((out / "labels.json").read_text()) == {"classes": CLASSES}
    preprocessing = json.loads((out / "preprocessing.json").read_text())
    assert preprocessing["image_size"] == IMAGE_SIZE
    assert preprocessing["input"] == "float32 RGB 0..255"
    images = np.stack([img.numpy() for img, _ in make_dataset(image_dataset, "test")])
    images = images.astype("float32")
    loaded = tf.saved_model.load(str(out / "saved_model"))  # owns the signature's variables
    served = loaded.signatures[PIXELS_SIGNATURE](**{INPUT_NAME: tf.constant(images)})
    served = served["probabilities"].numpy()
    assert served.shape == (len(images), len(CLASSES))
    np.testing.assert_allclose(served.sum(axis=1), 1.0, atol=1e-5)
    keras_model = load_keras_model(str(out / "model.keras"))
    np.testing.assert_allclose(keras_model.predict(images, verbose=0), served, atol=1e-5)


# A training subprocess: "mirrored" over 2 logical CPUs, "preemptible" with its checkpoints
# beside its output folder.
_SCRIPT = """
import json, logging, sys
dataset, out, config, result, mode = sys.argv[1:]
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
strategy = None
if mode == "mirrored":
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from components.train_image.distribute import make_strategy
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])
from components.train_image.training import TrainConfig, train
checkpoints = out + "-checkpoints" if mode == "preemptible" else None
metrics = train(dataset, out, TrainConfig(**json.loads(config)), checkpoints, strategy=strategy)
open(result, "w").write(json.dumps(metrics))
"""


def _start(mode: str, root: Path, name: str, dataset: str, config: dict, out: Path) -> tuple:
    log, result = root / f"{name}.log", root / f"{name}.json"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, dataset, str(out), json.dumps(config), str(result),
             mode], env=_subprocess_env(), stdout=sink, stderr=subprocess.STDOUT)
    return process, log, result


@pytest.fixture(scope="module")
def mirrored_job(image_dataset, densenet_weights, tmp_path_factory):
    """The mirrored run, started at once: mostly tracing, it runs beside the resume test
    in about half the time. Two workers: tests/test_image_replicas.py."""
    root = tmp_path_factory.mktemp("background")
    # batch 1 per replica: the 3 validation examples fill one whole global batch of 2.
    config = dict(epochs=1, fine_tune_epochs=0, batch_size=1, weights=densenet_weights,
                  precision="off", steps_per_epoch=2)
    process, log, result = _start("mirrored", root, "mirrored", image_dataset, config,
                                  root / "mirrored-model")
    yield process, log, result, root / "mirrored-model"
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_interrupted_training_resumes_across_phases(image_dataset, densenet_weights, tmp_path,
                                                    caplog, no_cluster, mirrored_job):
    # mirrored_job: started first so it runs while this test trains in-process.
    from kfp import dsl

    from components.train_image.component import train_image_classifier

    params = dict(epochs=2, fine_tune_epochs=2, batch_size=2, weights=densenet_weights,
                  precision="off", steps_per_epoch=1)
    out, checkpoints = tmp_path / "model", tmp_path / "checkpoints"
    caplog.set_level(logging.INFO, logger=training.__name__)
    with pytest.raises(RuntimeError, match="interrupted after epoch 2"):
        training.train(image_dataset, str(out), TrainConfig(**params), str(checkpoints),
                       callbacks=[_failing("on_epoch_end", 2, "interrupted after epoch 2")])
    assert _epochs_logged(caplog.records) == [("head", 0), ("head", 1), ("fine_tune", 2)]
    assert json.loads((checkpoints / "head.done.json").read_text())["next_epoch"] == 2
    assert (checkpoints / "backup-fine_tune").is_dir()
    assert not (out / "model.keras").exists()

    # Another configuration must not pick up this state.
    with pytest.raises(TrainingError, match="different run"):
        training.train(image_dataset, str(out), TrainConfig(**{**params, "batch_size": 3}),
                       str(checkpoints))

    # The restart goes through the KFP component function, as on Vertex.
    caplog.clear()
    model, metrics = dsl.Model(uri=str(out)), dsl.Metrics(uri=str(tmp_path / "metrics"))
    train_image_classifier(dataset=dsl.Dataset(uri=image_dataset), model=model,
                           metrics=metrics, checkpoint_dir=str(checkpoints), **params)
    assert _epochs_logged(caplog.records) == [("fine_tune", 3)]  # resumed after epoch 2
    history = json.loads((out / "history.json").read_text())
    assert list(history) == ["head", "fine_tune"]  # as they ran, whatever the state's order
    assert [r["epoch"] for r in history["head"]] == [0, 1]
    assert [r["epoch"] for r in history["fine_tune"]] == [2, 3]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= history["fine_tune"][-1].keys()
    assert metrics.metadata["epochs_run"] == 4 and metrics.metadata["fine_tune_epochs"] == 2
    # accuracy over the validation split: a whole number of its images right
    validation = read_manifest(image_dataset)["splits"]["validation"]["count"]
    right = metrics.metadata["val_accuracy"] * validation
    assert right == pytest.approx(round(right), abs=1e-4) and validation == 3
    assert model.metadata["classes"] == CLASSES and model.metadata["image_size"] == IMAGE_SIZE
    assert model.metadata["framework"].startswith("tf-keras 2.21")
    assert model.metadata["architecture"] == "DenseNet(1-1-1-1)"  # the weights file's
    assert not checkpoints.exists()  # state removed once the model is exported
    _check_artifact(out, image_dataset)


@pytest.mark.slow
def test_a_sigterm_mid_epoch_seals_that_step_and_the_restart_resumes_there(
        image_dataset, densenet_weights, tmp_path):
    """A real SIGTERM, sent once epoch 0 is logged, lands early in epoch 1 of 200 steps: the
    trainer backs that step up, exits 143, and the restart goes on from the next step."""
    config = dict(epochs=3, fine_tune_epochs=0, batch_size=2, weights=densenet_weights,
                  precision="off", steps_per_epoch=200, early_stopping_patience=0)
    out, attempts = tmp_path / "model", []
    for attempt in (1, 2):
        process, log, result = _start("preemptible", tmp_path, f"attempt{attempt}",
                                      image_dataset, config, out)
        while attempt == 1 and process.poll() is None and "head epoch 0:" not in log.read_text():
            time.sleep(0.05)
        if attempt == 1:
            os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=600)
        attempts.append((process.returncode, log.read_text()))
    (code, first), (second_code, second) = attempts
    sealed = re.search(r"sealed in \S+backup-head at epoch 1 step (\d+)", first)
    assert code == 143 and sealed, first[-3000:]
    step = int(sealed.group(1))
    assert step < 199 and "head epoch 1:" not in first  # mid-epoch
    assert second_code == 0, second[-3000:]
    assert f"resumed mid-epoch: epoch 1 from step {step + 1}" in second
    assert "head epoch 0:" not in second and "head epoch 2:" in second
    # an uninterrupted run's count: 3 epochs of 200 steps, none repeated or skipped
    assert json.loads((tmp_path / "attempt2.json").read_text())["optimizer_steps"] == 600


@pytest.mark.slow
def test_checkpoint_every_steps_backs_up_mid_epoch_for_a_kill_without_notice(
        image_dataset, densenet_weights, tmp_path, caplog):
    config = TrainConfig(epochs=1, fine_tune_epochs=0, batch_size=2, weights=densenet_weights,
                         precision="off", steps_per_epoch=5, checkpoint_every_steps=2)
    out, checkpoints = str(tmp_path / "model"), str(tmp_path / "checkpoints")
    caplog.set_level(logging.INFO, logger=training.__name__)
    with pytest.raises(RuntimeError, match="killed at step 2"):
        training.train(image_dataset, out, config, checkpoints,
                       callbacks=[_failing("on_train_batch_end", 2, "killed at step 2")])
    metrics = training.train(image_dataset, out, config, checkpoints)
    assert "resumed mid-epoch: epoch 0 from step 2" in caplog.text  # backed up after step 1
    assert metrics["optimizer_steps"] == 5
    with pytest.raises(TrainingError, match="checkpoint_every_steps must be >= 0"):
        dataclasses.replace(config, checkpoint_every_steps=-1)


@pytest.mark.slow
def test_mirrored_over_two_logical_cpus(mirrored_job):
    process, log, result, out = mirrored_job
    assert process.wait(timeout=600) == 0, log.read_text()[-3000:]
    metrics = json.loads(result.read_text())
    assert (metrics["strategy"], metrics["replicas"], metrics["global_batch_size"]) == (
        "mirrored", 2, 2)
    assert metrics["learning_rate"] == pytest.approx(2e-3)  # scaled with the replicas
    assert np.isfinite(metrics["train_loss"]) and np.isfinite(metrics["val_loss"])
    assert (out / "saved_model" / "saved_model.pb").exists()


@pytest.mark.slow
def test_a_vertex_tuning_trial_trains_with_the_values_vertex_appends(
        image_dataset, densenet_weights, tmp_path):
    """The trial container's command, as the compiled tuning job runs it: the training
    step's executor input plus `--name=value` arguments; outputs land in the trial's folder
    (the parent of AIP_MODEL_DIR) and the study metric is reported after every epoch of
    both phases."""
    from tests.test_hypertune import read_reports

    executor_input = {
        "inputs": {
            "parameterValues": {"epochs": 1, "fine_tune_epochs": 1, "batch_size": 4,
                                "learning_rate": 0.001, "weights": densenet_weights,
                                "precision": "off", "steps_per_epoch": 1, "seed": 3},
            "artifacts": {"dataset": {"artifacts": [{
                "name": "dataset", "type": {"schemaTitle": "system.Dataset"},
                "uri": image_dataset, "metadata": {}}]}}},
        "outputs": {"parameters": {}, "artifacts": {}, "outputFile": "/nonexistent/out.json"},
    }
    trial_dir = tmp_path / "trials" / "3"
    env = _subprocess_env(AIP_MODEL_DIR=f"{trial_dir}/model/",
                          AIP_CHECKPOINT_DIR=f"{trial_dir}/checkpoints/",
                          CLOUD_ML_HP_METRIC_FILE=str(tmp_path / "output.metrics"))
    done = subprocess.run(
        [sys.executable, "-m", "components.tune.trial", "--kind", "image", "--metric",
         "val_accuracy", "--executor_input", json.dumps(executor_input),
         "--learning_rate=0.005", "--batch_size=2.0", "--unfreeze_blocks=2.0"],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    output = json.loads((trial_dir / "executor_output.json").read_text())
    metadata = output["artifacts"]["model"]["artifacts"][0]["metadata"]
    parameters = metadata["parameters"]
    assert (parameters["learning_rate"], parameters["batch_size"],
            parameters["unfreeze_blocks"], parameters["epochs"]) == (0.005, 2, 2, 1)
    assert (trial_dir / "model" / "model.keras").exists()
    history = json.loads((trial_dir / "model" / "history.json").read_text())
    rows = history["head"] + history["fine_tune"]
    assert [(r["global_step"], float(r["val_accuracy"]))
            for r in read_reports(tmp_path / "output.metrics")] == \
        [(str(i), pytest.approx(row["val_accuracy"])) for i, row in enumerate(rows, 1)]


def test_a_clean_up_cut_short_leaves_the_folder_marked_as_this_runs(tmp_path, monkeypatch):
    """The run file goes last: finished phases never outlive their owner, or a run with
    other settings would find the folder free and take them up as its own."""
    from components.train_image.training import RUN_FILE, RunState

    root = str(tmp_path / "checkpoints")
    state = RunState(root, chief=True)
    state.claim({"config": {"epochs": 2}}, {"settings": "a"})
    for name in ("head.done.json", "head.weights.npz", "history-head.json"):
        (tmp_path / "checkpoints" / name).write_text("{}")
    remove = os.remove
    removed = []

    def killed_after_one(path):  # the job is preempted during the clean-up
        if removed:
            raise KeyboardInterrupt
        removed.append(path)
        remove(path)

    monkeypatch.setattr(os, "remove", killed_after_one)
    with pytest.raises(KeyboardInterrupt):
        state.clear(["head"])
    assert (tmp_path / "checkpoints" / RUN_FILE).exists()
    with pytest.raises(TrainingError, match="different run"):
        RunState(root, chief=True).claim({"config": {"epochs": 3}}, {"settings": "b"})
    monkeypatch.setattr(os, "remove", remove)
    state.clear(["head"])
    assert not (tmp_path / "checkpoints").exists()


@pytest.fixture(scope="module")
def lite0_imagenet() -> str:
    """The converted ImageNet file `make models` wrote (no download here)."""
    from components.train_image.efficientnet_lite import imagenet_weights

    try:
        return imagenet_weights()
    except FileNotFoundError as err:
        pytest.fail(f"{err}")


def test_a_weights_file_of_the_other_network_is_refused_naming_both(lite0_imagenet,
                                                                       densenet_weights):
    with pytest.raises(ValueError, match=r"holds EfficientNet-Lite0, and "
                                         r"architecture='densenet121' expects"):
        model_lib.build_model(3, IMAGE_SIZE, lite0_imagenet)
    with pytest.raises(ValueError, match=r"holds DenseNet\(1-1-1-1\), and "
                                         r"architecture='efficientnet_lite0'"):
        model_lib.build_model(3, IMAGE_SIZE, densenet_weights, architecture="efficientnet_lite0")
    # the preflight refuses the same before sharding
    assert "holds DenseNet(1-1-1-1)" in contract.weights_problem(densenet_weights,
                                                                 "efficientnet_lite0")
    assert contract.weights_problem(lite0_imagenet, "efficientnet_lite0") == ""


def test_lite0_fine_tuning_unfreezes_the_top_stages(lite0_imagenet):
    model = model_lib.build_model(3, IMAGE_SIZE, "imagenet", architecture="efficientnet_lite0")
    assert model_lib.architecture(model) == "EfficientNet-Lite0"
    assert model_lib.set_trainable(model, "head") == []
    top = model_lib.set_trainable(model, "fine_tune", 1)
    assert top == ["block7a_expand_conv", "block7a_dwconv", "block7a_project_conv", "top_conv"]
    every = model_lib.set_trainable(model, "fine_tune", 7)
    assert "block1a_dwconv" in every and "stem_conv" not in every
    assert not any("_bn" in name for name in every)  # BatchNorm stays frozen
    # the ImageNet weights are the converted file's
    import h5py

    with h5py.File(lite0_imagenet) as f:
        kernel = np.asarray(f["top_conv"]["top_conv"]["kernel:0"])
    np.testing.assert_array_equal(model_lib.get_base(model).get_layer("top_conv").kernel, kernel)


def test_lite0_trains_from_imagenet_in_two_phases_and_serves(image_dataset, lite0_imagenet,
                                                             tmp_path):
    config = TrainConfig(architecture="efficientnet_lite0", weights="imagenet", epochs=1,
                         fine_tune_epochs=1, batch_size=8, unfreeze_blocks=2,
                         early_stopping_patience=0, reduce_lr_patience=0)
    out = tmp_path / "model"
    metrics = training.train(image_dataset, str(out), config)
    assert metrics["architecture"] == "EfficientNet-Lite0"
    assert (metrics["head_epochs"], metrics["fine_tune_epochs"]) == (1, 1)
    _check_artifact(out, image_dataset)
    preprocessing = json.loads((out / "preprocessing.json").read_text())
    assert "(x - 127) / 128" in preprocessing["scaling"]
