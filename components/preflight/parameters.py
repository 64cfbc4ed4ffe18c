"""Pipeline parameters read as the later steps' config classes take them, so each config's
own validation runs before any paid job."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from components.common.values import coerce as coerce_value


class PreflightError(ValueError):
    """The run would fail later; the message names each parameter and what to do."""


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
        values[field.name] = (None if parameters[source] is None
                              else typed_parameter(parameters, source, base))
    try:
        return config_class(**values)
    except (ValueError, RuntimeError) as err:  # RuntimeError: the trainers' own error types
        raise PreflightError(str(err)) from err


def typed_parameter(parameters: Mapping[str, Any], name: str, kind: type = float,
                    default: Any = None) -> Any:
    """The parameter `name` (`default` when absent) as a `kind`.

    Raises:
        PreflightError: Its value is not one, the message naming `name`.
    """
    try:
        return coerce_value(parameters[name] if name in parameters else default, kind)
    except ValueError as err:
        raise PreflightError(f"{name}: {err}") from None
