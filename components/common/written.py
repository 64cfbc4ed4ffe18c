"""Functions written from a parameter list, for KFP to read and paste.

KFP reads a lightweight component's inputs from its function's signature and pastes the
function's source into the compiled pipeline, where the executor runs it again. A function
whose parameters are derived (a preflight takes its pipeline's) is therefore written as text
here, once, and compiled under a name that `inspect.getsource` finds in `linecache`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import linecache
import typing
from collections.abc import Sequence
from typing import Any


def literal(value: Any) -> str:
    """Python source of a default value, strings in double quotes as the house writes them."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def annotation_source(annotation: Any) -> str:
    """The source of a parameter's annotation: `int`, `list[dict]`, `Input[Dataset]`, ..."""
    if isinstance(annotation, str):
        return annotation
    if typing.get_origin(annotation) is typing.Annotated:  # kfp's Input[...], Output[...]
        base, marker = typing.get_args(annotation)[:2]
        return f"{marker.__name__.removesuffix('Annotation')}[{base.__name__}]"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def write_function(name: str, parameters: Sequence[inspect.Parameter], doc: str,
                   body: str, returns: str = "") -> Any:
    """A function written as source and compiled, its source readable by `inspect`.

    Args:
        name: The function's name (KFP's component name).
        parameters: Its parameters, each annotated with a type, a kfp artifact type
            (`Input[Dataset]`) or the annotation's source text.
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
        lines.append(f"    {parameter.name}: {annotation_source(parameter.annotation)}{default},")
    lines.append(f"){f' -> {returns}' if returns else ''}:")
    doc = "\n".join(f"    {line}" if line else "" for line in doc.strip().splitlines())
    lines.append(f'    """{doc.lstrip()}\n    """')
    lines += [f"    {line}" if line else "" for line in body.strip().splitlines()]
    source = "\n".join(lines) + "\n"
    # One name per text: a pipeline built again may write the same function otherwise.
    filename = f"<written {name} {hashlib.sha256(source.encode()).hexdigest()[:12]}>"
    # mtime None: linecache.checkcache keeps an entry that has no file on disk.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    from kfp import dsl

    # What the executor's file imports above the pasted function (`from kfp.dsl import *`).
    namespace: dict[str, Any] = {"NamedTuple": typing.NamedTuple, **{
        name: getattr(dsl, name) for name in dir(dsl) if not name.startswith("_")}}
    # dont_inherit: this module's `annotations` future would make the types text.
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102
    return namespace[name]
