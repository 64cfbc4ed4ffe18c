"""Step defaults and help written from one home: `python -m tools.signatures [--check]`.

KFP reads a step's inputs and their defaults from its function's signature, and for the
lightweight components used here it pastes the function's source into the compiled JSON,
where the executor reads that signature again at run time. A step's default therefore has
to stand as a literal in its source; instead of being typed there, it is written there from
its home:

- a configured step's default comes from its settings class (e.g. `TrainConfig`);
- the help of `learning_rate=0` (fastai's lr_find) is the sentence beside `choose_rate`
  with the bounds each trainer holds the found rate to.

Pipelines take their parameters from their steps when they are built
(`pipelines.definitions.steps.Steps.signature` and `_describe`), preflights and tuning
steps are written when built (`components.common.written`): none is written here.

A value that is already right keeps its spelling (`1e-3` is not rewritten as `0.001`), so
the compiled JSON changes only when a value does. Each function it writes carries a comment
above its `def` (and decorators) saying where its values come from; KFP pastes a step's
function from its `def` on, so the comment stays out of the compiled JSON.
`--check` rewrites nothing and exits 1 naming the stale files, a missing or outdated
comment included (a test runs it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import pathlib
import sys
from typing import Any

from components.common.written import literal

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Configured steps: (component module, function, settings class "module:Class").
CONFIGURED = (
    ("components.shard.component", "shard_images", "components.shard.contract:ShardConfig"),
    ("components.prepare_text.component", "prepare_text_data",
     "components.prepare_text.contract:PrepareConfig"),
    ("components.train_text.component", "train_text_classifier",
     "components.train_text.contract:TrainConfig"),
    ("components.train_lm.component", "train_language_model",
     "components.train_lm.contract:LMConfig"),
    ("components.train_transformer.component", "train_transformer_classifier",
     "components.train_transformer.contract:TransformerConfig"),
)
# learning_rate's help: the sentence FOUND_RATE_HELP beside `choose_rate`, with the bounds
# of each trainer (read from the modules' text: they import fastai, which takes seconds).
RATE_HELP_HOME = "components.common.fastai_text"
RATE_BOUNDS = {"text": "components.train_text.schedule", "lm": "components.train_lm.training"}
RATE_HELP = (
    ("components.train_text.component", "train_text_classifier", "text"),
    ("components.train_lm.component", "train_language_model", "lm"),
)
NOT_LITERAL = object()  # a default that is no literal (`_literal`)
# The comment above each function whose parameters are written here (MARKED finds one).
MARKED = "written by python -m tools.signatures"
STEP_MARKER = ("# Defaults written by python -m tools.signatures from contract.{config} "
               "(edit there).")
# Steps that take another step's parameters after their own: (module, step, its last own
# parameter, the other step, the other's last parameter not taken). The TrainJob launcher
# takes the one-pod transformer trainer's settings.
TAKEN_PARAMETERS = (("components.train_transformer.component", "train_transformer_trainjob",
                     "deadline_seconds", "train_transformer_classifier", "metrics"),)
TAKEN_MARKER = ("# Parameters after {last} written by python -m tools.signatures from\n"
                "# {source} (edit there).")
def as_step_value(name: str, value: Any) -> Any:
    """A settings value as the step's typed input carries it: no None, tuple or dict
    (KFP inputs are scalars), so 0 stands for None and text for lists and objects."""
    if value is None:
        return 0
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return json.dumps(value) if value else ""
    return value


def config_defaults(config: type) -> dict[str, Any]:
    """Each field's default of a settings dataclass, as a step input carries it."""
    defaults = {}
    for field in dataclasses.fields(config):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = as_step_value(field.name, field.default)
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = as_step_value(field.name, field.default_factory())
    return defaults


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    found = [node for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef) and node.name == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} functions named {name}")
    return found[0]


