"""What the parts of a rehearsal hand each other: its error, task records and artifacts.

Kept apart from the logic so that every module of `rehearsal` can use them
without importing another's.
"""

from __future__ import annotations

import dataclasses
from typing import Any


class RehearsalError(RuntimeError):
    """The compiled pipeline cannot run as Vertex would run it; the message says where."""


@dataclasses.dataclass
class TaskRecord:
    """What the rehearsal reports of one task (`summary.json`'s `rehearsal.tasks`)."""

    name: str
    display_name: str
    state: str = "pending"  # succeeded, cached, skipped, not-executed, failed
    cache: str = "disabled"  # disabled, miss, hit
    cache_key: str = ""
    replicas: int = 0
    attempts: int = 0
    seconds: float = 0.0
    note: str = ""


@dataclasses.dataclass
class ArtifactRef:
    """An artifact as the rehearsal passes it on: its gs:// URI and the local folder."""

    name: str
    uri: str
    schema_title: str
    metadata: dict[str, Any]
    path: str

    @classmethod
    def of(cls, artifact: dict[str, Any], path: str, uri: str | None = None,
           metadata: dict[str, Any] | None = None) -> ArtifactRef:
        """The artifact an executor input lists (`{"name", "type", "uri", ...}`).

        Args:
            artifact: One entry of an executor input's `artifacts` list.
            path: The local file or folder behind its URI.
            uri: The URI the task wrote, when it changed the planned one.
            metadata: Its metadata (none by default, as for a planned output).

        Returns:
            The reference.
        """
        return cls(name=artifact["name"], uri=artifact["uri"] if uri is None else uri,
                   schema_title=artifact["type"]["schemaTitle"],
                   metadata={} if metadata is None else metadata, path=path)
