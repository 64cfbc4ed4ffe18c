"""Small labelled datasets made on the spot, so the pipelines run with nothing downloaded.

    python -m tools.datamakers.demo digits OUT_DIR
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from PIL import Image


def write_digits(out_dir: str, size: int = 32, per_class: int | None = None) -> dict[str, int]:
    """Writes scikit-learn's 8x8 digits, upscaled to `size`, as JPEG class folders
    `<out_dir>/<digit>/` (at most `per_class` each); the images written per class.

    A `.DS_Store` and one truncated JPEG are planted, as real buckets have them, so the run
    shows what is ignored and what is skipped.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts: dict[str, int] = {}
    for index, (pixels, target) in enumerate(zip(digits.images, digits.target)):
        name = f"digit_{target}"
        if per_class is not None and counts.get(name, 0) >= per_class:
            continue
        folder = os.path.join(out_dir, name)
        os.makedirs(folder, exist_ok=True)
        gray = (pixels * (255.0 / 16.0)).astype(np.uint8)  # digits range 0..16
        image = Image.fromarray(gray, mode="L").resize((size, size), Image.Resampling.BILINEAR)
        image.save(os.path.join(folder, f"{index:04d}.jpg"), quality=95)
        counts[name] = counts.get(name, 0) + 1
    with open(os.path.join(out_dir, ".DS_Store"), "wb") as f:
        f.write(b"\0\0\0\1Bud1")
    digit_0 = os.path.join(out_dir, "digit_0")
    first = os.path.join(digit_0, sorted(os.listdir(digit_0))[0])
    with open(first, "rb") as f:
        data = f.read()
    with open(os.path.join(out_dir, "digit_0", "truncated.jpg"), "wb") as f:
        f.write(data[: len(data) // 3])
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["digits"])
    parser.add_argument("out_dir")
    parser.add_argument("--per-class", type=int, default=None)
    args = parser.parse_args(argv)
    counts = write_digits(args.out_dir, per_class=args.per_class)
    print(f"wrote {sum(counts.values())} images in {len(counts)} class folders to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
