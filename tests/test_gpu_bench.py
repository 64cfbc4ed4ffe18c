"""bench/gpu_bench.py: its smoke mode runs every section on a CPU, and its arithmetic.

The figures the bench prints on a GPU are in docs/measurements.md; here the tiny CPU run checks that
every section measures something and that the report says what the selection logic chose. The
smoke runs a one-block-per-stage DenseNet (the same builder and phases as DenseNet121's, a
fifth of the tracing); DenseNet121's FLOP count is checked on its own.
"""

import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("fastai")

from bench import flops, gpu_bench  # noqa: E402
from tests.bench_runs import ROOT, run_bench  # noqa: E402


@pytest.mark.slow
def test_smoke_measures_every_section_on_a_cpu(tmp_path):
    results, printed = run_bench(tmp_path, "gpu_bench.py", "--smoke", timeout=900)

    assert results["choices"] == {"gpus": [], "strategy": "default",
                                  "keras_precision": "float32", "fastai_precision": "fp32"}
    densenet = results["densenet"]
    assert (densenet["engine"], densenet["device"], densenet["image_size"]) == (
        "tf-keras", "CPU", 32)
    assert densenet["architecture"] == "DenseNet(1-1-1-1)"  # the smoke's layout
    counted = densenet["forward_gflop"] * 1e9
    assert 1e7 < counted < 1e8  # a small DenseNet at 32 px (DenseNet121 there: ~1.2e8)
    for precision in ("mixed_float16", "float32"):
        rate = densenet[precision]["images_per_second"]
        # the report's arithmetic: FLOP/s from the rate and the model's count, no peak for a CPU
        assert densenet[precision]["tflops"] == pytest.approx(flops.train_tflops(rate, counted))
        assert densenet[precision]["share_of_peak"] is None
    assert densenet["amp_speedup"] == pytest.approx(
        densenet["mixed_float16"]["images_per_second"] / densenet["float32"]["images_per_second"])
    feed = results["feed"]
    assert feed["precision"] == "float32"  # the policy the selection logic chose here
    assert feed["host_cores"] >= 1 and feed["shard_images"] == 40
    assert feed["step_from_memory_s"] > 0 and feed["step_from_shards_s"] > 0
    assert feed["feed_ratio"] == pytest.approx(
        feed["step_from_shards_s"] / feed["step_from_memory_s"])
    assert feed["pipeline_images_per_second"] > 0
    fastai = results["fastai"]
    assert fastai["fp32"]["speedup"] == 1.0
    for precision in gpu_bench.TEXT_PRECISIONS:  # a speed-up is a ratio of the two rates
        assert fastai[precision]["speedup"] == pytest.approx(
            fastai[precision]["tokens_per_second"] / fastai["fp32"]["tokens_per_second"])
    assert fastai["arch"] == {"emb_sz": 16, "n_hid": 32, "n_layers": 1}  # the smoke's size
    assert "skipped" not in results

    for line in ("strategy         default", "keras precision  float32",
                 "fastai precision fp32", "feed ratio", "AWD-LSTM classifier batch 4 x 24"):
        assert line in printed


@pytest.mark.slow
def test_keras3_engine_and_host_cores(tmp_path):
    # The engine the H100 figures were taken with (there on JAX); here on TensorFlow.
    # One precision: both (and their speed-up) are checked on tf-keras above.
    results, printed = run_bench(tmp_path, "gpu_bench.py", "--smoke", "--engine", "keras3",
                                 "--sections", "densenet", "--precisions", "float32",
                                 "--host-cores", "1", timeout=900,
                                 env={"KERAS_BACKEND": "tensorflow"})
    assert set(results) == {"densenet"}
    densenet = results["densenet"]
    assert densenet["engine"] == "keras3"
    assert densenet["image_size"] == 32 and densenet["batch"] == 4
    assert "mixed_float16" not in densenet and densenet["amp_speedup"] is None
    # Keras 3's builder at the same layout: the same convolutions, the same count
    assert densenet["architecture"] == "DenseNet(1-1-1-1)"
    from components.train_image.model import build_model

    assert densenet["forward_gflop"] == pytest.approx(flops.forward_flops(
        build_model(10, 32, weights=None, layout=gpu_bench.SMOKE_LAYOUT)) / 1e9)
    assert densenet["float32"]["tflops"] == pytest.approx(flops.train_tflops(
        densenet["float32"]["images_per_second"], densenet["forward_gflop"] * 1e9))
    assert "DenseNet(1-1-1-1) 32px batch 4 (keras3, CPU; " in printed
    assert "AMP speed-up" not in printed


