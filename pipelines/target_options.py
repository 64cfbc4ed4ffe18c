"""What the targets' option modules (`vertex_options`, `kubeflow_options`) share."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from pipelines.definitions.machine import DEFAULT_MACHINES, Machine

REFUSED = ("--{option} is a {owner} option; --target {target} cannot honour it "
           "(docs/kubeflow.md: what differs)")


def declared(add_options: Callable[[argparse.ArgumentParser], None]) -> dict[str, Any]:
    """The options `add_options` declares, destination -> default."""
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser)
    return vars(parser.parse_args([]))


def refused(args: argparse.Namespace, others: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One message per option of another target that `args` sets (by flag or `--config`:
    unlike its default), naming it and its target: refused, never silently dropped.

    Args:
        args: The parsed flags; `args.target` is the chosen target.
        others: Each other target's name -> its options' defaults (`declared`).
    """
    return [REFUSED.format(option=dest.replace("_", "-"), owner=name.capitalize(),
                           target=args.target)
            for name, defaults in others.items() for dest, default in defaults.items()
            if getattr(args, dest) != default]


def step_machines(args: argparse.Namespace) -> dict[str, Machine]:
    """Each step's machines from its `--<step>-*` options (common and the targets' own)."""
    values = vars(args)
    return {step: Machine(**{f.name: values[f"{step}_{f.name}"]
                             for f in dataclasses.fields(Machine)}) for step in DEFAULT_MACHINES}


def fail(problems: list[str]) -> None:
    """Exits with one `error:` line per problem; returns when there is none."""
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems))
