"""Search spaces of hyperparameter tuning, one for both searches (the Vertex tuning job's
study spec and the local optuna search). A space file is JSON:

    {"metric": "val_accuracy", "goal": "maximize",
     "parameters": {
        "learning_rate": {"type": "double", "min": 1e-4, "max": 1e-2, "scale": "log"},
        "batch_size": {"type": "discrete", "values": [16, 32, 64]},
        "unfreeze_blocks": {"type": "integer", "min": 1, "max": 3}}}

Types are Vertex's numeric ones (every tunable parameter, `TUNABLE`, is a number).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from components.common.values import coerce as coerce_value

GOALS = ("maximize", "minimize")
SCALES = ("linear", "log")
PARAMETER_TYPES = ("double", "integer", "discrete")

# Trainer parameters a study may search (and the best-trial steps return), per kind.
TUNABLE: Mapping[str, Mapping[str, type]] = {
    "image": {"learning_rate": float, "fine_tune_learning_rate": float, "dropout": float,
              "batch_size": int, "unfreeze_blocks": int},
    "text": {"learning_rate": float, "lm_learning_rate": float, "drop_mult": float,
             "batch_size": int},
    "transformer": {"learning_rate": float, "batch_size": int, "warmup_ratio": float,
                    "weight_decay": float},
}
# Epoch values each trainer reports to hypertune (fastai's f1_score: the macro F1).
REPORTED_METRICS: Mapping[str, tuple[str, ...]] = {
    "image": ("val_accuracy", "val_loss", "accuracy", "loss"),
    "text": ("f1_score", "valid_loss", "accuracy", "accuracy_multi", "train_loss"),
    "transformer": ("micro_f1", "f1_score", "valid_loss", "accuracy", "accuracy_multi"),
}

DEFAULT_SPACES: Mapping[str, Mapping[str, Any]] = {
    # Rates around the trainer's defaults (1e-3, 1e-4), unfreezing, dropout, the batch.
    "image": {
        "metric": "val_accuracy", "goal": "maximize",
        "parameters": {
            "learning_rate": {"type": "double", "min": 1e-4, "max": 1e-2, "scale": "log"},
            "fine_tune_learning_rate": {"type": "double", "min": 1e-5, "max": 1e-3,
                                        "scale": "log"},
            "dropout": {"type": "double", "min": 0.0, "max": 0.5, "scale": "linear"},
            "batch_size": {"type": "discrete", "values": [16, 32, 64]},
            "unfreeze_blocks": {"type": "integer", "min": 1, "max": 3, "scale": "linear"},
        },
    },
    # A fixed rate instead of lr_find's guess, the LM rate, AWD-LSTM dropout, the batch.
    "text": {
        "metric": "f1_score", "goal": "maximize",
        "parameters": {
            "learning_rate": {"type": "double", "min": 1e-3, "max": 5e-2, "scale": "log"},
            "lm_learning_rate": {"type": "double", "min": 5e-4, "max": 1e-2, "scale": "log"},
            "drop_mult": {"type": "double", "min": 0.1, "max": 0.8, "scale": "linear"},
            "batch_size": {"type": "discrete", "values": [16, 32, 64]},
        },
    },
    # Rates around 5e-5, the batch (a T4 holds 32 texts of 256 tokens), the warmup.
    "transformer": {
        "metric": "micro_f1", "goal": "maximize",
        "parameters": {
            "learning_rate": {"type": "double", "min": 1e-5, "max": 1e-4, "scale": "log"},
            "batch_size": {"type": "discrete", "values": [16, 32]},
            "warmup_ratio": {"type": "double", "min": 0.0, "max": 0.2, "scale": "linear"},
        },
    },
}


class SearchSpaceError(ValueError):
    """A search space that no study could run; the message names the entry to fix."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One searched parameter: bounds and scale (double, integer) or values (discrete)."""

    name: str
    type: str
    min: float | None = None
    max: float | None = None
    scale: str = "linear"
    values: tuple = ()


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """What a study of `kind` searches (`parameters`, in the file's order) and how it
    ranks trials (`metric`, of `REPORTED_METRICS[kind]`, and `goal`)."""

    kind: str
    metric: str
    goal: str
    parameters: tuple[Parameter, ...]

    def names(self) -> list[str]:
        """Names of the searched parameters."""
        return [p.name for p in self.parameters]

    def to_json(self) -> dict[str, Any]:
        """The space as a space file holds it."""
        return {"metric": self.metric, "goal": self.goal,
                "parameters": {p.name: _parameter_json(p) for p in self.parameters}}


