"""Unit tests of the sharding logic: listing, split, sizing, image handling, failures."""

import io
import json
import os
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from components.common import images
from components.common.images import BadImage
from components.shard import sharding
from components.shard.contract import ShardingError
from components.shard.sharding import ShardConfig, list_labelled_files
from tests.conftest import plant_bad_files, write_class_images

SMALL = dict(image_size=16, min_shards_per_split=2, num_workers=1)


def shard(data, out, **changes) -> dict:
    """`shard_dataset` with the SMALL settings (`changes` on top), no progress bar."""
    return sharding.shard_dataset(str(data), str(out), ShardConfig(**{**SMALL, **changes}),
                                  progress=False)


def listed(manifest) -> list[str]:
    """The shard files a manifest names, sorted."""
    return sorted(s["file"] for split in manifest["splits"].values() for s in split["shards"])


# ----------------------------------------------------------------------- split and sizing

def test_split_counts_round_val_and_test_and_give_train_the_rest():
    f = {"train": 0.8, "validation": 0.1, "test": 0.1}
    assert sharding.split_counts(100, f) == {"train": 80, "validation": 10, "test": 10}
    assert sharding.split_counts(7, f) == {"train": 5, "validation": 1, "test": 1}
    assert sharding.split_counts(1, f) == {"train": 1, "validation": 0, "test": 0}
    assert sharding.split_counts(2, {"train": 0, "validation": 0.5, "test": 0.5}) == {
        "train": 0, "validation": 1, "test": 1}


def test_stratified_split_is_per_class_complete_and_seeded():
    files = {"a": [f"a/{i}" for i in range(50)], "b": [f"b/{i}" for i in range(10)]}
    fractions = {"train": 0.6, "validation": 0.2, "test": 0.2}
    splits = sharding.stratified_split(files, ["a", "b"], fractions, seed=1)
    per_split = {s: Counter(label for _, label in items) for s, items in splits.items()}
    assert per_split["train"] == {0: 30, 1: 6}
    assert per_split["validation"] == {0: 10, 1: 2}
    assert per_split["test"] == {0: 10, 1: 2}
    everything = sorted(p for items in splits.values() for p, _ in items)
    assert everything == sorted(files["a"] + files["b"])
    assert splits == sharding.stratified_split(files, ["a", "b"], fractions, seed=1)
    assert splits != sharding.stratified_split(files, ["a", "b"], fractions, seed=2)
    # Input order does not matter: the listing order of a bucket is not a contract.
    shuffled = {"a": list(reversed(files["a"])), "b": files["b"]}
    assert splits == sharding.stratified_split(shuffled, ["a", "b"], fractions, seed=1)


def test_shard_count_follows_size_target_with_floor_and_cap():
    # 10_000 records of 100 kB = 1 GB -> 10 shards of 100 MB
    assert sharding.shard_count(10_000, 100e3, 100.0, min_shards=4) == 10
    # small data: the floor keeps several files to interleave
    assert sharding.shard_count(1_000, 30e3, 100.0, min_shards=16) == 16
    # never more shards than examples, none for an empty split
    assert sharding.shard_count(5, 30e3, 100.0, min_shards=16) == 5
    assert sharding.shard_count(0, 30e3, 100.0, min_shards=16) == 0


def test_worker_count_is_asked_for_or_one_per_core_for_enough_images():
    assert sharding.worker_count(0, 100_000, 64, cpus=8) == 8  # every core
    assert sharding.worker_count(0, 500, 12, cpus=8) == 2  # one per 200 images
    assert sharding.worker_count(0, 150, 12, cpus=8) == 1  # in the step's own process
    assert sharding.worker_count(3, 10, 12, cpus=8) == 3  # asked for: kept
    assert sharding.worker_count(16, 100_000, 6, cpus=8) == 6  # never more than the shards


def test_chunk_is_contiguous_and_balanced():
    parts = sharding.chunk(list(range(10)), 3)
    assert parts == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert sum(parts, []) == list(range(10))


def test_config_rejects_bad_values_with_every_problem_named():
    with pytest.raises(ShardingError) as err:
        ShardConfig(image_format="png", train_fraction=0.9, jpeg_quality=0)
    message = str(err.value)
    assert "image_format" in message and "fractions" in message and "jpeg_quality" in message


# ----------------------------------------------------------------------- images

def _encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kw)
    return buffer.getvalue()


@pytest.mark.parametrize("mode,fmt", [("L", "PNG"), ("P", "PNG"), ("CMYK", "JPEG"),
                                      ("RGBA", "PNG"), ("LA", "PNG"), ("I;16", "PNG"),
                                      ("RGB", "JPEG")])