def _literal(node: ast.expr) -> Any:
    """The value of a literal's `node`; `NOT_LITERAL` for anything else (e.g. a name)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return NOT_LITERAL


def _with_defaults(function: ast.FunctionDef) -> list[tuple[ast.arg, ast.expr]]:
    args = function.args.args
    return list(zip(args[len(args) - len(function.args.defaults):], function.args.defaults))


def _offset(lines: list[str], line: int, col: int) -> int:
    return sum(len(text) for text in lines[:line - 1]) + col


def _replace(source: str, spans: list[tuple[int, int, int, int, str]]) -> str:
    """Source with each (line, col, end_line, end_col) span replaced, last first."""
    lines = source.splitlines(keepends=True)
    for line, col, end_line, end_col, text in sorted(spans, reverse=True):
        start, end = _offset(lines, line, col), _offset(lines, end_line, end_col)
        source = source[:start] + text + source[end:]
    return source


def rewrite_defaults(source: str, function: str, values: dict[str, Any]) -> str:
    """`source` with the defaults of `function`'s parameters named in `values` set to
    those values; a literal that already equals its value is left as written.

    Raises:
        LookupError: `source` holds no or several functions of that name.
    """
    spans = []
    for arg, default in _with_defaults(_function(ast.parse(source), function)):
        if arg.arg not in values:
            continue
        value, written = values[arg.arg], _literal(default)  # not a literal: value is its home
        if written != value or type(written) is not type(value):
            spans.append((default.lineno, default.col_offset, default.end_lineno,
                          default.end_col_offset, literal(value)))
    return _replace(source, spans)


def parameter_lines(source: str, function: str, indent: str = "    ") -> list[str]:
    """`function`'s parameters as `name: type = default,` lines; a default that is not a
    literal (a value known when the pipeline is built) is written as its type's empty."""
    tree = ast.parse(source)
    node = _function(tree, function)
    defaults = dict((arg.arg, default) for arg, default in _with_defaults(node))
    lines = []
    for arg in node.args.args:
        text = f"{indent}{arg.arg}: {ast.get_source_segment(source, arg.annotation)}"
        if arg.arg in defaults:
            default = defaults[arg.arg]
            text += " = " + (ast.get_source_segment(source, default)
                             if _literal(default) is not NOT_LITERAL else
                             literal(_empty(ast.get_source_segment(source, arg.annotation))))
        lines.append(text + ",")
    return lines


def _empty(annotation: str) -> Any:
    return {"str": "", "int": 0, "float": 0.0, "bool": False}[annotation]


def rewrite_parameters(source: str, function: str, lines: list[str]) -> str:
    """`source` with `function`'s parameter list replaced by `lines` (one a parameter)."""
    node = _function(ast.parse(source), function)
    first, last = node.args.args[0], node.args.args[-1]
    defaults = _with_defaults(node)
    end = defaults[-1][1] if defaults and defaults[-1][0] is last else last
    # The list's own trailing comma and closing bracket stay as they are.
    text = "\n".join(lines).strip().rstrip(",")
    return _replace(source, [(first.lineno, first.col_offset, end.end_lineno,
                              end.end_col_offset, text)])


def rewrite_after(source: str, function: str, last: str, lines: list[str]) -> str:
    """`source` with `function`'s parameters after `last` replaced by `lines`."""
    kept = parameter_lines(source, function)
    names = [line.split(":")[0].strip() for line in kept]
    return rewrite_parameters(source, function, kept[:names.index(last) + 1] + lines)


def mark(source: str, function: str, marker: str) -> str:
    """`source` with the comment `marker` (its lines split at "\\n") above `function`'s `def`
    and decorators, in their indentation, in place of an earlier comment of this command
    there (from the comment line naming this command down to the `def`).

    Raises:
        LookupError: `source` holds no or several functions of that name.
    """
    node = _function(ast.parse(source), function)
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list]) - 1
    lines = source.splitlines(keepends=True)
    head = lines[first]
    written = [head[:len(head) - len(head.lstrip())] + text + "\n"
               for text in marker.split("\n")]
    top = first
    while top > 0 and lines[top - 1].lstrip().startswith("#"):
        top -= 1
    ours = [number for number in range(top, first) if MARKED in lines[number]]
    lines[ours[0] if ours else first:first] = written
    return "".join(lines)


