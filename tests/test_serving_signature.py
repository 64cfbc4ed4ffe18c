"""The image model's bytes-in signature decodes and resizes as the sharding step does.

`components.train_image.artifact` (TensorFlow ops, in the SavedModel) against
`components.predict.prediction.preprocess_image` (PIL, the sharding step's own code):
the same files must give the same pixels, bit for bit.
The trained model served from bytes is checked in test_run_local.
"""

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from components.predict.prediction import preprocess_image
from components.train_image import artifact

SIZE = 32


def _photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth colour gradients with noise: like a photo, unlike a flat test card."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([128 + 100 * np.sin(x / 17 + y / 29), 128 + 100 * np.cos(x / 11),
                       128 + 80 * np.sin(y / 7)], -1)
    return np.clip(pixels + rng.normal(0, 10, pixels.shape), 0, 255).astype(np.uint8)


def _encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _jpeg(pixels: np.ndarray, orientation: int | None = None, mode: str = "RGB") -> bytes:
    options = {"quality": 90}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    return _encode(Image.fromarray(pixels).convert(mode), "JPEG", **options)


def _transparent_png(pixels: np.ndarray) -> bytes:
    rgba = np.array(Image.fromarray(pixels).convert("RGBA"))
    rgba[..., 3] = np.linspace(0, 255, rgba.shape[1]).astype(np.uint8)[None]
    return _encode(Image.fromarray(rgba), "PNG")


FILES = {
    "jpeg scaled 1/8 on decode": _jpeg(_photo(600, 800)),
    "jpeg smaller than 2x": _jpeg(_photo(40, 90)),
    "grayscale jpeg": _jpeg(_photo(120, 160), mode="L"),
    **{f"jpeg exif orientation {o}": _jpeg(_photo(150, 100, o), o) for o in range(1, 9)},
    "png with alpha": _transparent_png(_photo(150, 100)),
    "grayscale png": _encode(Image.fromarray(_photo(64, 64)).convert("L"), "PNG"),
    "gif": _encode(Image.fromarray(_photo(50, 70)).convert("P"), "GIF"),
    "bmp": _encode(Image.fromarray(_photo(45, 61)), "BMP"),
}


@pytest.mark.parametrize("method", ["crop", "pad"])
@pytest.mark.parametrize("jpeg_quality", [95, None], ids=["jpeg shards", "raw shards"])
def test_graph_pixels_are_the_sharding_steps(method, jpeg_quality):
    preprocessing = {"image_size": SIZE, "resize_method": method,
                     "image_format": "jpeg" if jpeg_quality else "raw",
                     "jpeg_quality": jpeg_quality}
    for name, data in FILES.items():
        expected = preprocess_image(data, preprocessing)
        served = artifact.preprocess(tf.constant(data), SIZE, method, jpeg_quality).numpy()
        assert served.shape == expected.shape == (SIZE, SIZE, 3), name
        np.testing.assert_array_equal(served, expected, err_msg=name)  # bit for bit


def test_batch_is_float_pixels_in_order():
    files = [FILES["gif"], FILES["png with alpha"], FILES["jpeg exif orientation 6"]]
    batch = artifact.preprocess_batch(tf.constant(files), SIZE, "crop", None).numpy()
    assert batch.dtype == np.float32 and batch.shape == (3, SIZE, SIZE, 3)
    for pixels, data in zip(batch, files):
        np.testing.assert_array_equal(
            pixels, artifact.preprocess(tf.constant(data), SIZE, "crop", None).numpy())


def _tiff_ifd(orientation: int, byte_order: str) -> bytes:
    """A TIFF header and IFD0 with two entries, the orientation second."""
    end = "<" if byte_order == "II" else ">"
    entries = [(0x010F, 2, 4, b"Cam\0"), (0x0112, 3, 1, struct.pack(f"{end}H", orientation))]
    body = struct.pack(f"{end}H", len(entries))
    for tag, kind, count, value in entries:
        body += struct.pack(f"{end}HHI", tag, kind, count) + value.ljust(4, b"\0")
    return byte_order.encode() + struct.pack(f"{end}HI", 42, 8) + body + b"\0" * 4


def _with_app_segments(jpeg: bytes, *segments: tuple[int, bytes]) -> bytes:
    """Inserts APPn segments right after the SOI marker."""
    inserted = b"".join(struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload
                        for marker, payload in segments)
    return jpeg[:2] + inserted + jpeg[2:]


@pytest.mark.parametrize("byte_order", ["II", "MM"])
def test_exif_orientation_both_byte_orders_after_other_segments(byte_order):
    plain = _jpeg(_photo(20, 30))
    for orientation in range(1, 9):
        data = _with_app_segments(plain, (0xE0, b"JFIF\0" + b"\1\1\0\0\1\0\1\0\0"),
                                  (0xE1, b"http://ns.adobe.com/xap/1.0/\0<x/>"),  # XMP, not EXIF
                                  (0xE1, b"Exif\0\0" + _tiff_ifd(orientation, byte_order)))
        assert artifact.exif_orientation(tf.constant(data)).numpy() == orientation
        assert Image.open(io.BytesIO(data)).getexif()[0x0112] == orientation  # PIL agrees


def test_exif_orientation_defaults_to_upright():
    plain = _jpeg(_photo(20, 30))
    assert artifact.exif_orientation(tf.constant(plain)).numpy() == 1
    out_of_range = _with_app_segments(plain, (0xE1, b"Exif\0\0" + _tiff_ifd(9, "II")))
    assert artifact.exif_orientation(tf.constant(out_of_range)).numpy() == 1
    truncated = _with_app_segments(plain, (0xE1, b"Exif\0\0" + _tiff_ifd(6, "II")))[:40]
    # the segment is cut before its orientation: nothing to read, so upright (and no crash)
    assert artifact.exif_orientation(tf.constant(truncated)).numpy() == 1


def test_unreadable_bytes_fail_the_request():
    with pytest.raises(tf.errors.InvalidArgumentError):
        artifact.preprocess(tf.constant(b"not an image"), SIZE, "crop", 95)
