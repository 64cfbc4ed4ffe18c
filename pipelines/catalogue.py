"""The pipelines by kind: how each is built, what its data parameter is, how a run of it is
summarised. The one table the tools (`run_local`, `tune_local`, `rehearsal`) read."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pipelines.definitions import image, lm, text, transformer

_MODULES = {"image": image, "text": text, "lm": lm, "transformer": transformer}
BUILDERS: Mapping[str, Callable] = {kind: module.build for kind, module in _MODULES.items()}
# The parameter a run's input fills (`--data` of run_local).
DATA_PARAMETERS: Mapping[str, str] = {"image": "data_uri", "text": "data_uri",
                                      "lm": "corpus_uri", "transformer": "data_uri"}
# A run's outputs (artifacts by name) -> its summary.json, by kind.
SUMMARIES: Mapping[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "image": image.summarize, "text": text.summarize_run,
    "lm": functools.partial(text.summarize_run, summarize_artifacts=lm.summarize),
    "transformer": functools.partial(text.summarize_run, summarize_artifacts=transformer.summarize)}
# The same by the compiled pipeline's name (pipelineInfo.name), tuning variants included.
SUMMARIES_BY_NAME = {name: SUMMARIES[kind] for kind, module in _MODULES.items()
                     for name in (module.PIPELINE_NAME, getattr(module, "TUNING_PIPELINE_NAME", ""))
                     if name}
