"""The descriptions of input kinds: what text is (common.input_kinds), and which trained
model folder a folder is (predict.contract.MODEL_FOLDERS)."""

import gzip
import itertools

import pytest

from components.common.input_kinds import (
    FolderKindError,
    NotTextError,
    decode_text,
    text_problem,
)
from components.predict.contract import model_folder_kind

IMAGE = {"model.keras", "labels.json", "preprocessing.json", "history.json"}
FASTAI = {"export.pkl", "labels.json", "metrics.json", "per_label_metrics.json"}
TRANSFORMER = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "labels.json", "metrics.json"}
WHOLE = {"image": IMAGE, "fastai": FASTAI, "transformer": TRANSFORMER}
REQUIRED = {"image": ["model.keras", "labels.json", "preprocessing.json"],
            "fastai": ["export.pkl", "labels.json"],
            "transformer": ["config.json", "model.safetensors", "tokenizer.json", "labels.json"]}


@pytest.mark.parametrize("kind,files", [  # sharded weights count as weights
    *WHOLE.items(),
    ("transformer", TRANSFORMER - {"model.safetensors"} | {"model.safetensors.index.json"})])
def test_a_whole_model_folder_is_its_kind(kind, files):
    assert model_folder_kind("model", files) == kind


@pytest.mark.parametrize("kind,missing", [(k, set(gone)) for k, names in REQUIRED.items()
                                          for r in (1, 2)
                                          for gone in itertools.combinations(names, r)])
def test_a_folder_missing_required_files_is_told_which(kind, missing):
    with pytest.raises(FolderKindError) as err:  # without a mark left too (fastai's export.pkl)
        model_folder_kind("model_uri 'gs://b/m'", WHOLE[kind] - missing)
    message = str(err.value)
    assert "model_uri 'gs://b/m'" in message and any(name in message for name in missing)
    assert "neither" not in message  # named, not guessed at as another kind


@pytest.mark.parametrize("files,said", [
    ({"lm_metrics.json", "en"}, "language model assets"),
    ({"manifest.json", "train-00000-of-00001.tfrecord"}, "dataset"),
    (set(), "holds nothing"),
    ({"notes.txt", "a.csv"}, "holds a.csv, notes.txt"),
])
def test_a_folder_of_another_kind_is_named_as_what_it_is(files, said):
    with pytest.raises(FolderKindError, match=said):
        model_folder_kind("m", files)


def test_text_passes_with_its_own_control_characters_and_a_cell_is_held_alone():
    text = "Chapter 1\r\n\tIt was a dark night.\x0c\nChapter 2\x0b" + "é" * 50
    assert decode_text(("\ufeff" + text).encode("utf-8"), "f.txt") == text
    assert text_problem(text) == ""
    long = "word " * 2000 + "\x1b"  # one stray escape in 10,000 characters
    assert decode_text(long.encode(), "f.txt") == long
    assert text_problem("") == "" and text_problem("plain") == ""
    assert "NUL" in text_problem("abc\0def" + "x" * 10_000)  # a cell of a CSV
    assert "control characters" in text_problem("\x07" * 5 + "abc")


@pytest.mark.parametrize("raw,offset,said", [
    (b"\0" * 20_000, 0, "control characters"),
    ("hello world".encode("utf-16"), 0, "UTF-16"),
    ("hello world, long enough".encode("utf-16-le"), 1, "UTF-16 text without a byte-order"),
    ("café au lait".encode("latin-1"), 3, "not UTF-8"),
    (gzip.compress(b"some text " * 100, mtime=0), 1, "gzip"),
    (b"abc" + bytes(range(1, 32)) * 3, 3, "control characters"),
], ids=["nul", "utf-16", "utf-16-without-bom", "latin-1", "gzip", "controls"])
def test_bytes_that_are_not_text_are_refused_naming_file_and_offset(raw, offset, said):
    with pytest.raises(NotTextError) as err:
        decode_text(raw, "corpus file 'a.txt'")
    message = str(err.value)
    assert "corpus file 'a.txt'" in message and said in message
    assert f"offset {offset}" in message


