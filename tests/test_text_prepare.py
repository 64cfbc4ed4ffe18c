"""Text preparation: CSV validation with errors naming columns and rows, label forms, splits."""

import json

import pandas as pd
import pytest

from components.prepare_text import contract, preparation
from components.prepare_text.preparation import PrepareConfig, TextDataError, prepare_text_dataset
from tools.datamakers.demo_text import LABEL_WORDS, write_reviews_csv


def _csv(tmp_path, text: str, name: str = "data.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_one_hot_csv_is_split_with_manifest(tmp_path):
    data = str(tmp_path / "reviews.csv")
    counts = write_reviews_csv(data, rows=80, seed=3)
    manifest = prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig(seed=5))
    assert manifest["task"] == "multi_label"
    assert manifest["labels"] == [*LABEL_WORDS, "other"]
    assert manifest["given_other"] == counts["none"]
    assert manifest["rows_in"] == manifest["rows_kept"] == 80
    sizes = {s: v["rows"] for s, v in manifest["splits"].items()}
    assert sizes == {"test": 20, "validation": 12, "train": 48}  # 25% of all, then 20% of the rest
    frames = {s: contract.read_split(str(tmp_path / "out"), s) for s in contract.SPLITS}
    assert list(frames["train"].columns) == ["text", *manifest["labels"]]
    assert sum(len(f) for f in frames.values()) == 80
    assert len(pd.concat(frames.values())["text"].unique()) == len(
        pd.read_csv(data)["text"].unique())
    # each row has at least one label once "other" is added
    assert (frames["train"][manifest["labels"]].sum(axis=1) >= 1).all()
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk == manifest


def test_same_seed_same_split_other_seed_other_split(tmp_path):
    data = str(tmp_path / "reviews.csv")
    write_reviews_csv(data, rows=40)
    a = prepare_text_dataset(data, str(tmp_path / "a"), PrepareConfig(seed=1))
    b = prepare_text_dataset(data, str(tmp_path / "b"), PrepareConfig(seed=1))
    prepare_text_dataset(data, str(tmp_path / "c"), PrepareConfig(seed=2))
    assert a["splits"] == b["splits"]

    def read(d):
        return (tmp_path / d / "test.csv").read_text()

    assert read("a") == read("b") != read("c")


def test_true_false_values_and_explicit_label_columns(tmp_path):
    data = _csv(tmp_path, "id,review,spam,urgent\n"
                          "1,win money now,True,false\n2,meeting at noon,FALSE,TRUE\n"
                          "3,free prize,true,0\n4,call me,False,1\n5,lunch?,0,0\n"
                          "6,cheap pills,1,1\n")
    data, info = preparation.normalize(
        preparation.read_csv(data),
        PrepareConfig(text_column="review", label_columns=("spam", "urgent")))
    assert info["label_source"] == "one_hot"
    assert info["labels"] == ["spam", "urgent", "other"]
    assert data["spam"].tolist() == [1, 0, 1, 0, 0, 1]
    assert data["urgent"].tolist() == [0, 1, 0, 1, 0, 1]
    assert data["other"].tolist() == [0, 0, 0, 0, 1, 0]
    assert info["task"] == "multi_label"  # row 6 has two labels


def test_class_name_column_single_and_multi_label(tmp_path):
    single = _csv(tmp_path, "text,label\ngood,pos\nbad,neg\nfine,pos\n,neg\nmeh,\n", "s.csv")
    data, info = preparation.normalize(preparation.read_csv(single), PrepareConfig())
    assert info["label_source"] == "class_names" and info["task"] == "single_label"
    assert info["labels"] == ["neg", "pos", "other"]
    assert info["dropped"]["empty_text"] == {"count": 1, "rows": [4]}
    assert info["given_other"] == 1 and data.loc[4, "other"] == 1

    multi = _csv(tmp_path, 'text,tags\n"a b",x|y\nc,y\nd,z| x\n', "m.csv")
    data, info = preparation.normalize(preparation.read_csv(multi),
                                       PrepareConfig(label_delimiter="|"))
    assert info["task"] == "multi_label" and info["labels"] == ["x", "y", "z"]
    assert data[["x", "y", "z"]].to_numpy().tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 1]]