def _parameter_json(p: Parameter) -> dict[str, Any]:
    if p.type == "discrete":
        return {"type": p.type, "values": list(p.values)}
    return {"type": p.type, "min": p.min, "max": p.max, "scale": p.scale}


def parse_space(kind: str, data: Mapping[str, Any], source: str = "search space") -> SearchSpace:
    """Checks a space file's content and returns the space.

    Args:
        kind: "image", "text" or "transformer" (which trainer the trials run).
        data: The parsed JSON object.
        source: Names the file in messages.

    Returns:
        The search space.

    Raises:
        SearchSpaceError: What no study could run (or the trainer refuses), named.
    """
    if kind not in TUNABLE:
        raise SearchSpaceError(f"unknown pipeline kind {kind!r}; one of {sorted(TUNABLE)}")
    if not isinstance(data, Mapping):
        raise SearchSpaceError(f"{source}: expected a JSON object with metric, goal, parameters")
    unknown = sorted(set(data) - {"metric", "goal", "parameters"})
    if unknown:
        raise SearchSpaceError(f"{source}: unknown key(s) {unknown}; a space has metric, goal "
                               "and parameters")
    metric = data.get("metric", DEFAULT_SPACES[kind]["metric"])
    if metric not in REPORTED_METRICS[kind]:
        raise SearchSpaceError(f"{source}: metric {metric!r} is not reported by the {kind} "
                               f"trainer; one of {list(REPORTED_METRICS[kind])}")
    goal = data.get("goal", DEFAULT_SPACES[kind]["goal"])
    if goal not in GOALS:
        raise SearchSpaceError(f"{source}: goal {goal!r} must be one of {list(GOALS)}")
    entries = data.get("parameters")
    if not isinstance(entries, Mapping) or not entries:
        raise SearchSpaceError(f"{source}: parameters must be a non-empty object of "
                               f"{sorted(TUNABLE[kind])}")
    parameters = tuple(_parameter(kind, name, spec, source) for name, spec in entries.items())
    for parameter in parameters:
        _check_trainer_takes(kind, parameter, f"{source}: parameters.{parameter.name}")
    return SearchSpace(kind=kind, metric=metric, goal=goal, parameters=parameters)


