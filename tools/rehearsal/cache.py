"""Vertex's execution cache, as a rehearsal keeps it across rehearsals (`--cache-index`).

A key (`cache_key`) seen in an earlier rehearsal reuses that run's outputs, their files
copied into this rehearsal's bucket folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from components.common.storage import read_json, write_json_atomically
from tools.rehearsal.records import ArtifactRef, saved_outputs


def cache_key(component: Mapping[str, Any], container: Mapping[str, Any],
              values: Mapping[str, Any], inputs: Mapping[str, ArtifactRef]) -> str:
    """The key (a short hex digest) a container task's outputs are cached under: its
    component's input and output definitions, its `container`, its input `values` and the
    names of its input artifacts (a new artifact is a new key)."""
    payload = {"component": {k: component.get(k) for k in ("inputDefinitions",
                                                            "outputDefinitions")},
               "container": container, "parameters": values,
               "artifacts": {k: a.name for k, a in inputs.items()}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


class TaskCache:
    """The cache entries of a rehearsal: read from the JSON file `index` (None: this
    rehearsal's only), saved back to it; `local` gives a gs:// URI's file here."""

    def __init__(self, index: str | None, local: Callable[[str], str]) -> None:
        self.index = index
        self.local = local
        self.entries: dict[str, Any] = (read_json(index, optional=True) or {}) if index else {}

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The outputs cached under `key` (their files copied here), None on a miss."""
        hit = self.entries.get(key)
        if not hit:
            return None
        for artifact in hit["artifacts"].values():  # to the same gs:// URIs: Vertex has one bucket
            source, target = artifact["path"], self.local(artifact["uri"])
            if os.path.exists(source) and not os.path.exists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if os.path.isdir(source):
                    shutil.copytree(source, target)
                else:
                    shutil.copy2(source, target)
        return {"parameters": hit["parameters"],
                "artifacts": {k: ArtifactRef(**{**a, "path": self.local(a["uri"])})
                              for k, a in hit["artifacts"].items()}}

    def store(self, key: str, result: Mapping[str, Any]) -> None:
        """Keeps a task's outputs (`{"parameters", "artifacts"}`) under `key`."""
        self.entries[key] = saved_outputs(result)

    def save(self) -> None:
        """Writes the entries to the index file, if there is one."""
        if self.index:
            os.makedirs(os.path.dirname(os.path.abspath(self.index)), exist_ok=True)
            write_json_atomically(self.index, self.entries)
