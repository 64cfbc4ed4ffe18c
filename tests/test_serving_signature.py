"""The bytes-in signature's TensorFlow ops (`components.train_image.artifact`) give nearly the
pixels of the sharding step's PIL code (`preprocess_image`), farther ones when the crop or the
letterbox is wrong. The trained model served from bytes is checked in test_run_local.
"""

import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

from components.predict.prediction import preprocess_image
from components.train_image import artifact
from tests.test_sharding import _encoded

SIZE = 32
# Mean absolute difference in levels, per file; the JPEG round trip of slightly different
# pixels adds about one (measured: <= 0.3 raw, 1.2 where PIL decodes a JPEG at 1/8 scale).
TOLERANCE = {None: 1.5, 95: 2.5}


def _photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth colour gradients with noise: like a photo, unlike a flat test card."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([128 + 100 * np.sin(x / 17 + y / 29), 128 + 100 * np.cos(x / 11),
                       128 + 80 * np.sin(y / 7)], -1)
    return np.clip(pixels + rng.normal(0, 10, pixels.shape), 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, orientation: int | None = None, mode: str = "RGB") -> bytes:
    options = {"quality": 90}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    return _encoded(Image.fromarray(pixels).convert(mode), "JPEG", **options)


def _transparent_png(pixels: np.ndarray) -> bytes:
    rgba = np.array(Image.fromarray(pixels).convert("RGBA"))
    rgba[..., 3] = np.linspace(0, 255, rgba.shape[1]).astype(np.uint8)[None]
    return _encoded(Image.fromarray(rgba), "PNG")


FILES = {
    "jpeg PIL decodes at 1/8": _jpeg(_photo(600, 800)),
    "jpeg PIL decodes at 1/2": _jpeg(_photo(300, 400)),
    "jpeg smaller than 2x": _jpeg(_photo(40, 90)),
    "grayscale jpeg": _jpeg(_photo(120, 161), mode="L"),
    "jpeg exif orientation 1": _jpeg(_photo(150, 100), 1),
    "png with alpha": _transparent_png(_photo(150, 100)),
    "grayscale png": _encoded(Image.fromarray(_photo(64, 64)).convert("L"), "PNG"),
    "gif": _encoded(Image.fromarray(_photo(50, 70)).convert("P"), "GIF"),
    "bmp": _encoded(Image.fromarray(_photo(45, 61)), "BMP"),
}


def _difference(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(int) - b.astype(int)).mean())


def _wrong_resizes(data: bytes, method: str) -> dict[str, np.ndarray]:
    """What a graph that crops or letterboxes wrongly would give (PIL, raw pixels)."""
    image = Image.open(io.BytesIO(data))
    image = image.convert("RGBA").convert("RGB")
    filter_ = Image.Resampling.BILINEAR
    wrong = {"squashed": image.resize((SIZE, SIZE), filter_)}
    if method == "crop":
        wrong["top-left box"] = ImageOps.fit(image, (SIZE, SIZE), filter_, centering=(0, 0))
    else:
        wrong["bars at one side"] = ImageOps.pad(image, (SIZE, SIZE), filter_, centering=(0, 0))
    return {name: np.asarray(pixels) for name, pixels in wrong.items()}


@pytest.mark.parametrize("method", ["crop", "pad"])
@pytest.mark.parametrize("jpeg_quality", [95, None], ids=["jpeg shards", "raw shards"])
def test_graph_pixels_are_close_to_the_sharding_steps(method, jpeg_quality):
    preprocessing = {"image_size": SIZE, "resize_method": method,
                     "image_format": "jpeg" if jpeg_quality else "raw",
                     "jpeg_quality": jpeg_quality}
    tolerance = TOLERANCE[jpeg_quality]
    for name, data in FILES.items():
        expected = preprocess_image(data, preprocessing)
        served = artifact.preprocess(tf.constant(data), SIZE, method, jpeg_quality).numpy()
        assert served.shape == expected.shape == (SIZE, SIZE, 3), name
        assert _difference(served, expected) <= tolerance, name
        if name == "grayscale png":
            continue  # square: crop and letterbox leave it whole
        for wrong_name, wrong in _wrong_resizes(data, method).items():
            # the tolerance tells a wrong crop or letterbox apart
            assert _difference(wrong, expected) > 3 * tolerance, (name, wrong_name)


def test_exif_orientation_is_not_applied_in_the_graph():
    """Documented gap: the graph serves the stored pixels, sideways where EXIF says turn."""
    stored = _photo(150, 100)
    served = artifact.preprocess(tf.constant(_jpeg(stored, 6)), SIZE, "crop", None).numpy()
    unturned = preprocess_image(_jpeg(stored), {"image_size": SIZE, "resize_method": "crop"})
    turned = preprocess_image(_jpeg(stored, 6), {"image_size": SIZE, "resize_method": "crop"})
    assert _difference(served, unturned) <= TOLERANCE[None] < 3 * TOLERANCE[None] < \
        _difference(served, turned)


def test_batch_is_float_pixels_in_order():
    files = [FILES["gif"], FILES["png with alpha"], FILES["jpeg exif orientation 1"]]
    batch = artifact.preprocess_batch(tf.constant(files), SIZE, "crop", None).numpy()
    assert batch.dtype == np.float32 and batch.shape == (3, SIZE, SIZE, 3)
    for pixels, data in zip(batch, files):
        np.testing.assert_array_equal(
            pixels, artifact.preprocess(tf.constant(data), SIZE, "crop", None).numpy())


def test_unreadable_bytes_fail_the_request():
    with pytest.raises(tf.errors.InvalidArgumentError):
        artifact.preprocess(tf.constant(b"not an image"), SIZE, "crop", 95)
