"""The help half of `python -m tools.signatures`: `Args:` entries read and written as
source text, and where each pipeline parameter's help comes from.

An entry is `name: help` in the section's indentation; a deeper line continues the entry
above it. The section ends at a blank line, a shallower line or the docstring's end. A
pipeline's entries are written one line each, from `HELP_HOME` or the step's entry.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

# The pipeline parameters' help that is no step's.
HELP_HOME = "pipelines.definitions.help_text"
QUOTES = '"""'


@dataclass(frozen=True)
class Args:
    """Where a docstring's `Args:` entries stand and what they say.

    Attributes:
        start, end: Their lines, 0-based, `end` excluded.
        indent: The indentation of each entry's first line.
        entries: Each parameter's help as written (a continuation joined with a space).
        closed: The docstring's closing quotes end the last entry's line.
    """

    start: int
    end: int
    indent: str
    entries: dict[str, str]
    closed: bool


def _depth(text: str) -> int:
    return len(text) - len(text.lstrip())


def read_args(source: str, node: ast.FunctionDef) -> Args | None:
    """`node`'s `Args:` section in `source` (the text `node` was parsed from); None when
    its docstring has none."""
    doc = node.body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
            and isinstance(doc.value.value, str)):
        return None
    lines = source.splitlines()
    heads = [i for i in range(doc.lineno - 1, doc.end_lineno) if lines[i].strip() == "Args:"]
    if not heads:
        return None
    start = end = heads[0] + 1
    indent = lines[start][:_depth(lines[start])]
    entries, name, closed = {}, None, False
    for number in range(start, doc.end_lineno):
        last = number == doc.end_lineno - 1  # the line of the closing quotes
        text = lines[number].rstrip().removesuffix(QUOTES) if last else lines[number]
        if not text.strip() or _depth(text) < len(indent):
            break
        if _depth(text) == len(indent):
            name, _, help_text = text.strip().partition(": ")
            entries[name] = help_text
        else:  # deeper: it continues the entry above (the first line sets the depth)
            entries[name] += " " + text.strip()
        end, closed = number + 1, last
    return Args(start, end, indent, entries, closed)


def write_args(source: str, node: ast.FunctionDef, helps: dict[str, str]) -> str:
    """`source` with `node`'s `Args:` entries replaced by one line `name: help` each, in
    the order of `helps`.

    Raises:
        LookupError: The docstring has no `Args:` section, or its closing quotes end an
            entry's line (there is no line of its own to keep them on).
        ValueError: A help text would not stand in a docstring as written (a line break,
            a backslash or three double quotes).
    """
    args = read_args(source, node)
    if args is None or args.closed:
        raise LookupError(f"{node.name}: no Args section ending before the closing quotes")
    for name, text in helps.items():
        if "\n" in text or "\\" in text or QUOTES in text:
            raise ValueError(f"{node.name}.{name}: help {text!r} cannot stand in a docstring")
    lines = source.splitlines(keepends=True)
    written = [f"{args.indent}{name}: {text}\n" for name, text in helps.items()]
    return "".join(lines[:args.start] + written + lines[args.end:])


def step_of(name: str, steps: dict[str, Any]) -> str | None:
    """The step a compiled component name stands for (comp-predict-2: comp-predict); None
    for a preflight step or a component that is no step's."""
    base = name.rsplit("-", 1)[0] if name[-1].isdigit() and name not in steps else name
    return None if base.startswith("comp-preflight") or base not in steps else base


def fed_inputs(spec: Any) -> dict[str, list[tuple[str, str]]]:
    """Each pipeline parameter's (component name, input name) pairs: every task input that
    takes it, in the root DAG and in those of its conditions, from its compiled `spec`."""
    fed = {}

    def walk(dag: Any, outer: dict[str, str]) -> None:
        for task in dag.tasks.values():
            name = task.component_ref.name
            taken = {key: outer.get(value.component_input_parameter,
                                    value.component_input_parameter)
                     for key, value in task.inputs.parameters.items()
                     if value.component_input_parameter}
            if spec.components[name].HasField("dag"):  # a condition: its inputs, renamed
                walk(spec.components[name].dag, taken)
                continue
            for key, parameter in taken.items():
                fed.setdefault(parameter, []).append((name, key))

    walk(spec.root.dag, {})
    return fed


def _renamed(text: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text


def pipeline_help(function: str, names: list[str], fed: dict[str, list[tuple[str, str]]],
                  helps: dict[str, dict[str, str]], home: Any) -> dict[str, str]:
    """The help of `function`'s parameters `names`, in their order: a parameter's own in
    `home` (its `OWN_HELP[function]`, else its `HELP`), else that of the step inputs it
    feeds (`fed`, by compiled component name; `helps`: each step's Args by input).

    Raises:
        LookupError: A parameter's help has no home (none in `home`, and it feeds no
            documented step input or inputs whose help differs), or two (its help in
            `home` is its step's).
    """
    own = {**home.HELP, **home.OWN_HELP.get(function, {})}
    feeds = {(base, key): name for name in names for component, key in fed.get(name, ())
             if (base := step_of(component, helps))}
    renames = {}  # a step's own inputs named in its help, fed by other names
    for (base, key), name in feeds.items():
        if key != name and "_" in key and key not in names:
            renames.setdefault(base, {})[key] = name
    found = {}
    for name in names:
        texts = {_renamed(helps[base].get(key, ""), renames.get(base, {}))
                 for (base, key), fed_by in feeds.items() if fed_by == name}
        if name in own and texts == {own[name]}:
            raise LookupError(f"{function}.{name}: its help in {HELP_HOME} is its step's")
        if name not in own and (len(texts) != 1 or "" in texts):
            raise LookupError(f"{function}.{name} feeds no step input, or inputs whose help "
                              f"differs: give it help in {HELP_HOME}")
        found[name] = own[name] if name in own else texts.pop()
    return found


def check_help_home(home: Any, parameters: dict[str, list[str]]) -> None:
    """Refuses help in `home` for what is no parameter of its pipeline (`parameters`:
    each pipeline function's parameter names), a target's words (`home.Words`) of what is
    no pipeline's parameter, and a target's help that could not stand in a docstring.

    Raises:
        LookupError: Naming each such entry.
        ValueError: A target's help holds a line break, a backslash or three double quotes.
    """
    known = {name for names in parameters.values() for name in names}
    stray = [f"HELP[{name!r}]" for name in home.HELP if name not in known]
    stray += [f"OWN_HELP[{function!r}][{name!r}]" for function, own in home.OWN_HELP.items()
              for name in own if name not in parameters.get(function, ())]
    for target, words in vars(home).items():
        if not isinstance(words, home.Words):
            continue
        stray += [f"{target}: {name!r}" for name in [*words.help, *words.dropped]
                  if name not in known]
        for name, text in words.help.items():
            if "\n" in text or "\\" in text or QUOTES in text:
                raise ValueError(f"{target}.help[{name!r}]: {text!r} cannot stand in a "
                                 "docstring")
    if stray:
        raise LookupError(f"{HELP_HOME}: no such pipeline parameter: {', '.join(stray)}")
