"""One rule for a setting's value, whoever hands it over: pydantic's lax mode (text, whole
floats or typed values alike; no 2.5 as an int, booleans as true/false, yes/no, on/off, 1/0,
floats only finite)."""

from __future__ import annotations

import functools
from typing import Annotated, Any

# What each type's refusal says it expected.
EXPECTED = {int: "a whole number", float: "a finite number",
            bool: "true or false (or yes/no, on/off, 1/0)", str: "text"}


@functools.cache
def _adapter(annotation: Any):
    from pydantic import AllowInfNan, ConfigDict, TypeAdapter

    declared = Annotated[float, AllowInfNan(False)] if annotation is float else annotation
    return TypeAdapter(declared, config=ConfigDict(coerce_numbers_to_str=True))


def coerce(value: Any, annotation: Any) -> Any:
    """`value` as a setting of type `annotation` (int, float, bool, str, ...) takes it.

    Raises:
        ValueError: "expected <what>, got <value>" (the caller names the setting).
    """
    from pydantic import ValidationError

    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError:
        expected = EXPECTED.get(annotation, f"a {getattr(annotation, '__name__', annotation)}")
        raise ValueError(f"expected {expected}, got {value!r}") from None
