"""A real image set made offline: the letters of many typefaces, one class folder a letter.

    python -m tools.datamakers.font_glyphs OUT_DIR [--fonts DIR ...] [--size 32] [--chars CHARS]
    python -m tools.datamakers.font_glyphs --debian-packages   # what to apt-get install

Each image is one character of one installed font, white ink on black, at the font's own
proportions (scaled so every capital H is the same height, lower case on the same
baseline). The fonts are real work by many type designers (the Debian `fonts-*` packages
the Makefile installs); nothing is generated beyond rasterising their outlines. It is the
pretraining set of `tools.datamakers.glyph_start`, whose start fine-tunes on handwritten
digits: digits are left out of the default classes, so the two sets share no class.
Class folders are `upper_A`, `lower_a` (`A` and `a` collide on case-insensitive
filesystems); file names name the font.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import string
import sys
from collections.abc import Iterable, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from components.common.commands import reports

FONT_FOLDERS = ("/usr/share/fonts",)
# Debian packages of faces by many designers (433 once deduplicated, with DejaVu; ~230 MB).
DEBIAN_FONT_PACKAGES = (
    "fonts-anonymous-pro", "fonts-breip", "fonts-cabin", "fonts-cantarell", "fonts-cmu",
    "fonts-comic-neue", "fonts-croscore", "fonts-crosextra-caladea", "fonts-crosextra-carlito",
    "fonts-dejavu-extra", "fonts-dkg-handwriting", "fonts-ebgaramond", "fonts-fantasque-sans",
    "fonts-femkeklaver", "fonts-firacode", "fonts-freefont-ttf", "fonts-gfs-didot", "fonts-go",
    "fonts-goudybookletter", "fonts-hack", "fonts-humor-sans", "fonts-inconsolata",
    "fonts-isabella", "fonts-junicode", "fonts-jura", "fonts-klaudia-berenika", "fonts-lato",
    "fonts-league-spartan", "fonts-liberation", "fonts-liberation2", "fonts-linuxlibertine",
    "fonts-lmodern", "fonts-mplus", "fonts-noto-core", "fonts-oflb-euterpe",
    "fonts-oldstandard", "fonts-open-sans", "fonts-paratype",
    "fonts-quattrocento", "fonts-roboto-unhinted", "fonts-sil-andika", "fonts-sil-charis",
    "fonts-sil-gentium", "fonts-stix", "fonts-texgyre", "fonts-tomsontalks", "fonts-urw-base35",
    "fonts-vollkorn", "fonts-yanone-kaffeesatz",
)
FONT_SUFFIXES = (".ttf", ".otf")
LETTERS = string.ascii_uppercase + string.ascii_lowercase
# A code point no font maps: what a font draws for it is its "missing glyph" box.
MISSING = "\U0010fffd"
# Variants of each glyph: (capital-H height, horizontal shift, vertical shift), as
# fractions of the image side.
VARIANTS = ((0.62, 0.0, 0.0), (0.5, 0.04, -0.04))
OVERSAMPLE = 4  # drawn this many times larger, then shrunk (anti-aliased edges)
# How the UCI handwritten digits (scikit-learn's `load_digits`) were made from their 32x32
# bitmaps: 4x4 blocks of ink counted, so 8x8 images of 17 grey levels (0..16).
SCAN_BLOCK = 4
# Ink darker than this (of 255) counts as paper when a glyph is binarised for a scan.
SCAN_INK = 64


def class_name(char: str) -> str:
    """Folder name of a character's class: `upper_A`, `lower_a`, `digit_3`, else its code."""
    for kind, chars in (("upper", string.ascii_uppercase), ("lower", string.ascii_lowercase),
                        ("digit", string.digits)):
        if char in chars:
            return f"{kind}_{char}"
    return f"u{ord(char):04x}"


def find_fonts(folders: Iterable[str] = FONT_FOLDERS) -> list[str]:
    """TrueType/OpenType files under `folders` (sorted; links followed once)."""
    found = set()
    for folder in folders:
        for root, _, files in os.walk(folder, followlinks=True):
            for name in files:
                if name.lower().endswith(FONT_SUFFIXES):
                    found.add(os.path.realpath(os.path.join(root, name)))
    return sorted(found)


@functools.lru_cache(maxsize=64)
def _font(path: str, pixels: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, pixels)


