"""Functions written from a parameter list, for KFP to read and paste: KFP reads a
component's inputs from its signature and pastes its source, so a function with derived
parameters is written here as text, compiled under a name `inspect.getsource` finds.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import linecache
import typing
from collections.abc import Sequence
from typing import Any


def write_function(name: str, parameters: Sequence[inspect.Parameter], doc: str,
                   body: str, returns: str = "") -> Any:
    """A function written as source and compiled, its source readable by `inspect`.

    Args:
        name: The function's name (KFP's component name).
        parameters: Its parameters, annotated with a type, a kfp artifact type or text.
        doc: Its docstring, unindented (an `Args:` section describes the inputs).
        body: Its body, unindented; it imports what it uses.
        returns: The return annotation's source; empty for none.

    Returns:
        The function.
    """
    lines = [f"def {name}("]
    for parameter in parameters:
        kind, default = parameter.annotation, ""
        if typing.get_origin(kind) is typing.Annotated:  # kfp's Input[...], Output[...]
            base, marker = typing.get_args(kind)[:2]
            kind = f"{marker.__name__.removesuffix('Annotation')}[{base.__name__}]"
        elif isinstance(kind, type):  # `int`; `list[dict]` and text are their own source
            kind = kind.__name__
        if parameter.default is not inspect.Parameter.empty:  # text in double quotes, as ours
            value = parameter.default
            default = " = " + (json.dumps(value, ensure_ascii=False) if isinstance(value, str)
                               else repr(value))
        lines.append(f"    {parameter.name}: {kind}{default},")
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


HELP = "help"  # a settings field's metadata key: its console help
BOUNDS = "bounds"  # ... and the values it may take


def setting(default: Any, help: str, **bounds: Any) -> Any:  # noqa: A002 - the console's word
    """A settings field with its default, help (the step's input help) and bounds (`ge`,
    `gt`, `le`, `lt` or `choices`, held by `check_settings`)."""
    metadata = {HELP: help, BOUNDS: bounds}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_SYMBOLS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


@functools.cache
def _bounded(kind: type, bounds: tuple) -> Any:
    from pydantic import Field, TypeAdapter

    options = dict(bounds)
    choices = options.pop("choices", None)
    return TypeAdapter(typing.Literal[choices] if choices
                       else typing.Annotated[kind, Field(**options)])


def check_settings(settings: Any, error: type[Exception], *problems: str) -> None:
    """Holds each field of `settings` to the bounds its `setting` declares (pydantic).

    Raises:
        error: "<field> must be <bounds>, got <value>; ..." for each problem.
    """
    from pydantic import ValidationError

    found = list(problems)
    for field in dataclasses.fields(settings):
        bounds, value = field.metadata.get(BOUNDS), getattr(settings, field.name)
        if not bounds or value is None:
            continue
        try:
            _bounded(type(value), tuple(sorted(bounds.items()))).validate_python(value)
        except ValidationError:
            wanted = (f"one of {list(bounds['choices'])}" if "choices" in bounds else
                      " and ".join(f"{_SYMBOLS[k]} {v}" for k, v in bounds.items()))
            found.append(f"{field.name} must be {wanted}, got {value!r}")
    if found:
        raise error("; ".join(found))


def as_step_value(value: Any) -> Any:
    """A settings value as a KFP scalar input: 0 for None, text for tuples and dicts."""
    if value is None:
        return 0
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return json.dumps(value) if value else ""
    return value


def _field_default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def _step_type(annotation: Any, default: Any) -> type:
    """The KFP input type of a settings field: None taken out, text for tuples and dicts."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = typing.get_origin(options[0]) or options[0]
    return str if kind in (tuple, dict) else kind if kind in (bool, int, float, str) \
        else type(as_step_value(default))


def settings_from_step(settings: type, values: dict[str, Any],
                       parsers: dict[str, Any] | None = None) -> Any:
    """The settings a step's inputs describe: `as_step_value` undone for each field taken
    (a field in `parsers` is given to its parser)."""
    parsers = parsers or {}
    taken = {}
    for field in dataclasses.fields(settings):
        if field.name in values:
            value = values[field.name]
            if field.name in parsers:
                value = parsers[field.name](value)
            taken[field.name] = None if _field_default(field) is None and not value else value
    return settings(**taken)


def step_function(name: str, settings: type, summary: str,
                  before: Sequence[tuple[str, Any, str]], after: Sequence[tuple[str, Any, str]],
                  runs: str, leave_out: Sequence[str] = (),
                  helps: dict[str, str] | None = None) -> Any:
    """A step's KFP function written from its settings class: `before` (artifacts and inputs
    without a default), every field of `settings` (its type, default and `setting` help) but
    `leave_out`, then `after`.

    Args:
        name: The function's name.
        settings: The settings dataclass; each field has its help in `setting`.
        summary: The docstring's first paragraph.
        before: `(name, annotation, help)` of the inputs before the settings.
        after: `(name, default, help)` of the inputs after them.
        runs: "module:function" called with one dict of every input.
        leave_out: Fields that are no input.
        helps: Help that replaces a field's own.

    Returns:
        The function (`write_function`).
    """
    hints, helps = typing.get_type_hints(settings), helps or {}
    plain = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter(n, plain, annotation=a) for n, a, _ in before]
    described = [(n, h) for n, _, h in before]
    for field in dataclasses.fields(settings):
        if field.name in leave_out:
            continue
        default = _field_default(field)
        parameters.append(inspect.Parameter(field.name, plain, default=as_step_value(default),
                                            annotation=_step_type(hints[field.name], default)))
        described.append((field.name, helps.get(field.name, field.metadata[HELP])))
    parameters += [inspect.Parameter(n, plain, default=d, annotation=type(d)) for n, d, _ in after]
    described += [(n, h) for n, _, h in after]
    doc = f"{summary}\n\nArgs:\n" + "\n".join(f"    {n}: {h}" for n, h in described)
    module, function = runs.split(":")
    body = (f"values = dict(locals())  # the inputs, before the import names one more\n"
            f"from {module} import {function}\n\n{function}(values)")
    return write_function(name, parameters, doc, body)
