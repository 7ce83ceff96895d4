"""The attribution source interface: what the resolver asks a source (`Query`), what a
source answers, and which /proc facts it needs read.

What a source may read from /proc (uid, environ, cgroup) is read once per process
lifetime by the resolver and cached; a source says which of those it needs
(`proc_needs`) so nothing unused is read. A source must never raise for one process
(return {} instead), never block (a slow lookup belongs on its own thread, as the
kubelet's does) and never return anything but cleaned, bounded values. This module
holds no source itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpu_audit.model.samples import ProcessSample

# What a source can ask the resolver to read from /proc/<pid>.
PROC_UID = "uid"
PROC_ENVIRON = "environ"
PROC_CGROUP = "cgroup"

NO_ANSWER: Mapping[str, str] = {}


class ProcFacts(Protocol):
    """What /proc said about a process (read once per process lifetime)."""

    @property
    def uid(self) -> int | None: ...

    @property
    def environ(self) -> Mapping[str, str]: ...

    @property
    def cgroup(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class Query:
    """One process to attribute.

    `facts` is None when /proc could not be read (the process vanished, or no host
    /proc). `uuids` is the MIG instance's UUID first when the process runs on one, then
    the GPU's.
    """

    process: ProcessSample
    facts: ProcFacts | None
    uuids: tuple[str, ...]


class AttributionSource(Protocol):
    """One source of identity fields."""

    @property
    def name(self) -> str:
        """The name recorded in `Attribution.sources` for each field it wins."""
        ...

    @property
    def proc_needs(self) -> frozenset[str]:
        """The /proc facts (PROC_UID, PROC_ENVIRON, PROC_CGROUP) this source reads."""
        ...

    def begin_cycle(self) -> int:
        """Called once per cycle before any `resolve`. Returns a generation that changes
        whenever this source's answers may have changed (memoised answers are dropped);
        a source whose answers depend only on the process returns a constant."""
        ...

    def resolve(self, query: Query) -> Mapping[str, str]:
        """Identity field name (gpu_audit.model.attribution.IDENTITY_FIELDS) -> cleaned
        value, for what this source knows about the process; {} when nothing."""
        ...

    def stats(self) -> Mapping[str, int]:
        """Cumulative counters, merged into `Resolver.stats()`."""
        ...

    def close(self) -> None:
        """Release threads and handles."""
        ...


class ProcessOnlySource:
    """Base of sources whose answers depend only on the process itself."""

    name = ""
    proc_needs: frozenset[str] = frozenset()

    def begin_cycle(self) -> int:
        return 0

    def stats(self) -> Mapping[str, int]:
        return {}

    def close(self) -> None:
        return None



def proc_needs(sources: Sequence[AttributionSource]) -> frozenset[str]:
    """Every /proc fact some source needs."""
    needs: set[str] = set()
    for source in sources:
        needs |= source.proc_needs
    return frozenset(needs)
