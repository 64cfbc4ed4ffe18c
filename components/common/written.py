"""Functions written from a parameter list, for KFP to read and paste.

KFP reads a lightweight component's inputs from its function's signature and pastes the
function's source into the compiled pipeline, where the executor runs it again. A function
whose parameters are derived (a preflight takes its pipeline's) is therefore written as text
here, once, and compiled under a name that `inspect.getsource` finds in `linecache`.
"""

from __future__ import annotations

import inspect
import json
import linecache
from collections.abc import Sequence
from typing import Any, NamedTuple


def literal(value: Any) -> str:
    """Python source of a default value, strings in double quotes as the house writes them."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def write_function(name: str, parameters: Sequence[inspect.Parameter], doc: str,
                   body: str, returns: str = "") -> Any:
    """A function written as source and compiled, its source readable by `inspect`.

    Args:
        name: The function's name (KFP's component name).
        parameters: Its parameters, each annotated with a plain type (str, int, ...).
        doc: Its docstring, unindented (KFP's descriptions of the inputs: an `Args:`
            section).
        body: Its body, unindented; it runs where the executor pastes the source, so it
            imports what it uses.
        returns: The return annotation's source; empty for none.

    Returns:
        The function.
    """
    lines = [f"def {name}("]
    for parameter in parameters:
        default = ("" if parameter.default is inspect.Parameter.empty
                   else f" = {literal(parameter.default)}")
        lines.append(f"    {parameter.name}: {parameter.annotation.__name__}{default},")
    lines.append(f"){f' -> {returns}' if returns else ''}:")
    doc = "\n".join(f"    {line}" if line else "" for line in doc.strip().splitlines())
    lines.append(f'    """{doc.lstrip()}\n    """')
    lines += [f"    {line}" if line else "" for line in body.strip().splitlines()]
    source = "\n".join(lines) + "\n"
    filename = f"<written {name}>"
    # mtime None: linecache.checkcache keeps an entry that has no file on disk.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"NamedTuple": NamedTuple}
    # dont_inherit: this module's `annotations` future would make the types text.
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102
    return namespace[name]