@pytest.mark.parametrize("flag, value, message", [
    *(("--layout", layout, "--layout takes four positive block counts (conv2..conv5)")
      for layout in ("1,1,1", "6,12,24,0", "a,b,c,d")),
    ("--sections", "densenet,gpu", "unknown sections ['gpu']"),
    *(("--precisions", precisions, "--precisions takes some of ['mixed_float16', 'float32']")
      for precisions in ("", "float16", "float32,bfloat16")),
    ("--host-cores", "100000", "--host-cores must be between 0 (all) and"),
])
def test_a_bad_option_is_refused(flag, value, message):
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_bench.py"), flag, value],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert message in run.stderr


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "mixed_float16", 989.4),
    ("NVIDIA H100 80GB HBM3", "float32", 494.7),
    ("NVIDIA H100 PCIe", "mixed_float16", 756.0),
    ("Tesla V100-SXM2-16GB", "float32", 15.7),
    ("NVIDIA A100-SXM4-40GB", "mixed_float16", 312.0),
    ("Tesla T4", "mixed_float16", 65.0),
    ("NVIDIA L4", "float32", 60.0),
    ("Some Future GPU", "float32", None),
])
def test_peak_by_device_name(name, precision, peak):
    assert flops.peak_tflops(name, precision) == peak


def test_flops_are_counted_from_the_convolutions_and_dense_layers_nested_too():
    import tf_keras

    inner = tf_keras.Sequential([tf_keras.Input((10, 10, 3)),
                                 tf_keras.layers.Conv2D(8, 3),  # valid: 8x8x8 out
                                 tf_keras.layers.BatchNormalization()], name="base")
    inputs = tf_keras.Input((10, 10, 3))
    x = tf_keras.layers.GlobalAveragePooling2D()(inner(inputs))
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(2)(x))
    assert flops.forward_flops(model) == 2 * (8 * 8 * 8 * 3 * 3 * 3) + 2 * (8 * 2)


def test_training_flops_are_three_forward_passes():
    # 2031 img/s (the H100 mixed-precision figure) at DenseNet121's 5.67 GFLOP at 224 px
    assert flops.train_tflops(2031.4, 5.666e9) == pytest.approx(34.53, abs=0.01)
    assert flops.train_tflops(1000, 1e9) == pytest.approx(3.0)


@pytest.mark.slow  # builds the network at 224 px (~10 s), no training
@pytest.mark.parametrize("architecture, published, rel", [
    # 2.87 GMAC published (convolutions, dense and the rest): within 2% of it
    ("densenet121", 5.73e9, 0.02),
    # 0.38 GMAC of convolutions (depthwise ones included) and the classifier, a little
    # under the ~0.4 GMAC quoted for Lite0 with everything; a seventh of DenseNet121's
    # 5.73 GFLOP. Without the depthwise layers it would be 0.70.
    ("efficientnet_lite0", 0.768e9, 0.01),
])
def test_the_networks_count_the_published_flops(architecture, published, rel):
    from components.train_image.model import build_model

    counted = flops.forward_flops(build_model(10, 224, weights=None, architecture=architecture))
    assert counted == pytest.approx(published, rel=rel)
