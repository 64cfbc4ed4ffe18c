"""The Debian package-description corpus (tools.datamakers.debian_corpus), from an index excerpt."""

import pandas as pd
import pytest

from tools.datamakers import debian_corpus

INDEX = """Package: vlc-bin
Source: vlc
Description: binaries from the VLC media player
Tag: role::program, works-with::video
Section: video

Package: vlc-plugin-base
Source: vlc
Description: multimedia player and streamer (base plugins)
Tag: works-with::audio,
 works-with::image:raster
Section: video

Package: zstd
Description: fast lossless compression algorithm -- CLI tool
Tag: works-with::archive, works-with::file
Section: utils

Package: hello
Description: example package based on GNU hello
Tag: role::program
Section: devel

Package: untagged
Description: no debtags at all
Section: misc
"""


def test_one_row_per_source_with_the_labels_of_all_its_binaries(tmp_path):
    index = tmp_path / "Packages"
    index.write_text(INDEX)
    counts = debian_corpus.write_debian_corpus(str(tmp_path / "debian.csv"), str(index))
    frame = pd.read_csv(tmp_path / "debian.csv")
    assert list(frame.columns) == ["description", *debian_corpus.LABEL_NAMES]
    # vlc: its first tagged binary's text, video + audio + image (raster folds into image);
    # hello has no works-with tag of the eight and is left out, as is the untagged package
    assert frame.description.tolist() == ["binaries from the VLC media player",
                                          "fast lossless compression algorithm -- CLI tool"]
    vlc, zstd = frame.iloc[0], frame.iloc[1]
    assert {n for n in debian_corpus.LABEL_NAMES if vlc[n]} == {"video", "audio", "image"}
    assert {n for n in debian_corpus.LABEL_NAMES if zstd[n]} == {"archive"}
    assert counts["rows"] == 2 and counts["video"] == 1


def test_no_index_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(debian_corpus, "APT_LISTS", str(tmp_path))
    assert debian_corpus.find_package_index(str(tmp_path)) is None
    with pytest.raises(FileNotFoundError, match="apt-get update"):
        debian_corpus.write_debian_corpus(str(tmp_path / "out.csv"))


def test_the_language_model_corpus_leaves_the_tasks_packages_out(tmp_path):
    index = tmp_path / "Packages"
    # hello's twin says what zstd's row says; vlc-doc is a binary of a task source
    index.write_text(INDEX + """
Package: vlc-doc
Source: vlc (3.0)
Description: documentation of the VLC media player

Package: hello-twin
Source: hello
Description: fast lossless compression algorithm -- CLI tool

Package: hello-dbg
Source: hello
Description: example package based on GNU hello
""")
    counts = debian_corpus.write_lm_corpus(str(tmp_path / "lm.csv"), str(index))
    texts = pd.read_csv(tmp_path / "lm.csv")["text"].tolist()
    # every vlc and zstd binary (task rows) goes, and the text equal to zstd's row; the
    # rest once each, in index order
    assert texts == ["example package based on GNU hello", "no debtags at all"]
    assert counts == {"documents": 2, "words": 10, "held_out": 5}


def test_by_section_one_label_each_from_the_same_packages(tmp_path):
    index = tmp_path / "Packages"
    index.write_text(INDEX + """
Package: gimp
Description: GNU Image Manipulation Program
Tag: works-with::image:raster
Section: graphics

Package: sox
Description: Swiss army knife of sound processing
Tag: works-with::audio
Section: sound

Package: lame
Description: MP3 encoding library
Tag: works-with::audio
Section: sound
""")
    rows, names = debian_corpus.section_rows(index.read_text(), sections=2)
    # the two largest sections among the tagged packages (sound 2; graphics, utils and
    # video 1 each: the tie goes to the first name); hello (no works-with tag) never counts
    assert names == ["sound", "graphics"]
    assert [(r["description"], r["sound"], r["graphics"]) for r in rows] == [
        ("GNU Image Manipulation Program", 0, 1),
        ("Swiss army knife of sound processing", 1, 0),
        ("MP3 encoding library", 1, 0)]
    counts = debian_corpus.write_debian_corpus(str(tmp_path / "s.csv"), str(index), by="section")
    frame = pd.read_csv(tmp_path / "s.csv")
    assert list(frame.columns) == ["description", "sound", "graphics", "utils", "video"]
    assert (frame.drop(columns="description").sum(axis=1) == 1).all()
    assert counts["rows"] == len(frame) == 5
    with pytest.raises(ValueError, match="by must be one of"):
        debian_corpus.write_debian_corpus(str(tmp_path / "x.csv"), str(index), by="priority")


def test_task_sources_name_the_labelled_rows_packages_by_source():
    # vlc's binaries carry works-with tags, zstd's too; hello's tags name no kind of data
    assert debian_corpus.task_sources(INDEX) == {"vlc", "zstd"}