def test_every_colour_mode_becomes_rgb(mode, fmt):
    colour = (200, 100, 50)
    image = Image.new("RGB", (20, 10), colour).convert(mode)
    if mode == "I;16":  # a real 16-bit image spans 0..65535 (Pillow's convert keeps 0..255)
        grey16 = Image.new("RGB", (1, 1), colour).convert("L").getpixel((0, 0)) * 257
        image = Image.fromarray(np.full((10, 20), grey16, dtype=np.uint16))
    decoded = images.decode_image(_encoded(image, fmt), 8)
    assert decoded.mode == "RGB" and decoded.size == (20, 10)
    # The colour survives (grey for the one-channel modes), not inverted or clipped.
    grey = Image.new("RGB", (1, 1), colour).convert("L").getpixel((0, 0))
    expected = (grey,) * 3 if mode in ("L", "LA", "I;16") else colour
    assert np.abs(np.asarray(decoded)[5, 10].astype(int) - expected).max() <= 12


def test_transparent_pixels_become_white_not_hidden_colour():
    image = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    decoded = images.decode_image(_encoded(image, "PNG"), 4)
    assert decoded.getpixel((0, 0)) == (255, 255, 255)


def test_crop_fills_the_square_and_pad_letterboxes_with_black():
    image = Image.new("RGB", (40, 20), (255, 255, 255))
    cropped = images.resize(image, 16, "crop")
    padded = images.resize(image, 16, "pad")
    assert cropped.size == padded.size == (16, 16)
    assert np.asarray(cropped).min() == 255
    rows = np.asarray(padded).mean(axis=(1, 2))
    assert rows[0] == 0 and rows[-1] == 0 and rows[8] == 255


def test_raw_and_jpeg_encodings():
    image = Image.new("RGB", (16, 16), (10, 20, 30))
    raw = images.encode_image(image, "raw", 95)
    assert len(raw) == 16 * 16 * 3 and raw[:3] == bytes([10, 20, 30])
    jpeg = images.encode_image(image, "jpeg", 90)
    assert jpeg[:2] == b"\xff\xd8" and Image.open(io.BytesIO(jpeg)).size == (16, 16)
    assert jpeg == images.encode_image(image, "jpeg", 90)  # deterministic


_JPEG = _encoded(Image.new("RGB", (64, 64), (1, 2, 3)), "JPEG")


