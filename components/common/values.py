"""One rule for a setting's value, whoever hands it over: pydantic's lax mode.

Values reach a setting as text (a command line; Vertex writes every pipeline parameter
inside a dict as "32", "0.5", "true"), as floats where a whole number is meant (kfp.local's
"32.0", a Vertex tuning trial's discrete values) or typed. Each is read into the type its
setting declares by the same rule: whole numbers from "32", "32.0" or 32.0, but not 2.5;
booleans from true/false, yes/no, on/off, 1/0 (any case); floats only finite (JSON, the
specs' and requests' language, has no NaN or infinity, and NaN passes every range check).

pydantic is imported when a value is read, not with this module: a tuning trial's entry
imports it before anything is read, under whatever Python the image runs.
"""

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
    """`value` as a setting of type `annotation` (int, float, bool, str, or what pydantic
    reads) takes it.

    Raises:
        ValueError: Not a value of that type: "expected <what>, got <value>" (the caller
            names the setting).
    """
    from pydantic import ValidationError

    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError:
        expected = EXPECTED.get(annotation, f"a {getattr(annotation, '__name__', annotation)}")
        raise ValueError(f"expected {expected}, got {value!r}") from None