def _parameter(kind: str, name: str, spec: Any, source: str) -> Parameter:
    where = f"{source}: parameters.{name}"
    if name not in TUNABLE[kind]:
        raise SearchSpaceError(f"{where}: the {kind} trainer cannot search {name!r}; "
                               f"tunable: {sorted(TUNABLE[kind])}")
    if not isinstance(spec, Mapping) or spec.get("type") not in PARAMETER_TYPES:
        raise SearchSpaceError(f"{where}: needs a type, one of {list(PARAMETER_TYPES)} (every "
                               "tunable parameter is a number: use discrete values for a choice)")
    kind_type, param_type = spec["type"], TUNABLE[kind][name]
    allowed = {"type", "values"} if kind_type == "discrete" else {
        "type", "min", "max", "scale"}
    extra = sorted(set(spec) - allowed)
    if extra:
        raise SearchSpaceError(f"{where}: unknown key(s) {extra} for a {kind_type} parameter; "
                               f"it takes {sorted(allowed)}")
    if kind_type == "discrete":
        values = spec.get("values")
        if (not isinstance(values, list) or not values
                or not all(_is_number(v) for v in values)):
            raise SearchSpaceError(f"{where}: values must be a non-empty list of numbers")
        if param_type is int and not all(float(v).is_integer() for v in values):
            raise SearchSpaceError(f"{where}: {name} is an integer; got values {values}")
        if len(set(values)) != len(values):
            raise SearchSpaceError(f"{where}: values repeat: {values}")
        return Parameter(name, kind_type, values=tuple(sorted(param_type(v) for v in values)))
    if kind_type == "integer" and param_type is not int:
        raise SearchSpaceError(f"{where}: {name} is a float; use type double")
    low, high, scale = spec.get("min"), spec.get("max"), spec.get("scale", "linear")
    if not (_is_number(low) and _is_number(high)) or not low < high:
        raise SearchSpaceError(f"{where}: needs numbers min < max, got {low!r} and {high!r}")
    if kind_type == "integer" and not (float(low).is_integer() and float(high).is_integer()):
        raise SearchSpaceError(f"{where}: integer bounds must be whole numbers")
    if scale not in SCALES:
        raise SearchSpaceError(f"{where}: scale {scale!r} must be one of {list(SCALES)}")
    if scale == "log" and low <= 0:
        raise SearchSpaceError(f"{where}: a log scale needs min > 0, got {low}")
    cast = int if kind_type == "integer" else float
    return Parameter(name, kind_type, min=cast(low), max=cast(high), scale=scale)


def _check_trainer_takes(kind: str, parameter: Parameter, where: str) -> None:
    """Refuses a range or value the trainer's settings class refuses; its limits are
    intervals, so a range's ends stand for every value between them."""
    if kind == "image":
        from components.train_image.contract import TrainConfig
    elif kind == "transformer":
        from components.train_transformer.contract import TransformerConfig as TrainConfig
    else:
        from components.train_text.contract import TrainConfig
    for value in parameter.values or (parameter.min, parameter.max):
        try:
            TrainConfig(**{parameter.name: value})
        except (ValueError, RuntimeError) as err:
            raise SearchSpaceError(f"{where}: the {kind} trainer refuses {parameter.name}="
                                   f"{value}: {err}") from None


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def read_space(kind: str, path: str | None = None) -> SearchSpace:
    """The space in the JSON file `path`, or the default space of `kind` when None.

    Raises:
        SearchSpaceError: The file is not JSON or not a valid space (see `parse_space`).
    """
    if not path:
        return parse_space(kind, DEFAULT_SPACES[kind], f"default {kind} space")
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise SearchSpaceError(f"{path}: not JSON ({err})") from err
    return parse_space(kind, data, path)


def coerce(kind: str, name: str, value: Any) -> int | float:
    """A trial's value of tunable parameter `name` as the trainer takes it ("32.0": 32).

    Raises:
        SearchSpaceError: Not a number, or a fractional value of an integer parameter.
    """
    try:
        return coerce_value(value, TUNABLE[kind][name])
    except ValueError as err:
        raise SearchSpaceError(f"{name}: {err}") from None


def draw_value(p: Parameter, rng) -> int | float:
    """A value of `p` drawn with `rng` (a `random.Random`), uniformly on its scale."""
    if p.values:
        return rng.choice(p.values)
    if p.type == "integer" and p.scale == "linear":
        return rng.randint(int(p.min), int(p.max))  # each value alike
    if p.scale == "log":
        value = math.exp(rng.uniform(math.log(p.min), math.log(p.max)))
    else:
        value = rng.uniform(p.min, p.max)
    return min(int(p.max), max(int(p.min), round(value))) if p.type == "integer" else value


def draw_points(space: SearchSpace, count: int, seed: int) -> list[dict[str, int | float]]:
    """`count` points of `space` drawn at random (`draw_value`), reproducibly: a compiled
    pipeline names its trials before it runs.

    Args:
        space: The search space.
        count: Points to draw.
        seed: Seed of the draw.

    Returns:
        One dict per point: parameter name to value, typed as the trainer takes it.
    """
    import random

    rng = random.Random(seed)
    return [{p.name: draw_value(p, rng) for p in space.parameters} for _ in range(count)]