@pytest.mark.parametrize("data,reason", [
    (b"", "empty file"),
    (b"hello, not an image", "not a recognised image format"),
    (_JPEG[: len(_JPEG) // 2], "unreadable image"),  # truncated
])
def test_bad_bytes_raise_bad_image_with_reason(data, reason):
    with pytest.raises(BadImage, match=reason):
        images.decode_image(data, 8)


# ----------------------------------------------------------------------- listing

def test_listing_ignores_stray_and_hidden_files(tmp_path):
    root = str(tmp_path)
    write_class_images(root, per_class=2)
    plant_bad_files(root)
    os.makedirs(tmp_path / ".git")
    (tmp_path / ".git" / "HEAD").write_text("ref")
    listing = list_labelled_files(root)
    assert listing.classes == ["cat", "dog", "eel"]
    assert "cat/.hidden.jpg" not in listing.files["cat"]
    assert "eel/notes.txt" in listing.files["eel"]  # tried, then skipped as not an image
    ignored = {i["path"]: i["reason"] for i in listing.ignored}
    assert ignored == {".DS_Store": "outside class folders", "README.md": "outside class folders",
                       "cat/.hidden.jpg": "hidden file", ".git/HEAD": "hidden folder"}


def test_listing_errors_name_the_problem(tmp_path):
    with pytest.raises(ShardingError, match="does not exist"):
        list_labelled_files(str(tmp_path / "missing"))
    write_class_images(str(tmp_path), per_class=1)
    os.makedirs(tmp_path / "zebra")
    with pytest.raises(ShardingError, match=r"\['zebra'\].*hold no files"):
        list_labelled_files(str(tmp_path))
    one = tmp_path / "one"
    (one / "only").mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(one / "only" / "a.png")
    with pytest.raises(ShardingError, match="at least two"):
        list_labelled_files(str(one))


# ----------------------------------------------------------------------- whole runs

def test_shard_dataset_counts_and_sizes(tmp_path, image_folder):
    out = str(tmp_path / "out")
    manifest = shard(image_folder, out)
    assert manifest["examples_in"] == manifest["written"] == 36
    assert manifest["label_map"] == {"cat": 0, "dog": 1, "eel": 2}
    for split, expected in {"train": 10, "validation": 1, "test": 1}.items():
        counts = manifest["splits"][split]["class_counts"]
        assert counts == {"cat": expected, "dog": expected, "eel": expected}
        shards = manifest["splits"][split]["shards"]
        assert len(shards) == 2 and sum(s["records"] for s in shards) == 3 * expected
    assert sorted(f for f in os.listdir(out) if f.endswith(".tfrecord")) == listed(manifest)
    assert "train-00000-of-00002.tfrecord" in listed(manifest)
    assert not [f for f in os.listdir(out) if f.startswith(".tmp-")]
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f) == manifest


def test_size_target_drives_shard_count(tmp_path, image_folder):
    config = ShardConfig(image_size=32, image_format="raw", min_shards_per_split=1,
                         target_shard_mb=32 * 32 * 3 * 4 / 1e6, num_workers=1)
    manifest = sharding.shard_dataset(image_folder, str(tmp_path / "o"), config, progress=False)
    # 30 train records of ~3 kB with a 4-record target -> 8 shards
    assert len(manifest["splits"]["train"]["shards"]) == 8
    sizes = [s["bytes"] for s in manifest["splits"]["train"]["shards"]]
    assert max(sizes) <= config.target_shard_mb * 1e6 * 1.05  # estimate from a sample


def test_rerun_replaces_previous_output_and_only_ours(tmp_path, image_folder):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.tfrecord").write_bytes(b"someone else's records")
    shard(image_folder, out)
    # The temporary name of a shard the manifest names: ours too.
    (out / ".tmp-test-00000-of-00002.tfrecord").write_bytes(b"killed run")
    (out / "notes.txt").write_text("keep me")
    manifest = shard(image_folder, out, min_shards_per_split=3)
    assert "train-00000-of-00003.tfrecord" in listed(manifest)
    assert sorted(os.listdir(out)) == sorted(listed(manifest) + ["manifest.json", "notes.txt",
                                                                 "mine.tfrecord"])
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "mine.tfrecord").read_bytes() == b"someone else's records"
    # Files named like shards but not ours: tests/test_bad_inputs_shard.py


def test_class_with_no_usable_image_fails_and_leaves_nothing_whole(tmp_path):
    root = tmp_path / "in"
    write_class_images(str(root), per_class=3)
    for path in (root / "eel").iterdir():
        path.write_bytes(b"corrupt")
    out = tmp_path / "out"
    with pytest.raises(ShardingError, match=r"\['eel'\] have no usable image"):
        shard(root, out, max_skipped_fraction=1)
    assert os.listdir(out) == []


def test_too_many_skipped_files_fail_with_the_reasons(tmp_path):
    root = tmp_path / "in"
    write_class_images(str(root), per_class=10)
    bad = plant_bad_files(str(root))
    out = tmp_path / "out"
    with pytest.raises(ShardingError) as err:
        shard(root, out, max_skipped_fraction=0.05)
    message = str(err.value)
    assert "3 of 33 files" in message and "max_skipped_fraction" in message
    assert all(path in message for path in bad)
    assert os.listdir(out) == []
    manifest = shard(root, out, max_skipped_fraction=0.1)
    assert {s["path"]: s["reason"] for s in manifest["skipped"]}.keys() == bad.keys()


def test_parallel_workers_write_the_same_bytes_as_one(tmp_path, image_folder):
    two = shard(image_folder, tmp_path / "b", num_workers=2)
    assert shard(image_folder, tmp_path / "a")["splits"] == two["splits"]


# ----------------------------------------------------------------------- awkward inputs

def bracket_folder(root, per_class: int):
    """Two classes, "cat [hi-res]" and "dog", of `per_class` images named "img[<i>].jpg"."""
    for name, colour in (("cat [hi-res]", (200, 0, 0)), ("dog", (0, 200, 0))):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (20, 20), colour).save(root / name / f"img[{i}].jpg")


def test_brackets_in_folder_and_file_names_are_plain_characters(tmp_path):
    root = tmp_path / "data [v2]"
    bracket_folder(root, per_class=6)
    manifest = shard(root, tmp_path / "out")
    assert manifest["classes"] == ["cat [hi-res]", "dog"]
    assert manifest["written"] == 12 and manifest["skipped"] == []
    from components.formats.shards import make_dataset

    keys = [key for split in ("train", "validation", "test") for *_, key in
            make_dataset(str(tmp_path / "out"), split, with_keys=True).as_numpy_iterator()]
    assert b"cat [hi-res]/img[0].jpg" in keys and len(keys) == 12


