"""bench/text_seeds.py's gates: the worst margins over the seeds and what they miss (the runs
themselves are the bench's, minutes a seed)."""

import pytest

from bench import text_seeds


def _row(micro, tfidf, constant):
    return {"micro_f1": micro, "tfidf_micro_f1": tfidf, "constant_micro_f1": constant}


def test_the_worst_seed_decides_each_margin():
    rows = [_row(0.74, 0.78, 0.26), _row(0.70, 0.76, 0.25), _row(0.73, 0.75, 0.25)]
    over, to_tfidf, missed = text_seeds.margins(rows, over_every_label=0.25)
    assert over == pytest.approx(0.45) and to_tfidf == pytest.approx(-0.06)
    assert missed == []
    _, _, missed = text_seeds.margins(rows, over_every_label=0.46, over_tfidf=-0.05)
    assert missed == ["over every label +0.450 < +0.460", "over TF-IDF -0.060 < -0.050"]


def test_a_tie_with_tfidf_is_no_win():
    assert text_seeds.margins([_row(0.70, 0.70, 0.25)], over_tfidf=0)[2] == [
        "over TF-IDF +0.000 < +0.000"]
    assert text_seeds.margins([_row(0.71, 0.70, 0.25)], over_tfidf=0)[2] == []
    assert text_seeds.margins([_row(0.20, 0.70, 0.25)])[2] == []  # no gate asked
