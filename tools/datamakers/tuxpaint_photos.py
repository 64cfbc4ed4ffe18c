"""Real photos no one on the team made, as image class folders: Tux Paint's stamps.

    python -m tools.datamakers.tuxpaint_photos [--stamps DIR] OUT_DIR

The source is Debian's `tuxpaint-stamps-default` package (GPL-2; installed, or its .deb
extracted with `dpkg-deb -x` and passed as --stamps): cut-out photographs taken by Tux
Paint's contributors. The four `CLASSES`, every PNG of their folders but the drawings
(`cartoon/`; SVG stamps are not read), each laid on white and written as JPEG
`<class>/<folder>_<name>.jpg`. Version 2022.06.04-1 gives birds 35, mammals 65, flowers
25, fruit_veg 44.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from PIL import Image

from components.common.commands import reports

STAMPS = "/usr/share/tuxpaint/stamps"
# class -> the stamp folders (under STAMPS) whose photos it takes.
CLASSES = {"birds": ("animals/birds",), "mammals": ("animals/mammals",),
           "flowers": ("plants/flowers",), "fruit_veg": ("food/fruit", "food/vegetables")}
DRAWINGS = "cartoon"


def write_photos(stamps: str, out_dir: str) -> dict[str, int]:
    """Writes the four classes' photos of Tux Paint's `stamps` folder as JPEG class folders
    `<out_dir>/<class>/`; the images written per class.

    Raises:
        FileNotFoundError: `stamps` or one of its class folders is missing.
    """
    missing = [folder for folders in CLASSES.values() for folder in folders
               if not os.path.isdir(os.path.join(stamps, folder))]
    if missing:
        raise FileNotFoundError(
            f"no Tux Paint stamps at {stamps!r} (missing {', '.join(missing)}): run `apt-get "
            "install tuxpaint-stamps-default` (Debian's package, GPL-2), or pass --stamps with "
            "the usr/share/tuxpaint/stamps folder of its .deb extracted by `dpkg-deb -x`")
    counts = {}
    for name, folders in CLASSES.items():
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        photos = sorted(png for folder in folders for png in (Path(stamps) / folder).rglob("*.png")
                        if DRAWINGS not in png.relative_to(stamps).parts)  # no drawings
        names = [f"{png.parent.name}_{png.stem}.jpg" for png in photos]
        if len(set(names)) < len(names):  # two stamps would write one file
            raise FileExistsError(f"{name}: two stamps under {folders} share a folder and "
                                  "file name; this maker writes <folder>_<name>.jpg")
        for png in photos:
            image = Image.open(png).convert("RGBA")
            white = Image.new("RGBA", image.size, "white")
            white.alpha_composite(image)
            white.convert("RGB").save(
                os.path.join(out_dir, name, f"{png.parent.name}_{png.stem}.jpg"), quality=95)
        counts[name] = len(photos)
    return counts


@reports(FileNotFoundError, FileExistsError)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.datamakers.tuxpaint_photos",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write the class folders into")
    parser.add_argument("--stamps", default=STAMPS,
                        help=f"Tux Paint's stamps folder (default {STAMPS})")
    args = parser.parse_args(argv)
    counts = write_photos(args.stamps, args.out_dir)
    print(f"wrote {sum(counts.values())} photos to {args.out_dir}: "
          + ", ".join(f"{name} {count}" for name, count in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
