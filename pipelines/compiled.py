"""A compiled pipeline file as both submit commands read it: its spec and its parameters."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from pipelines.params import parse_value

# Older IR (schema <= 2.0.0) declared `type` instead of `parameterType`.
_LEGACY_TYPES = {"INT": "NUMBER_INTEGER", "DOUBLE": "NUMBER_DOUBLE", "STRING": "STRING"}


class SubmitError(ValueError):
    """The command line asks for what the pipeline or its server would refuse (exit 2)."""


def load_pipeline_spec(path: str) -> dict:
    """Reads a compiled pipeline: the PipelineSpec, unwrapped from a PipelineJob if need be.

    Raises:
        SubmitError: The file is missing or is not a compiled pipeline.
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise SubmitError(f"cannot read {path}: {e.strerror}") from e
    try:
        # A Kubeflow file's second YAML document holds its Kubernetes settings.
        spec = json.loads(text) if path.endswith(".json") else next(
            yaml.safe_load_all(text), None)
    except (ValueError, yaml.YAMLError) as e:
        raise SubmitError(f"{path} is not valid JSON/YAML: {e}") from e
    if isinstance(spec, dict) and isinstance(spec.get("pipelineSpec"), dict):
        spec = spec["pipelineSpec"]
    if not isinstance(spec, dict) or "root" not in spec or "pipelineInfo" not in spec:
        raise SubmitError(f"{path} is not a compiled pipeline (no root/pipelineInfo): "
                          "compile it with `python compile.py`")
    return spec


def declared_parameters(spec: Mapping) -> dict[str, dict]:
    """The pipeline's parameters: name to its declaration (`parameterType`, `defaultValue`...)."""
    params = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    declared = {}
    for name, decl in params.items():
        decl = dict(decl)
        if "parameterType" not in decl and "type" in decl:
            decl["parameterType"] = _LEGACY_TYPES.get(decl["type"], decl["type"])
        declared[name] = decl
    return declared


def parse_params(items: Sequence[str], declared: Mapping[str, Mapping]) -> dict[str, Any]:
    """`["k=v", ...]` to typed parameter values, checked against the pipeline's declarations.

    Raises:
        SubmitError: Malformed item, unknown or repeated name, wrong type, or a required
            parameter (no default) left out.
    """
    valid = ", ".join(sorted(declared)) or "(none)"
    values: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise SubmitError(f"--param takes name=value, got {item!r}")
        if name not in declared:
            raise SubmitError(f"unknown parameter {name!r}; this pipeline takes: {valid}")
        if name in values:
            raise SubmitError(f"--param {name} given twice")
        try:
            values[name] = parse_value(text, declared[name].get("parameterType", "STRING"))
        except ValueError as err:
            raise SubmitError(f"--param {name}: {err}") from None
    missing = sorted(n for n, d in declared.items()
                     if n not in values and "defaultValue" not in d and not d.get("isOptional"))
    if missing:
        raise SubmitError("missing required parameter(s): "
                          + ", ".join(f"--param {n}=..." for n in missing))
    return values
