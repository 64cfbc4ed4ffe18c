"""The workshop: what serves this repository and its tests, never a user's run.

Nothing here is in the wheel or the images; the product (components, pipelines, compile.py)
imports none of it (tests/test_structure.py).
"""
