"""The text evaluation's contract: what it refuses in its settings."""

from components.evaluate_image.contract import settings_problems as batch_problems
from components.prepare_text.contract import SPLITS


def settings_problems(split: str, batch_size: int, prefix: str = "") -> list[str]:
    """What the text evaluation refuses in its settings, each named `prefix` + its input
    (the pipeline's name: "eval_"); empty when fine."""
    problems = batch_problems(batch_size, prefix)
    if split not in SPLITS:
        problems.append(f"{prefix}split must be one of {list(SPLITS)}, got {split!r}")
    return problems
