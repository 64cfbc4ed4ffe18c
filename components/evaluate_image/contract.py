"""The image evaluation's contract: what it refuses in its settings."""


def settings_problems(batch_size: int, prefix: str = "") -> list[str]:
    """What the image evaluation refuses in its settings, each named `prefix` + its input
    (the pipeline's name: "eval_"); empty when fine."""
    return [] if batch_size >= 1 else [f"{prefix}batch_size must be >= 1, got {batch_size}"]