@pytest.mark.parametrize("header, labels, match", [
    ("review,a,b", (), r"has no column 'text' \(its header: \['review'"),
    ("text,a,b", ("a", "c"), r"has no column 'c' .*set label_columns"),
])
def test_a_missing_text_or_label_column_is_named(tmp_path, header, labels, match):
    data = _csv(tmp_path, f"{header}\nhello,1,0\n")
    with pytest.raises(TextDataError, match=match):
        prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig(label_columns=labels))


def test_bad_label_values_name_column_and_rows(tmp_path):
    data = _csv(tmp_path, "text,a,b\nt1,1,0\nt2,yes,1\nt3,0,1\nt4,2,0\nt5,,1\n")
    with pytest.raises(TextDataError) as err:
        prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig())
    message = str(err.value)
    assert "label column 'a'" in message and "0/1 or True/False" in message
    assert "'yes' at row 2" in message and "'2' at row 4" in message
    assert "'' at row 5" in message and "(3 rows)" in message


def test_cells_that_are_not_text_are_dropped_and_counted_and_a_binary_file_refused(tmp_path):
    rows = ["text,a,b"] + [f"text number {i},{i % 2},{1 - i % 2}" for i in range(40)]
    rows[5] = "\x01\x02\x03,1,0"  # a cell of control characters: text to pandas
    data = _csv(tmp_path, "\n".join(rows) + "\n")
    manifest = prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig())
    assert manifest["dropped"]["not_text"] == {"count": 1, "rows": [5]}
    assert manifest["rows_kept"] == 39
    path = tmp_path / "binary.csv"
    path.write_bytes(b"text,a\n" + b"\0" * 500)
    with pytest.raises(TextDataError, match=r"no usable row: 1 rows in, 0 dropped for empty "
                                            r"text, 1 dropped for not text"):
        prepare_text_dataset(str(path), str(tmp_path / "out2"), PrepareConfig())
    path.write_bytes("text,a\nun café,1\n".encode("cp1252"))
    with pytest.raises(TextDataError, match="is not UTF-8 text: byte 0xe9 at offset 13"):
        prepare_text_dataset(str(path), str(tmp_path / "out3"), PrepareConfig())
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists()


def test_empty_texts_are_dropped_and_counted(tmp_path):
    rows = ["text,a,b"] + [f"text number {i},{i % 2},{1 - i % 2}" for i in range(20)]
    rows[3] = ",1,0"          # empty
    rows[7] = '"   ",0,1'     # blank
    data = _csv(tmp_path, "\n".join(rows) + "\n")
    manifest = prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig())
    assert manifest["dropped"]["empty_text"] == {"count": 2, "rows": [3, 7]}
    assert manifest["rows_in"] == 20 and manifest["rows_kept"] == 18
    assert manifest["task"] == "single_label" and manifest["labels"] == ["a", "b"]
    # single-label data is split class by class
    for split in manifest["splits"].values():
        assert min(split["label_counts"].values()) >= 1


def test_rows_without_label_are_dropped_when_other_is_empty(tmp_path):
    data = _csv(tmp_path, "text,a,b\nx,1,0\ny,0,0\nz,0,1\nw,1,0\nv,0,1\n")
    _, info = preparation.normalize(preparation.read_csv(data), PrepareConfig(other_label=""))
    assert info["dropped"]["no_label"] == {"count": 1, "rows": [2]}
    assert info["labels"] == ["a", "b"]


def test_nothing_usable_or_too_few_rows_is_an_error(tmp_path):
    empty = _csv(tmp_path, "text,a\n,1\n  ,0\n", "e.csv")
    with pytest.raises(TextDataError, match="no usable row: 2 rows in, 2 dropped for empty text"):
        prepare_text_dataset(empty, str(tmp_path / "o1"), PrepareConfig())
    tiny = _csv(tmp_path, "text,label\nx,a\ny,b\n", "t.csv")
    with pytest.raises(TextDataError, match="split is empty"):
        prepare_text_dataset(tiny, str(tmp_path / "o2"), PrepareConfig())
    with pytest.raises(TextDataError, match="does not exist"):
        prepare_text_dataset(str(tmp_path / "nope.csv"), str(tmp_path / "o3"), PrepareConfig())
    with pytest.raises(TextDataError, match="is a folder; give the CSV file inside it"):
        prepare_text_dataset(str(tmp_path), str(tmp_path / "o4"), PrepareConfig())
    with pytest.raises(TextDataError, match="validation_fraction"):
        PrepareConfig(validation_fraction=0)