@pytest.mark.parametrize("separator,said", [("\t", "tabs"), (";", "';'"), ("|", "'|'")])
def test_a_csv_of_another_separator_is_named_by_every_reader(tmp_path, separator, said):
    """A spreadsheet's ';' export or a TSV reads as one column: each reader says why, in
    the same words (one check, `csv_header`)."""
    from components.predict.contract import PredictionError
    from components.predict.prediction import _read_csv_chunks
    from components.preflight.data import check_corpus, check_predict_uri
    from components.preflight.parameters import PreflightError
    from components.prepare_text.contract import PrepareConfig
    from components.prepare_text.preparation import TextDataError, prepare_text_dataset
    from components.train_lm.contract import LMTrainingError
    from components.train_lm.corpus import read_corpus

    path = tmp_path / "data.csv"
    path.write_text(f"text{separator}label\nhello there{separator}pos\nbad day{separator}neg\n")
    hint, messages = f"looks separated by {said}, not commas", set()
    for call, error in [
            (lambda: prepare_text_dataset(str(path), str(tmp_path / "o"), PrepareConfig()),
             TextDataError),
            (lambda: check_predict_uri(str(path), "text"), PreflightError),
            (lambda: list(_read_csv_chunks(str(path), "text")), PredictionError),
            (lambda: check_corpus(str(path), "text"), PreflightError),
            (lambda: read_corpus(str(path)), LMTrainingError)]:
        with pytest.raises(error, match=hint) as err:
            call()
        messages.add(str(err.value).split(" has no column ", 1)[1])
    assert len(messages) == 1, messages
    path.write_text("text,label\nhello; there,pos\nbad day,neg\n")  # commas: no hint
    with pytest.raises(PreflightError) as err:
        check_predict_uri(str(path), "text", "body")
    assert "looks separated" not in str(err.value)


def test_an_image_pipeline_given_a_file_says_it_wants_a_folder_of_class_folders(tmp_path):
    from components.shard.contract import ShardingError
    from components.shard.sharding import list_labelled_files

    (tmp_path / "texts.csv").write_text("text,label\nhello,a\n")
    with pytest.raises(ShardingError, match="is a file, not a folder of class folders"):
        list_labelled_files(str(tmp_path / "texts.csv"))
    with pytest.raises(ShardingError, match="does not exist"):
        list_labelled_files(str(tmp_path / "nothing"))


def test_a_model_given_one_folder_too_high_names_its_sub_folders(tmp_path):
    """Language model assets without lm_metrics.json, or a run's output folder: files one
    level down are not the model's."""
    from components.predict.contract import PredictionError, model_family

    (tmp_path / "en" / "forward").mkdir(parents=True)
    (tmp_path / "en" / "forward" / "weights.pth").write_bytes(b"w")
    with pytest.raises(PredictionError, match=r"it holds nothing\. .* Its sub-folders \(en\) are "
                                              r"not read: a model folder holds its files"):
        model_family(str(tmp_path))


def test_a_model_folder_lists_linked_files_and_no_folder_named_like_a_file(tmp_path):
    """`folder_files`, the one listing of the preflight, the trainer and prediction (held to
    it on gs:// in tests/test_gcs_input.py): a file linked in (as the Hub's cache links its
    snapshots) is a file, a folder named like a file is not that file."""
    from components.common.input_kinds import folder_files

    model = tmp_path / "encoder"
    (model / "tokenizer.json").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (tmp_path / "blob").write_bytes(b"w")
    (model / "model.safetensors").symlink_to(tmp_path / "blob")
    assert folder_files(str(model)) == {"config.json", "model.safetensors"}
    assert folder_files(str(model / "config.json")) == set()
