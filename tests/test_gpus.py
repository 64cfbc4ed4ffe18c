"""A GPU step that cannot see the GPUs its machine was given ends at once (here: none), and
the compiled jobs tell each GPU step its count."""

import json

import pytest
import yaml

import compile as compile_cli
from components.common import gpus
from components.common.gpus import EXPECTED_GPUS_VARIABLE, GpuMismatchError


def test_fewer_gpus_than_the_machine_has_is_an_error_naming_the_versions():
    line = gpus.check_gpus(2, ["Tesla T4", "Tesla T4"], "PyTorch", "12.8", "NVRM 570.1")
    assert line == "GPUs: 2 seen by PyTorch (Tesla T4, Tesla T4); CUDA 12.8; driver NVRM 570.1"
    with pytest.raises(GpuMismatchError) as err:
        gpus.check_gpus(2, [], "TensorFlow", "", "")
    assert str(err.value).startswith(
        "this step's machine has 2 GPU(s) but TensorFlow sees 0 (CUDA none (a CPU build); "
        "driver not loaded); stopping now rather than training on the CPU at GPU prices")
    assert gpus.check_gpus(0, [], "PyTorch", "", "")  # nothing expected: a line, no error


def test_the_expected_count_comes_from_the_job_and_the_driver_from_the_kernel(tmp_path):
    assert gpus.expected_gpus({}) == 0
    assert gpus.expected_gpus({EXPECTED_GPUS_VARIABLE: " 4 "}) == 4
    with pytest.raises(GpuMismatchError, match="'two' is not a GPU count"):
        gpus.expected_gpus({EXPECTED_GPUS_VARIABLE: "two"})
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15\nGCC\n")
    assert gpus.driver_version(str(version)).endswith("570.86.15")
    assert gpus.driver_version(str(tmp_path / "none")) == ""


@pytest.mark.parametrize("check, framework", [(gpus.require_torch_gpus, "PyTorch"),
                                              (gpus.require_tensorflow_gpus, "TensorFlow")])
def test_each_framework_is_asked_what_it_sees(check, framework):
    assert check({}) == ""  # a local run: nothing to hold it to
    with pytest.raises(GpuMismatchError, match=f"has 1 GPU\\(s\\) but {framework} sees 0"):
        check({EXPECTED_GPUS_VARIABLE: "1"})


def _trainers():
    from components.train_image.contract import TrainConfig
    from components.train_image.training import train as train_image
    from components.train_lm.contract import LMConfig
    from components.train_lm.training import train_language_model
    from components.train_text.contract import TrainConfig as TextConfig
    from components.train_text.training import train_text_classifier
    from components.train_transformer.contract import TransformerConfig
    from components.train_transformer.launch import train as train_transformer

    return {"image": lambda d, o: train_image(d, o, TrainConfig()),
            "text": lambda d, o: train_text_classifier(d, o, TextConfig()),
            "transformer": lambda d, o: train_transformer(d, o, TransformerConfig()),
            "lm": lambda d, o: train_language_model(d, o, LMConfig())}


@pytest.mark.parametrize("kind", ["image", "text", "transformer", "lm"])
def test_every_trainer_checks_its_gpus_before_it_reads_anything(kind, tmp_path, monkeypatch):
    """The data folder does not exist: an error about it would mean the trainer went on."""
    monkeypatch.setenv(EXPECTED_GPUS_VARIABLE, "1")
    with pytest.raises(GpuMismatchError, match="has 1 GPU\\(s\\) but .* sees 0"):
        _trainers()[kind](str(tmp_path / "no-data"), str(tmp_path / "model"))
    assert not (tmp_path / "model").exists()


def _pools(spec):
    for name, component in spec["components"].items():
        pools = component.get("inputDefinitions", {}).get("parameters", {}).get(
            "worker_pool_specs", {}).get("defaultValue") or []
        for pool in pools:
            yield name, pool


def test_every_compiled_gpu_job_and_trial_is_told_its_gpu_count(tmp_path):
    assert compile_cli.main(["--output-dir", str(tmp_path / "v"),
                             "--train-transformer-accelerator-count", "2"]) == 0
    checked = 0
    for path in (tmp_path / "v").glob("*.json"):
        spec = json.loads(path.read_text())
        for name, pool in _pools(spec):
            env = {e["name"]: e["value"] for e in pool["container_spec"].get("env", [])}
            count = pool["machine_spec"].get("accelerator_count")
            assert env.get(EXPECTED_GPUS_VARIABLE) == (str(int(count)) if count else None), name
            checked += bool(count)
        text = path.read_text()
        if "tuning" in path.name:  # the trials' pool is an input of the tuning launcher
            assert text.count(EXPECTED_GPUS_VARIABLE) >= 2, path.name
    assert checked >= 4
    transformer = json.loads((tmp_path / "v" / "transformer_pipeline.json").read_text())
    assert {EXPECTED_GPUS_VARIABLE: "2"} in [
        {e["name"]: e["value"] for e in pool["container_spec"]["env"]}
        for _, pool in _pools(transformer) if pool["machine_spec"].get("accelerator_count")]
    assert compile_cli.main(["--output-dir", str(tmp_path / "k"), "--target", "kubeflow",
                             "--pipelines", "image_pipeline"]) == 0
    spec = yaml.safe_load_all((tmp_path / "k" / "image_pipeline.yaml").read_text())
    executors = next(spec)["deploymentSpec"]["executors"]
    for name, executor in executors.items():
        container = executor["container"]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        gpus_given = container.get("resources", {}).get("accelerator", {}).get("resourceCount")
        assert env.get(EXPECTED_GPUS_VARIABLE) == gpus_given, name