def test_parse_label_columns():
    assert contract.parse_label_columns("") == ()
    assert contract.parse_label_columns(" a, b ,,c") == ("a", "b", "c")


def test_reads_a_gs_csv(gcs, tmp_path):
    local = str(tmp_path / "reviews.csv")
    write_reviews_csv(local, rows=30)
    gcs.create_bucket("text-data").blob("in/reviews.csv").upload_from_filename(local)
    remote = prepare_text_dataset("gs://text-data/in/reviews.csv", str(tmp_path / "r"),
                                  PrepareConfig())
    here = prepare_text_dataset(local, str(tmp_path / "h"), PrepareConfig())
    assert remote["source"] == "gs://text-data/in/reviews.csv"
    assert remote["splits"] == here["splits"]
    with pytest.raises(TextDataError, match="gs://text-data/in/missing.csv does not exist"):
        preparation.read_csv("gs://text-data/in/missing.csv")


@pytest.mark.parametrize("header, repeated", [
    ("text,price,price", "price"),
    ("text,label,text", "text"),
])
def test_repeated_column_names_are_refused_by_name(tmp_path, header, repeated):
    data = _csv(tmp_path, header + "\nt1,1,0\nt2,0,1\n")
    with pytest.raises(TextDataError) as err:
        prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig())
    assert f"column name(s) ['{repeated}'] appear more than once" in str(err.value)
    assert "rename them" in str(err.value)


@pytest.mark.parametrize("odd, named", [
    (["t40,2", "t41,yes"], "'2' at row 41.*'yes' at row 42"),
    # Missing cells do not turn a binary column into the class names "0" and "1".
    (["t40,NaN", "t41,NaN"], "'NaN' at row 41"),
], ids=["typos", "missing markers"])
def test_a_single_binary_column_with_typos_or_missing_markers_names_the_rows(tmp_path, odd,
                                                                            named):
    rows = [f"t{i},{i % 2}" for i in range(40)] + odd
    data = _csv(tmp_path, "text,spam\n" + "\n".join(rows) + "\n")
    with pytest.raises(TextDataError, match="label column 'spam' holds values other than 0/1.*"
                                            + named):
        prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig())


def test_class_names_that_are_digits_stay_class_names(tmp_path):
    # Class names that happen to be digits, evenly spread, stay class names.
    digits = _csv(tmp_path, "text,rating\n" + "\n".join(f"t{i},{i % 3}" for i in range(30)) + "\n",
                  name="digits.csv")
    manifest = prepare_text_dataset(digits, str(tmp_path / "out2"), PrepareConfig())
    assert manifest["labels"] == ["0", "1", "2"] and manifest["task"] == "single_label"


def test_missing_label_markers_are_dropped_and_counted_not_a_class(tmp_path):
    # "NaN", "NA", "null" are how tools write a missing value: not a class called "NaN".
    rows = [f"text {i},{'pos' if i % 2 else 'neg'}" for i in range(20)]
    rows[2], rows[4], rows[7] = "text 2,NaN", 'text 4," NA "', "text 7,null"
    rows[9] = ",NaN"  # empty text too: counted once, as empty text
    data = _csv(tmp_path, "text,label\n" + "\n".join(rows) + "\n")
    manifest = prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig())
    assert manifest["labels"] == ["neg", "pos"]
    assert manifest["dropped"]["missing_label"] == {"count": 3, "rows": [3, 5, 8]}
    assert manifest["dropped"]["empty_text"] == {"count": 1, "rows": [10]}
    assert manifest["rows_kept"] == 16 and manifest["given_other"] == 0
    # An empty cell still means "no label": the other label, as documented.
    _, info = preparation.normalize(
        preparation.read_csv(_csv(tmp_path, "text,label\na,x\nb,\nc,NaN\n", "e.csv")),
        PrepareConfig())
    assert info["given_other"] == 1 and info["labels"] == ["x", "other"]
    assert info["dropped"]["missing_label"] == {"count": 1, "rows": [3]}


