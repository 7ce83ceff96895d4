"""Attribution sources: each one answers some identity fields of a GPU process.

The resolver asks an ordered list of `AttributionSource`s, the first source that knows a
field winning it (docs/ATTRIBUTION.md). This module holds the protocol and the sources
that only look at the process itself (environ, cgroup, owner) or at the kubelet; the
job-mapping source lives with its reader (jobmap.py). Which name builds which source is
exporter/attribution/registry.py, the one place a source is added
(docs/CONTRIBUTING.md has the recipe).

What a source may read from /proc (uid, environ, cgroup) is read once per process
lifetime by the resolver and cached; a source says which of those it needs
(`proc_needs`) so nothing unused is read. A source must never raise for one process
(return {} instead), never block (a slow lookup belongs on its own thread, as the
kubelet's does) and never return anything but cleaned, bounded values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from exporter.attribution.config import AttributionConfig
from exporter.attribution.sanitize import clean_text
from gpu_audit.model.attribution import (
    SOURCE_CGROUP,
    SOURCE_ENVIRON,
    SOURCE_KUBELET,
    SOURCE_OWNER,
)
from gpu_audit.model.samples import ProcessSample

if TYPE_CHECKING:
    from exporter.attribution.kubelet import KubeletWatcher, PodRef

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


class _ProcessOnlySource:
    """Base of sources whose answers depend only on the process itself."""

    name = ""
    proc_needs: frozenset[str] = frozenset()

    def begin_cycle(self) -> int:
        return 0

    def stats(self) -> Mapping[str, int]:
        return {}

    def close(self) -> None:
        return None


class EnvironSource(_ProcessOnlySource):
    """Allow-listed keys of /proc/<pid>/environ (the resolver extracts and cleans them)."""

    name = SOURCE_ENVIRON
    proc_needs = frozenset({PROC_ENVIRON})

    def resolve(self, query: Query) -> Mapping[str, str]:
        return query.facts.environ if query.facts is not None else NO_ANSWER


class CgroupSource(_ProcessOnlySource):
    """Container, pod UID and Slurm job parsed from /proc/<pid>/cgroup."""

    name = SOURCE_CGROUP
    proc_needs = frozenset({PROC_CGROUP})

    def resolve(self, query: Query) -> Mapping[str, str]:
        return query.facts.cgroup if query.facts is not None else NO_ANSWER


class OwnerSource(_ProcessOnlySource):
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


class KubeletSource:
    """The kubelet's pod-resources map, refreshed on its own thread."""

    name = SOURCE_KUBELET
    proc_needs: frozenset[str] = frozenset()

    def __init__(self, config: AttributionConfig, clock: Callable[[], float]) -> None:
        # grpc costs ~150 ms to import: only nodes that use the kubelet pay for it.
        from exporter.attribution import kubelet  # noqa: PLC0415

        self._fields_for = kubelet.fields_for
        self._watcher: KubeletWatcher = kubelet.KubeletWatcher(
            config.kubelet, clock=clock, max_value_length=config.environ_value_max_length
        )
        self._map: Mapping[str, tuple[PodRef, ...]] = {}
        self._watcher.start()

    def begin_cycle(self) -> int:
        generation, self._map = self._watcher.current()
        return generation

    def resolve(self, query: Query) -> Mapping[str, str]:
        for uuid in query.uuids:
            refs = self._map.get(uuid)
            if refs:
                return self._fields_for(refs)
        return NO_ANSWER

    def refresh(self) -> bool:
        """Refresh the map now (tests, start-up); False when the refresh failed."""
        return self._watcher.refresh()

    def stats(self) -> Mapping[str, int]:
        return {
            "kubelet_errors": self._watcher.errors,
            "kubelet_refreshes": self._watcher.refreshes,
        }

    def close(self) -> None:
        self._watcher.close()


def proc_needs(sources: Sequence[AttributionSource]) -> frozenset[str]:
    """Every /proc fact some source needs."""
    needs: set[str] = set()
    for source in sources:
        needs |= source.proc_needs
    return frozenset(needs)
