"""Pipeline parameters read as the later steps' config classes take them.

The preflight error, the coercion of parameter text ("32", "0.5", "true") to a config
field's type, and the construction of a step's config class from the parameters its
fields name, so the config's own validation runs before any paid job.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any


class PreflightError(ValueError):
    """The run would fail later; the message names each parameter and what to do."""


def coerce(value: Any, annotation: Any) -> Any:
    """A parameter value as the config field's type wants it.

    Pipeline parameters reach this step inside a dict, where Vertex writes every value
    as text ("32", "0.5", "true") and kfp.local writes whole numbers as "32.0".
    """
    if annotation is bool:
        if isinstance(value, str):
            if value.lower() not in ("true", "false"):
                raise PreflightError(f"expected true or false, got {value!r}")
            return value.lower() == "true"
        return bool(value)
    if annotation is int:
        number = float(value)
        if not number.is_integer():
            raise PreflightError(f"expected a whole number, got {value!r}")
        return int(number)
    if annotation is float:
        try:
            number = float(value)
        except (TypeError, ValueError) as err:
            raise PreflightError(f"expected a number, got {value!r}") from err
        if not math.isfinite(number):  # NaN or inf slips through every range check
            raise PreflightError(f"expected a finite number, got {value!r}")
        return number
    return value if value is None else str(value)


def build(config_class: type, parameters: Mapping[str, Any], renames: Mapping[str, str] = (),
          **overrides: Any) -> Any:
    """Constructs `config_class` from the pipeline parameters its fields name.

    Args:
        config_class: A dataclass whose `__post_init__` validates.
        parameters: Pipeline parameters by name (text or typed values).
        renames: Field name -> pipeline parameter name, where they differ.
        **overrides: Field values given directly (already typed).

    Raises:
        PreflightError: A value of the wrong type, or what the config refuses.
    """
    renames = dict(renames)
    hints = typing.get_type_hints(config_class)
    values = dict(overrides)
    for field in dataclasses.fields(config_class):
        source = renames.get(field.name, field.name)
        if field.name in values or source not in parameters:
            continue
        annotation = hints[field.name]
        base = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        try:
            values[field.name] = coerce(parameters[source], base)
        except (PreflightError, ValueError) as err:
            raise PreflightError(f"{source}: {err}") from err
    try:
        return config_class(**values)
    except (ValueError, RuntimeError) as err:  # RuntimeError: the trainers' own error types
        raise PreflightError(str(err)) from err


def number_parameter(parameters: Mapping[str, Any], name: str) -> float:
    """The parameter `name` as a float.

    Raises:
        PreflightError: Its value is not a number.
    """
    try:
        return float(parameters[name])
    except ValueError as err:
        raise PreflightError(f"{name}: expected a number, got {parameters[name]!r}") from err


def steps_per_epoch(parameters: Mapping[str, Any]) -> int:
    """The `steps_per_epoch` parameter as a whole number (0, for all, when not given).

    Raises:
        PreflightError: Its value is not a whole number.
    """
    try:
        return coerce(parameters.get("steps_per_epoch", 0), int)
    except (PreflightError, ValueError) as err:
        raise PreflightError(f"steps_per_epoch: {err}") from err