def module_constants(source: str) -> dict[str, Any]:
    """The literal values a module's text assigns at its top level (`A = 1`, `B, C = 2, 3`),
    read without importing it."""
    values = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = ([(target, node.value)] if isinstance(target, ast.Name) else
                     list(zip(target.elts, node.value.elts))
                     if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                     else [])
            values.update((name.id, found) for name, value in pairs
                          if (found := _literal(value)) is not NOT_LITERAL)
    return values


def rate_text(value: float) -> str:
    """A learning rate as the help writes it: 0.003 -> "3e-3", 0.0025 -> "2.5e-3"."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def found_rate_help(kind: str, sources: dict[str, str]) -> str:
    """What learning_rate=0 does in the `kind` ("text" or "lm") trainer, from `sources`."""
    template = module_constants(sources[RATE_HELP_HOME])["FOUND_RATE_HELP"]
    bounds = module_constants(sources[RATE_BOUNDS[kind]])
    low = rate_text(bounds["MIN_FOUND_LR"])
    if kind == "lm":
        return template.format(bounds=f"{low}..{rate_text(bounds['MAX_FOUND_LR'])}")
    # schedule.found_rate_bounds: the head's window, or a whole model's scaled by width
    head, whole = rate_text(bounds["MAX_FOUND_LR_HEAD"]), rate_text(bounds["MAX_FOUND_LR_WHOLE"])
    return template.format(bounds=f"{low}..{head} when gradual unfreezing trains the head "
                                  f"first, else {low}..{whole} times "
                                  f"{bounds['BOUNDS_N_HID']}/n_hid, capped at {head}")


def rewrite_help(source: str, function: str, name: str, sentence: str) -> str:
    """`source` with the help of `function`'s parameter `name` (its docstring line `name:
    what it is; ...`) ending in `sentence` after its first "; ".

    Raises:
        LookupError: The docstring has no line for `name`.
    """
    node = _function(ast.parse(source), function)
    lines = source.splitlines(keepends=True)
    for number in range(node.body[0].lineno, node.body[0].end_lineno + 1):
        text = lines[number - 1]
        if text.lstrip().startswith(name + ": "):
            head = text.rstrip("\n").split("; ", 1)[0]
            lines[number - 1] = f"{head}; {sentence}\n"
            return "".join(lines)
    raise LookupError(f"no `{name}:` line in the docstring of {function}")


def _source_path(module: str) -> pathlib.Path:
    return ROOT / (module.replace(".", "/") + ".py")


def _load(spec: str) -> Any:
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def written(sources: dict[str, str]) -> dict[str, str]:
    """Every generated file's text as it should be, from `sources` (module -> text)."""
    sources = dict(sources)
    for module, function, config in CONFIGURED:
        sources[module] = mark(rewrite_defaults(sources[module], function,
                                                config_defaults(_load(config))),
                               function, STEP_MARKER.format(config=config.split(":")[1]))
    for module, function, last, source, skipped in TAKEN_PARAMETERS:
        lines = parameter_lines(sources[module], source)
        names = [line.split(":")[0].strip() for line in lines]
        sources[module] = mark(rewrite_after(sources[module], function, last,
                                             lines[names.index(skipped) + 1:]),
                               function, TAKEN_MARKER.format(last=last, source=source))
    for module, function, kind in RATE_HELP:  # before the pipelines copy it
        sources[module] = rewrite_help(sources[module], function, "learning_rate",
                                       found_rate_help(kind, sources))
    return sources


def _modules() -> list[str]:
    return sorted({m for m, _, _ in CONFIGURED} | {RATE_HELP_HOME}
                  | set(RATE_BOUNDS.values()) | {m for m, _, _ in RATE_HELP})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the files that are stale")
    args = parser.parse_args(argv)
    sources = {module: _source_path(module).read_text() for module in _modules()}
    wanted = written(sources)
    stale = [module for module, text in wanted.items() if text != sources[module]]
    for module in stale:
        path = _source_path(module)
        if args.check:
            print(f"{path.relative_to(ROOT)} is stale: run python -m tools.signatures")
        else:
            path.write_text(wanted[module])
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