@pytest.mark.parametrize("other", [";", "|"])
def test_labels_joined_by_another_delimiter_are_refused(tmp_path, other):
    rows = ["a,food{0}tech", "b,food", "c,tech{0}sport", "d,sport", "e,food"]
    data = _csv(tmp_path, "text,topics\n" + "\n".join(r.format(other) for r in rows) + "\n")
    with pytest.raises(TextDataError) as err:
        preparation.normalize(preparation.read_csv(data), PrepareConfig())
    message = str(err.value)
    assert "label column 'topics'" in message and f"'food{other}tech' at row 1" in message
    assert f"label_delimiter={other!r}" in message and "label_delimiter=''" in message
    # Told the delimiter, the same file is multi-label.
    _, info = preparation.normalize(preparation.read_csv(data),
                                    PrepareConfig(label_delimiter=other))
    assert info["labels"] == ["food", "sport", "tech"] and info["task"] == "multi_label"
    # label_delimiter='' keeps class names whole (a class may contain the character).
    _, info = preparation.normalize(preparation.read_csv(data), PrepareConfig(label_delimiter=""))
    assert f"food{other}tech" in info["labels"] and info["task"] == "single_label"


def test_a_label_column_mixing_delimiters_is_refused_naming_the_rows(tmp_path):
    """Before, "," in some cells made "," the delimiter and "delivery;price" a class of
    its own, without a word."""
    data = _csv(tmp_path, 'text,tags\na,"delivery;price"\nb,price\nc,"price,quality"\n'
                          'd,"quality|delivery"\n')
    with pytest.raises(TextDataError) as err:
        preparation.normalize(preparation.read_csv(data), PrepareConfig())
    message = str(err.value)
    assert "label column 'tags': 1 value(s) hold ';': 'delivery;price' at row 1" in message
    assert "1 value(s) hold '|': 'quality|delivery' at row 4" in message
    assert "(1 hold ',')" in message and "label_delimiter=','" in message


def test_a_class_name_with_another_delimiter_passes_when_the_delimiter_is_declared(tmp_path):
    data = _csv(tmp_path, 'text,tags\na,"r&d;ops,sales"\nb,sales\nc,"sales,hr"\n')
    with pytest.raises(TextDataError, match="'r&d;ops,sales' at row 1"):
        preparation.normalize(preparation.read_csv(data), PrepareConfig())
    _, info = preparation.normalize(preparation.read_csv(data),
                                    PrepareConfig(label_delimiter=","))
    assert info["labels"] == ["hr", "r&d;ops", "sales"]
    assert info["label_delimiter_used"] == ","


def test_duplicate_texts_stay_in_one_split_and_are_counted_with_their_conflicts(tmp_path):
    """Before, copies of a text landed on both sides of the split: a test set that the
    model (and TF-IDF) had seen in training."""
    rows = []
    for i in range(60):
        text = f"review number {i} of the shop"
        rows.append(f"{text},{'price' if i % 2 else 'delivery'}")
        if i % 3 == 0:  # a copy, changed in case and spacing only
            rows.append(f"  {text.upper()}  ,{'price' if i % 2 else 'delivery'}")
    rows.append("review number 0 of the shop,price")  # a copy with another label
    data = _csv(tmp_path, "text,topic\n" + "\n".join(rows) + "\n")
    manifest = prepare_text_dataset(data, str(tmp_path / "out"), PrepareConfig(seed=3))

    def folded(split):
        frame = pd.read_csv(tmp_path / "out" / f"{split}.csv", keep_default_na=False)
        return {" ".join(t.split()).casefold() for t in frame["text"]}

    train, valid, test = folded("train"), folded("validation"), folded("test")
    assert not (train & test) and not (train & valid) and not (valid & test)
    assert manifest["duplicate_texts"]["rows"] == 20 + 21  # 20 texts twice, one thrice
    assert manifest["duplicate_texts"]["texts"] == 20
    assert manifest["duplicate_texts"]["conflicting_labels"] == {"count": 3, "rows": [1, 2, 81]}
    assert manifest["split_rule"]["version"] == 2
    assert sum(manifest["splits"][s]["rows"] for s in ("train", "validation", "test")) == 81
