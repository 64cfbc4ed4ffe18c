"""The Tux Paint photo maker on a stamps folder laid out as Debian's package lays it out."""

import pytest
from PIL import Image

from tools.datamakers import tuxpaint_photos


def _stamp(path, colour=(200, 30, 30, 255)):
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGBA", (20, 10), (0, 0, 0, 0))  # transparent, a photo in the middle
    image.paste(Image.new("RGBA", (10, 10), colour), (5, 0))
    image.save(path)


def test_photos_become_class_folders_on_white_drawings_left_out(tmp_path):
    stamps = tmp_path / "stamps"
    _stamp(stamps / "animals/birds/robin.png")
    _stamp(stamps / "animals/birds/cartoon/tweety.png")  # a drawing
    (stamps / "animals/birds/owl.svg").write_text("<svg/>")  # drawings too
    _stamp(stamps / "animals/mammals/cats/lion.png")
    _stamp(stamps / "plants/flowers/rose.png")
    _stamp(stamps / "food/fruit/apple.png")
    _stamp(stamps / "food/vegetables/leek.png")
    out = tmp_path / "out"
    counts = tuxpaint_photos.write_photos(str(stamps), str(out))
    assert counts == {"birds": 1, "mammals": 1, "flowers": 1, "fruit_veg": 2}
    assert sorted(p.name for p in (out / "fruit_veg").iterdir()) == ["fruit_apple.jpg",
                                                                     "vegetables_leek.jpg"]
    robin = Image.open(out / "birds" / "birds_robin.jpg")
    assert robin.mode == "RGB" and robin.getpixel((0, 5)) == pytest.approx((255, 255, 255),
                                                                            abs=3)


def test_a_missing_stamps_folder_says_what_to_install(tmp_path, capsys):
    assert tuxpaint_photos.main(["--stamps", str(tmp_path / "none"), str(tmp_path / "o")]) != 0
    assert "apt-get install tuxpaint-stamps-default" in capsys.readouterr().err
