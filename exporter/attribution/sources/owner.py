"""The `owner` attribution source: the user owning the process, its real uid's name (or
uid:<n>). It must never answer a name it did not clean, nor fail for a uid with no
name."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from exporter.attribution.sanitize import clean_text
from exporter.attribution.sources.base import NO_ANSWER, PROC_UID, ProcessOnlySource, Query
from gpu_audit.model.attribution import SOURCE_OWNER


class OwnerSource(ProcessOnlySource):
    """The user owning the process: its real uid's name, or uid:<n>."""

    name = SOURCE_OWNER
    proc_needs = frozenset({PROC_UID})

    def __init__(self, users: Callable[[int], str | None], max_length: int) -> None:
        self._users = users
        self._max_length = max_length

    def resolve(self, query: Query) -> Mapping[str, str]:
        facts, proc = query.facts, query.process
        uid = facts.uid if facts is not None else None
        if uid is None and facts is None:
            # The process is gone or unreadable: fall back to what the backend reported.
            uid = proc.uid
            if uid is None and proc.identity is not None:
                uid = proc.identity.uid
        if uid is None:
            return NO_ANSWER
        name = self._users(uid)
        text = clean_text(name, self._max_length) if name else ""
        return {"user": text or f"uid:{uid}"}
