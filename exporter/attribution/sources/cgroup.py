"""The `cgroup` attribution source: container, pod UID and Slurm job, parsed by the
resolver from /proc/<pid>/cgroup. It must never read /proc itself."""

from __future__ import annotations

from collections.abc import Mapping

from exporter.attribution.sources.base import NO_ANSWER, PROC_CGROUP, ProcessOnlySource, Query
from gpu_audit.model.attribution import SOURCE_CGROUP


class CgroupSource(ProcessOnlySource):
    """Container, pod UID and Slurm job parsed from /proc/<pid>/cgroup."""

    name = SOURCE_CGROUP
    proc_needs = frozenset({PROC_CGROUP})

    def resolve(self, query: Query) -> Mapping[str, str]:
        return query.facts.cgroup if query.facts is not None else NO_ANSWER
