"""Image decoding shared by sharding and prediction: one place, so both see the same pixels.

PIL only (no TensorFlow): bytes -> upright RGB (EXIF orientation applied, transparency
on white) -> `size` x `size` by center crop or letterbox -> JPEG or raw bytes.
"""

from __future__ import annotations

import io

from PIL import Image, ImageOps, UnidentifiedImageError

# Largest image decoded, in pixels after JPEG draft scaling (which shrinks big JPEGs
# while reading). A 13000x13000 RGBA PNG of 0.7 MB needs ~3 GB to decode and convert;
# 40 MP stays under ~0.5 GB, so one writer per core fits a highcpu machine's memory.
MAX_DECODE_PIXELS = 40_000_000


class BadImage(ValueError):
    """A file that cannot be used as an image; the message is the reason."""


def to_rgb(image: Image.Image) -> Image.Image:
    """Converts any mode (L, P, CMYK, RGBA, LA, I;16...) to RGB.

    Transparent pixels are composited onto white, which is what a viewer shows;
    dropping the alpha channel would expose whatever colour hides behind it.
    """
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    if image.mode.startswith("I;16"):
        # 16-bit grayscale: scale to 8 bits rather than clip
        image = image.point(lambda v: v / 256).convert("L")
    return image.convert("RGB") if image.mode != "RGB" else image


def decode_image(data: bytes, size: int) -> Image.Image:
    """Decodes an image file into RGB, raising BadImage with the reason if it cannot."""
    if not data:
        raise BadImage("empty file")
    try:
        image = Image.open(io.BytesIO(data))
        # Let the JPEG decoder scale down by 1/2..1/8 while both sides stay >= size.
        image.draft("RGB", (size, size))
        width, height = image.size
        if width * height > MAX_DECODE_PIXELS:
            raise BadImage(f"too large to decode: {width}x{height} pixels, more than "
                           f"{MAX_DECODE_PIXELS // 1_000_000} MP; downscale it")
        image.load()
        # Phone photos store the pixels sideways and say how to turn them (EXIF).
        ImageOps.exif_transpose(image, in_place=True)
        return to_rgb(image)
    except UnidentifiedImageError:
        raise BadImage("not a recognised image format") from None
    except BadImage:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise BadImage(f"unreadable image: {err}") from None


def _bilinear(image: Image.Image, size: tuple[int, int],
              box: tuple[float, float, float, float]) -> Image.Image:
    """`image.resize(size, BILINEAR, box=box)` as two explicit one-axis passes.

    PIL does the same two passes but picks their order by the shape (Pillow 13 runs tall
    crops vertical-first), and each pass rounds to 8 bits, so the order shows in the
    pixels. A fixed order (horizontal, then vertical) is what the serving graph repeats.
    """
    left, top, right, bottom = box
    rows = image.resize((size[0], image.height), Image.Resampling.BILINEAR,
                        box=(left, 0, right, image.height))
    return rows.resize(size, Image.Resampling.BILINEAR, box=(0, top, size[0], bottom))


def resize(image: Image.Image, size: int, method: str) -> Image.Image:
    """Resizes to `size` x `size` by center crop ("crop") or letterbox ("pad").

    The arithmetic of PIL's `ImageOps.fit` and `ImageOps.pad` (centred, bilinear, black
    bars), with the resize passes in a fixed order (see `_bilinear`).
    """
    width, height = image.size
    if method == "crop":
        side = min(width, height)
        left, top = (width - side) * 0.5, (height - side) * 0.5
        return _bilinear(image, (size, size), (left, top, left + side, top + side))
    # Python's round (half to even), as ImageOps.contain/pad
    new_w = round(width / height * size) if width < height else size
    new_h = round(height / width * size) if width > height else size
    inner = _bilinear(image, (new_w, new_h), (0, 0, width, height))
    if (new_w, new_h) == (size, size):
        return inner
    padded = Image.new("RGB", (size, size), (0, 0, 0))
    padded.paste(inner, (round((size - new_w) * 0.5), round((size - new_h) * 0.5)))
    return padded


def encode_image(image: Image.Image, image_format: str, jpeg_quality: int) -> bytes:
    """Encodes an RGB image as JPEG bytes or raw uint8 HWC bytes."""
    if image_format == "raw":
        return image.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=jpeg_quality)
    return buffer.getvalue()
