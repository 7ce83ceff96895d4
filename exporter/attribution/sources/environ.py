"""The `environ` attribution source: allow-listed keys of /proc/<pid>/environ, which the
resolver reads, extracts and cleans. It must never read /proc itself."""

from __future__ import annotations

from collections.abc import Mapping

from exporter.attribution.sources.base import NO_ANSWER, PROC_ENVIRON, ProcessOnlySource, Query
from gpu_audit.model.attribution import SOURCE_ENVIRON


class EnvironSource(ProcessOnlySource):
    """Allow-listed keys of /proc/<pid>/environ (the resolver extracts and cleans them)."""

    name = SOURCE_ENVIRON
    proc_needs = frozenset({PROC_ENVIRON})

    def resolve(self, query: Query) -> Mapping[str, str]:
        return query.facts.environ if query.facts is not None else NO_ANSWER
