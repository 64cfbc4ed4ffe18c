"""One reading of a pipeline parameter typed on a command line (`run_local`, `submit`,
`rehearsal`), scalars by the rule of every setting (`components.common.values`)."""

from __future__ import annotations

import json
from typing import Any

from components.common.values import coerce

SCALARS = {"NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool}
# A component spec's type names (kfp's `component_spec.inputs[...].type`) in the IR's terms.
SPEC_TYPES = {"String": "STRING", "Integer": "NUMBER_INTEGER", "Float": "NUMBER_DOUBLE",
              "Boolean": "BOOLEAN", "List": "LIST", "Dict": "STRUCT"}


def parse_value(text: str, parameter_type: str) -> Any:
    """The value of a parameter typed as text, in the type the pipeline declares.

    Args:
        text: The value as typed on the command line.
        parameter_type: The IR's type (NUMBER_INTEGER, ..., STRUCT) or a component spec's.

    Returns:
        int, float, bool, str, list or dict.

    Raises:
        ValueError: Not a value of that type (the message does not name the parameter).
    """
    parameter_type = SPEC_TYPES.get(parameter_type, parameter_type)
    if parameter_type == "STRING":
        return text
    if parameter_type in SCALARS:
        return coerce(text, SCALARS[parameter_type])
    if parameter_type in ("LIST", "STRUCT"):
        want = list if parameter_type == "LIST" else dict
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, want):
            shape = "a JSON list, e.g. [1, 2]" if want is list else 'a JSON object, e.g. {"k": 1}'
            raise ValueError(f"expected {shape}, got {text!r}")
        return value
    raise ValueError(f"parameters of type {parameter_type} cannot be set")


def argparse_type(parameter_type: str):
    """An argparse `type=` callable that parses like `parse_value` (argparse names the flag)."""
    import argparse

    def convert(text: str) -> Any:
        try:
            return parse_value(text, parameter_type)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = SPEC_TYPES.get(parameter_type, parameter_type).lower()
    return convert