def latin_names(path: str, chars: str) -> bool:
    """Whether the font's Unicode map gives each char a glyph named for it: catches symbol
    fonts that draw `a` as alpha or a star; one with names like `glyph123` is lost too."""
    from fontTools.ttLib import TTFont  # matplotlib's dependency (constraints.txt)

    try:
        with TTFont(path, lazy=True) as font:
            mapping = font["cmap"].getBestCmap() or {}
    except Exception:  # noqa: BLE001 - any file fontTools cannot parse is skipped
        return False
    for char in chars:
        name = mapping.get(ord(char))
        if name is None or not (name == char or name.startswith(char + ".")
                                or name.lower() in (f"uni{ord(char):04x}", f"u{ord(char):04x}")):
            return False
    return True


def covers(font: ImageFont.FreeTypeFont, chars: str) -> bool:
    """Whether the font draws every char as its own glyph (not nothing, not its missing box)."""
    missing = _ink(font, MISSING)
    return all((ink := _ink(font, char)) is not None and ink != missing for char in chars)


def _ink(font: ImageFont.FreeTypeFont, char: str) -> bytes | None:
    """The glyph's pixels cropped to its ink, with its size; None when it draws nothing."""
    left, top, right, bottom = font.getbbox(char)
    if right <= left or bottom <= top:
        return None
    image = Image.new("L", (right - left, bottom - top), 0)
    ImageDraw.Draw(image).text((-left, -top), char, fill=255, font=font)
    box = image.getbbox()
    if box is None:
        return None
    image = image.crop(box)
    return repr(image.size).encode() + image.tobytes()


