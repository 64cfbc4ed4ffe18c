"""Every test id is the same in every collection: xdist refuses a run whose workers differ."""

import pathlib

import pytest

from tools import collection_check

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A tiny suite's ids that carry the clock (gzip's header time) or hash order (a set), and
# the same cases with fixed ids.
MOVING = ('import gzip\nimport pytest\n\n@pytest.mark.parametrize("raw", '
          '[gzip.compress(b"text")])\ndef test_clock(raw):\n    pass\n\n'
          '@pytest.mark.parametrize("name", {"alpha", "beta", "gamma", "delta", "epsilon"})\n'
          'def test_hash_order(name):\n    pass\n')
FIXED = ('import gzip\nimport pytest\n\n@pytest.mark.parametrize("raw", '
         '[gzip.compress(b"text", mtime=0)], ids=["gzip"])\ndef test_clock(raw):\n    pass\n\n'
         '@pytest.mark.parametrize("name", sorted({"alpha", "beta", "gamma"}))\n'
         'def test_hash_order(name):\n    pass\n')


@pytest.mark.parametrize("source, moving", [(MOVING, ("test_clock", "test_hash_order")),
                                            (FIXED, ())], ids=["moving", "fixed"])
def test_the_check_finds_ids_that_carry_the_clock_or_hash_order(tmp_path, source, moving):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_ids.py").write_text(source)
    found = collection_check.differences(["test_ids.py"], gap=1.1, cwd=str(tmp_path))
    assert {test for test in moving if any(f"::{test}[" in line for line in found)} == \
        set(moving), found  # the clock's id is only in one, the set's in another order
    assert bool(found) == bool(moving)


def test_a_collection_that_fails_is_named(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n")
    with pytest.raises(RuntimeError, match="(?s)PYTHONHASHSEED=1 failed.*no_such_module_here"):
        collection_check.differences(["test_broken.py"], gap=0, cwd=str(tmp_path))


@pytest.mark.slow
def test_the_suite_collects_the_same_ids_under_two_hash_seeds_seconds_apart():
    """The whole suite, fast tier and slow (~35 s: two collections at once)."""
    assert collection_check.differences(["tests"], cwd=str(ROOT)) == []