def test_symlinked_class_folder_is_a_class(tmp_path):
    root = tmp_path / "data"
    write_class_images(str(root), per_class=3)
    elsewhere = tmp_path / "elsewhere"
    os.rename(root / "eel", elsewhere)
    os.symlink(elsewhere, root / "eel")
    os.symlink(tmp_path / "gone", root / "broken")
    listing = list_labelled_files(str(root))
    assert listing.classes == ["cat", "dog", "eel"]
    assert len(listing.files["eel"]) == 3
    assert {"path": "broken", "reason": "symbolic link to nothing"} in listing.ignored


def test_exif_orientation_is_applied(tmp_path):
    # Stored sideways as phones do: 30 wide, 20 high, with "rotate 90 clockwise" (6).
    pixels = np.zeros((20, 30, 3), dtype=np.uint8)
    pixels[:, :15] = (255, 0, 0)  # left half red, right half blue, as stored
    pixels[:, 15:] = (0, 0, 255)
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6
    data = _encoded(image, "PNG", exif=exif.tobytes())
    upright = images.decode_image(data, 8)
    assert upright.size == (20, 30)  # turned: now portrait
    top, bottom = np.asarray(upright)[2, 10], np.asarray(upright)[-3, 10]
    assert top[0] > 200 and bottom[2] > 200  # what was left (red) is on top


def test_images_too_large_to_decode_are_skipped_without_decoding():
    # A real 13000x13000 RGBA PNG of zeros: 0.7 MB on disk, ~3 GB to decode.
    import struct
    import zlib

    def chunk(kind, payload):
        body = kind + payload
        return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body))

    side = 13000
    # run-length deflate: the same bytes as level 9 for rows of zeros, in half the time
    compressor = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    row = b"\0" * (1 + side * 4)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 6, 0, 0, 0))
           + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    assert len(png) < 1_000_000
    with pytest.raises(BadImage, match="too large to decode: 13000x13000 pixels"):
        images.decode_image(png, 224)
    # A big JPEG is fine: the decoder scales it down while reading.
    big = _encoded(Image.new("RGB", (9000, 6000), (10, 20, 30)), "JPEG")
    assert images.decode_image(big, 224).size[1] >= 224


@pytest.mark.parametrize("inside", ["input/out", "."])
def test_output_folder_overlapping_the_input_is_refused(tmp_path, inside):
    root = tmp_path / "input"
    write_class_images(str(root), per_class=2)
    before = sorted(p.name for p in root.rglob("*"))
    out = root / "cat" / "shards" if inside == "input/out" else tmp_path
    with pytest.raises(ShardingError, match="overlap.*write the output outside"):
        shard(root, out)
    assert sorted(p.name for p in root.rglob("*")) == before


@pytest.mark.parametrize("fractions", [
    {"train_fraction": float("nan")},
    {"validation_fraction": float("nan")},
    {"train_fraction": 0.7, "validation_fraction": 0.2, "test_fraction": float("inf")},
])
def test_fractions_that_are_not_numbers_are_refused(fractions):
    with pytest.raises(ShardingError, match="split fractions must sum to 1"):
        ShardConfig(**fractions)


def test_the_same_image_in_two_class_folders_is_counted_and_named(tmp_path):
    """One image under two labels teaches the model a contradiction; one under two splits
    is tested on after being trained on. Both are counted in the manifest."""
    import shutil

    root = tmp_path / "images"
    written = write_class_images(str(root), per_class=12)
    first, second = sorted(written)[:2]
    source = written[first][0]
    copy_name = f"copied{os.path.splitext(source)[1]}"
    shutil.copy(root / source, root / second / copy_name)  # the same bytes, another label
    manifest = shard(root, tmp_path / "out", min_shards_per_split=16)  # the default
    duplicates = manifest["duplicate_files"]
    assert duplicates["files"] == 2 and duplicates["images"] == 1
    assert duplicates["across_classes"] == {"count": 1,
                                            "copies": [sorted([source, f"{second}/{copy_name}"])]}
    assert duplicates["across_splits"]["count"] in (0, 1)  # wherever the split put them
    os.remove(root / second / copy_name)
    clean = shard(root, tmp_path / "out3", min_shards_per_split=16)
    assert clean["duplicate_files"] == {"files": 0, "images": 0,
                                        "across_classes": {"count": 0, "copies": []},
                                        "across_splits": {"count": 0, "copies": []}}