def render(font_path: str, char: str, size: int, cap: float = VARIANTS[0][0],
           shift: tuple[float, float] = (0.0, 0.0)) -> Image.Image:
    """One glyph as a `size` x `size` grayscale image, white ink on black: capital H `cap`
    x size high, centred, its baseline at 0.8 x size (plus `shift`); shrunk if too big."""
    big = size * OVERSAMPLE
    top = _font(font_path, big).getbbox("H", anchor="ls")[1]  # negative: above the baseline
    font = _font(font_path, max(4, round(big * big * cap / max(1, -top))))
    x0, y0, x1, y1 = font.getbbox(char, anchor="ls")
    canvas = Image.new("L", (big, big), 0)
    baseline = big * (0.8 + shift[1])
    width, height = x1 - x0, y1 - y0
    fits = width <= big * 0.95 and baseline + y0 >= 0 and baseline + y1 <= big
    if not fits:  # drawn alone, then scaled into the frame
        glyph = Image.new("L", (max(1, width), max(1, height)), 0)
        ImageDraw.Draw(glyph).text((-x0, -y0), char, fill=255, font=font, anchor="ls")
        glyph.thumbnail((int(big * 0.9), int(big * 0.9)), Image.Resampling.LANCZOS)
        canvas.paste(glyph, ((big - glyph.width) // 2, (big - glyph.height) // 2))
    else:
        x = big * (0.5 + shift[0]) - (x0 + x1) / 2
        ImageDraw.Draw(canvas).text((x, baseline), char, fill=255, font=font, anchor="ls")
    return canvas.resize((size, size), Image.Resampling.BOX)


def scan(image: Image.Image, side: int) -> Image.Image:
    """`image` (a glyph, `render`) as the UCI digits were scanned, drawn back at its size.

    The ink is fitted to a `SCAN_BLOCK * side` square, binarised, and each block's count of
    ink pixels becomes one pixel of a `side` x `side` image (8 for the UCI digits), drawn
    back bilinearly as `tools.datamakers.demo` draws the digits.

    Raises:
        ValueError: `side` is below 1.
    """
    if side < 1:
        raise ValueError(f"a scan's side must be at least 1 pixel, got {side}")
    full = SCAN_BLOCK * side
    canvas = Image.new("L", (full, full), 0)
    box = image.point(lambda v: 255 if v >= SCAN_INK else 0).getbbox()
    if box:
        ink = image.crop(box)
        scale = full / max(ink.size)
        ink = ink.resize((max(1, round(ink.width * scale)), max(1, round(ink.height * scale))),
                         Image.Resampling.LANCZOS)
        canvas.paste(ink, ((full - ink.width) // 2, (full - ink.height) // 2))
    bits = (np.asarray(canvas) >= SCAN_INK).astype(np.uint8)
    counts = bits.reshape(side, SCAN_BLOCK, side, SCAN_BLOCK).sum(axis=(1, 3))
    levels = SCAN_BLOCK * SCAN_BLOCK
    small = Image.fromarray((counts * (255.0 / levels)).astype(np.uint8), mode="L")
    return small.resize(image.size, Image.Resampling.BILINEAR)


def select_fonts(paths: Sequence[str], chars: str, size: int = 32) -> list[tuple[str, str]]:
    """The usable faces: `(path, slug of "family style")`, one per design.

    Skips files FreeType cannot read, fonts lacking any of `chars`, a (family, style)
    seen before, and a face whose rendered `chars` equal an earlier face's.
    """
    chosen, names, looks = [], set(), set()
    for path in paths:
        try:
            font = _font(path, size * OVERSAMPLE)
        except OSError:  # not a font FreeType reads
            continue
        if not covers(font, chars) or not latin_names(path, chars):
            continue
        family, style = font.getname()
        name = (family or os.path.basename(path), style or "")
        if name in names:
            continue
        try:
            look = hashlib.sha256(b"".join(render(path, c, 16).tobytes() for c in chars))
        except (OSError, ValueError, ZeroDivisionError):
            continue
        if look.digest() in looks:
            continue
        names.add(name)
        looks.add(look.digest())
        slug = re.sub(r"[^A-Za-z0-9]+", "-", " ".join(name)).strip("-").lower()
        chosen.append((path, slug or "font"))
    return chosen


def write_glyphs(out_dir: str, font_paths: Sequence[str] | None = None, chars: str = LETTERS,
                 size: int = 32, variants: Sequence[tuple[float, float, float]] = VARIANTS,
                 scan_side: int = 0) -> dict[str, int]:
    """Writes every usable face's `chars` as PNG class folders `<out_dir>/<class_name>/`.

    Args:
        out_dir: Folder to write into.
        font_paths: Font files; default every one under `FONT_FOLDERS`.
        chars, size: The characters (one class each) and the images' side in pixels.
        variants: `(cap height, x shift, y shift)` per image of a glyph (`VARIANTS`).
        scan_side: Each image as a `scan` of this side; 0: crisp.

    Returns:
        `{"fonts": faces used, "images": images written, "classes": len(chars)}`.

    Raises:
        FileNotFoundError: No font covers `chars`.
    """
    faces = select_fonts(font_paths if font_paths is not None else find_fonts(), chars)
    if not faces:
        raise FileNotFoundError("no installed font has every one of the characters "
                                f"{chars!r}: install fonts (Debian: fonts-* packages)")
    written = 0
    slugs: dict[str, int] = {}
    for path, slug in faces:
        slugs[slug] = slugs.get(slug, 0) + 1
        stem = slug if slugs[slug] == 1 else f"{slug}-{slugs[slug]}"
        for char in chars:
            folder = os.path.join(out_dir, class_name(char))
            os.makedirs(folder, exist_ok=True)
            for index, (cap, dx, dy) in enumerate(variants):
                image = render(path, char, size, cap, (dx, dy))
                if scan_side:
                    image = scan(image, scan_side)
                image.save(os.path.join(folder, f"{stem}-{index}.png"))
                written += 1
    return {"fonts": len(faces), "images": written, "classes": len(chars)}


@reports(FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.font_glyphs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--debian-packages", action="store_true",
                        help="print the Debian font packages of the 433 faces and exit")
    parser.add_argument("--fonts", action="append", default=None,
                        help=f"folder of .ttf/.otf files (repeatable; default {FONT_FOLDERS})")
    parser.add_argument("--size", type=int, default=32, help="image side in pixels")
    parser.add_argument("--chars", default=LETTERS, help="characters, one class each")
    parser.add_argument("--variants", type=int, default=len(VARIANTS),
                        help=f"images per glyph, 1..{len(VARIANTS)}")
    parser.add_argument("--scan-side", type=int, default=0,
                        help="draw each glyph as a scan of this side, as the UCI digits were "
                             "(8); 0: crisp")
    args = parser.parse_args(argv)
    if args.debian_packages:
        print(" ".join(DEBIAN_FONT_PACKAGES))
        return 0
    if not args.out_dir:
        parser.error("OUT_DIR is required")
    if not 1 <= args.variants <= len(VARIANTS):
        parser.error(f"--variants must be in 1..{len(VARIANTS)}")
    if args.scan_side < 0:
        parser.error(f"--scan-side must be 0 (crisp) or a side in pixels, got {args.scan_side}")
    counts = write_glyphs(args.out_dir, find_fonts(args.fonts or FONT_FOLDERS), args.chars,
                          args.size, VARIANTS[:args.variants], args.scan_side)
    print(f"wrote {counts['images']} images of {counts['classes']} characters from "
          f"{counts['fonts']} typefaces to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
