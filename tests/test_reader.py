"""The tf.data reader returns exactly what the writer stored, in both image formats."""

import os

import numpy as np
import pytest

from components.common import images
from components.formats.shards import make_dataset
from components.shard.contract import read_manifest
from tests.test_sharding import shard


@pytest.mark.parametrize("image_format", ["raw", "jpeg"])
def test_pixels_labels_and_keys_round_trip(tmp_path, image_folder, image_format):
    out = str(tmp_path / "out")
    shard(image_folder, out, image_size=24, image_format=image_format, min_shards_per_split=3)
    manifest = read_manifest(out)
    seen = {}
    for split in ("train", "validation", "test"):
        # Fast shards first (training's order) still yields each example once.
        keyed = list(make_dataset(out, split, with_keys=True, deterministic=False)
                     .as_numpy_iterator())
        seen.update((key.decode(), (image, label)) for image, label, key in keyed)
        count = manifest["splits"][split]["count"]
        assert len(keyed) == sum(1 for _ in make_dataset(out, split)) == count
    assert len(seen) == manifest["written"] == 36
    for path, (image, label) in seen.items():
        with open(os.path.join(image_folder, path), "rb") as f:
            expected = np.asarray(images.resize(images.decode_image(f.read(), 24), 24, "crop"))
        assert label == manifest["label_map"][path.split("/")[0]]
        assert image.shape == (24, 24, 3) and image.dtype == np.uint8
        if image_format == "raw":
            np.testing.assert_array_equal(image, expected)
        else:  # JPEG is lossy (noise, chroma subsampling): close, far from another class
            assert np.abs(image.astype(int) - expected).mean() < 12


def test_incomplete_dataset_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a complete sharded dataset"):
        read_manifest(str(tmp_path))
