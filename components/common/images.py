"""Image decoding shared by sharding and prediction, so both see the same pixels (PIL only)."""

from __future__ import annotations

import io

from PIL import Image, ImageOps, UnidentifiedImageError

# Largest image decoded, after JPEG draft scaling: 40 MP stays under ~0.5 GB of memory.
MAX_DECODE_PIXELS = 40_000_000
_DRAFT_MARGIN = 4


class BadImage(ValueError):
    """A file that cannot be used as an image; the message is the reason."""


def to_rgb(image: Image.Image) -> Image.Image:
    """Converts any mode (L, P, CMYK, RGBA, LA, I;16...) to RGB, transparency on white."""
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
        # JPEG draft scaling to >= 4 x size (nearer is a block average, unlike serving's resize)
        image.draft("RGB", (_DRAFT_MARGIN * size, _DRAFT_MARGIN * size))
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


def resize(image: Image.Image, size: int, method: str) -> Image.Image:
    """Resizes to `size` x `size` by center crop ("crop") or letterbox ("pad", black bars),
    bilinear as the serving graph (`components.train_image.artifact`)."""
    if method == "crop":
        return ImageOps.fit(image, (size, size), Image.Resampling.BILINEAR)
    return ImageOps.pad(image, (size, size), Image.Resampling.BILINEAR, color=(0, 0, 0))


def encode_image(image: Image.Image, image_format: str, jpeg_quality: int) -> bytes:
    """Encodes an RGB image as JPEG bytes or raw uint8 HWC bytes."""
    if image_format == "raw":
        return image.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=jpeg_quality)
    return buffer.getvalue()
