"""The resolver: ties every GPU process of a cycle to its user, project, job, container,
pod and Slurm job, and records which source gave each answer.

Sources (exporter.attribution.sources, docs/ATTRIBUTION.md) are an ordered list of
`AttributionSource` objects, asked in order of precedence, the first that knows a field
winning it: by default those the configuration names, built by name from
exporter/attribution/registry.py (the job-mapping directory, allow-listed environ keys,
the cgroup path, the process owner, the kubelet's pod-resources map), which is where a
new source is added. `Resolver(config, sources=[...])` asks the given list instead.

Cost per cycle is one stat(2) of /proc/<pid>/stat per process: a pid's environ,
cgroup and owner never change during its lifetime, so they are read once and cached
under (pid, start time); a changed start time means the pid was reused. The start time
itself is re-read only when the stat file's identity (device, inode, mtime, ctime, size)
changed since it was last read. On procfs a pid's files get a new inode when the pid is
reused (the old dentries die with the old task); on a fake /proc made of plain files any
rewrite changes the inode or the times. A file younger than _RACY_SECONDS is never
trusted (the "racy clean" rule): filesystem timestamps are coarse, so a rewrite within
the same tick could leave the times unchanged. Pids not seen in a cycle are evicted.
Answers are memoised per process until the job map or kubelet map changes: the same
Attribution object is handed out each cycle, which lets the audit builder reuse its
serialised form.

What a process runs (the CUDA and framework libraries in /proc/<pid>/maps,
exporter.attribution.software) is read with the rest, once per (pid, start time), with
the byte cap `maps_max_bytes`, and handed out as AttributedProcess.software. It is
never an input to attribution: a maps file that cannot be read or parsed leaves
`software` None and changes no answer.

This module must never raise out of attribute() because of a process (vanished,
unreadable, garbage in its files), never block on the kubelet, and never store or log
any environment variable other than the allow-listed ones' cleaned values (and, with
`software` on, the image keys' values that are image references).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.attribution import procfs
from exporter.attribution.cgroup import parse_cgroup
from exporter.attribution.config import AttributionConfig
from exporter.attribution.environ import EnvironMapping
from exporter.attribution.registry import build_sources
from exporter.attribution.software import image_from_environ, parse_maps
from exporter.attribution.sources.base import (
    PROC_CGROUP,
    PROC_ENVIRON,
    PROC_UID,
    AttributionSource,
    Query,
    proc_needs,
)
from exporter.attribution.sources.kubelet import KubeletSource
from exporter.attribution.users import UserLookup
from gpu_audit.model.attribution import AttributedProcess, Attribution, Software
from gpu_audit.model.samples import GpuSample, ProcessSample

log = logging.getLogger(__name__)

_MEMO_LIMIT = 8  # memoised answers per pid: one per GPU it runs on, a few generations
# A stat file modified less than this long before it was stat'ed is re-read next cycle:
# well above the coarsest filesystem timestamp tick (10 ms at HZ=100).
_RACY_SECONDS = 0.1

_StatKey = tuple[int, int, int, int, int]


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


@dataclass(slots=True, eq=False)
class _ProcEntry:
    """What /proc said about one pid during its lifetime. Holds no raw file contents."""

    start: int | None
    uid: int | None
    environ: dict[str, str]
    cgroup: dict[str, str]
    stat_path: str = ""
    # Identity of the stat file when `start` was read from it; None: read it again.
    stat_key: _StatKey | None = None
    memo: dict[_MemoKey, Attribution] = field(default_factory=dict)
    # Recognised libraries from its maps file (read once), None when unknown.
    software: Software | None = None
    image: str = ""  # the container image its environment names (software on)


_Generation = tuple[int, ...]


class _MemoKey:
    """Names one (GPU uuids, source generation) pair; compared by identity."""

    __slots__ = ()


_UNSEEN = _ProcEntry(None, None, {}, {})  # `seen` has no entry for the pid yet


class Resolver:
    """Attribution for the processes of each sampling cycle."""

    def __init__(
        self,
        config: AttributionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        user_lookup: UserLookup | None = None,
        wall_clock: Callable[[], float] = time.time,
        sources: Sequence[AttributionSource] | None = None,
    ) -> None:
        """`sources`: the ordered sources to ask, any objects implementing
        `AttributionSource`; by default `build_sources(config)` (exporter/attribution/
        registry.py: the sources `config.sources` names), which alone uses `clock`,
        `user_lookup` and `wall_clock`."""
        self._config = config
        self._root = str(config.procfs_root)
        if sources is None:
            sources = build_sources(
                config, clock=clock, user_lookup=user_lookup, wall_clock=wall_clock
            )
        self._sources: tuple[AttributionSource, ...] = tuple(sources)
        needs = proc_needs(self._sources)
        self._want_environ = PROC_ENVIRON in needs
        self._want_cgroup = PROC_CGROUP in needs
        self._want_owner = PROC_UID in needs
        self._want_software = config.software
        self._environ = EnvironMapping.build(
            config.environ_keys, config.environ_fields, config.environ_value_max_length
        )
        self._cache: dict[int, _ProcEntry] = {}
        self._keys: dict[tuple[str, ...], _MemoKey] = {}
        self._keys_generation: _Generation | None = None
        self._counters: Counter[str] = Counter()
        self._logged: set[str] = set()
        if not os.path.isdir(self._root):
            log.warning(
                "procfs root %s is not a directory: processes cannot be attributed beyond "
                "what NVML reports (mount the host's /proc and set procfs_root)",
                self._root,
            )

    # -- public API ---------------------------------------------------------------

    def attribute(self, gpus: Sequence[GpuSample]) -> dict[str, tuple[AttributedProcess, ...]]:
        """One AttributedProcess per ProcessSample, per GPU uuid, in order. Never raises
        because of a process."""
        self._counters["cycles"] += 1
        generation = tuple(source.begin_cycle() for source in self._sources)
        seen: dict[int, _ProcEntry | None] = {}
        out: dict[str, tuple[AttributedProcess, ...]] = {}
        cache = self._cache
        stat = os.stat
        memo_key = self._memo_key
        hits = 0
        try:
            for gpu in gpus:
                uuid = gpu.info.uuid
                mig = {m.gpu_instance_id: m.uuid for m in gpu.mig} if gpu.mig else None
                plain: tuple[str, ...] = (uuid,)
                plain_key = memo_key(plain, generation)
                results: list[AttributedProcess] = []
                append = results.append
                for proc in gpu.processes:
                    pid = proc.pid
                    uuids, key = plain, plain_key
                    gi = proc.gpu_instance_id
                    if mig and gi is not None and gi in mig:
                        # A MIG instance may be allocated on its own: ask about it first.
                        uuids = (mig[gi], uuid)
                        key = memo_key(uuids, generation)
                    try:
                        entry = seen.get(pid, _UNSEEN)
                        if entry is _UNSEEN:
                            # Hot path: a cached pid whose stat file is unchanged.
                            entry = cache.get(pid)
                            if entry is not None and entry.stat_key is not None:
                                try:
                                    st = stat(entry.stat_path)
                                except OSError:
                                    entry = self._entry(pid)
                                else:
                                    if entry.stat_key == (st.st_dev, st.st_ino, st.st_mtime_ns,
                                                          st.st_ctime_ns, st.st_size):
                                        hits += 1
                                    else:
                                        entry = self._entry(pid, st)
                            else:
                                entry = self._entry(pid)
                            seen[pid] = entry
                        attribution = entry.memo.get(key) if entry is not None else None
                        if attribution is None:
                            attribution = self._resolve(proc, entry, uuids, generation, key)
                        software = entry.software if entry is not None else None
                    except Exception as exc:  # noqa: BLE001 - one process must not cost the cycle
                        self._count_and_log_once(
                            "attribution_errors",
                            "attributing pid %d failed (%s); reported as unattributed",
                            pid,
                            type(exc).__name__,
                        )
                        attribution = Attribution()
                        software = None
                    append(AttributedProcess(uuid, proc, attribution, software))
                out[uuid] = tuple(results)
        finally:
            self._counters["cache_hits"] += hits
        for pid in cache.keys() - seen.keys():  # one C-level pass over both
            del cache[pid]
            self._counters["evictions"] += 1
        return out

    def _memo_key(self, uuids: tuple[str, ...], generation: _Generation) -> _MemoKey:
        """The one key object for (GPU uuids, source generation): memoised answers are
        looked up by its identity hash, once per process per cycle, rather than by
        hashing the nested tuple each time. Interned while the generation
        lasts; a new generation starts a new table (old answers no longer match)."""
        if generation != self._keys_generation:
            self._keys_generation = generation
            self._keys = {}
        key = self._keys.get(uuids)
        if key is None:
            key = self._keys[uuids] = _MemoKey()
        return key

    def stats(self) -> Mapping[str, int]:
        """Cumulative counters since start (cache_hits, cache_misses, proc_vanished, ...)."""
        out: dict[str, int] = {
            "cycles": 0,
            "cache_hits": 0,
            "cache_misses": 0,
            "evictions": 0,
            procfs.VANISHED: 0,
            procfs.DENIED: 0,
            procfs.LOOP: 0,
            procfs.OTHER: 0,
            procfs.PARSE: 0,
            "environ_denied": 0,
            "environ_truncated": 0,
            "jobmap_errors": 0,
            "jobmap_reloads": 0,
            "jobmap_ambiguous": 0,
            "kubelet_errors": 0,
            "kubelet_refreshes": 0,
            "attribution_errors": 0,
            "software_reads": 0,
            "software_truncated": 0,
            "software_denied": 0,
            "software_errors": 0,
        }
        out.update(self._counters)
        for source in self._sources:
            out.update(source.stats())
        return out

    def refresh_kubelet(self) -> bool:
        """Refresh the kubelet map now (tests, start-up); False when disabled or failed."""
        for source in self._sources:
            if isinstance(source, KubeletSource):
                return source.refresh()
        return False

    def close(self) -> None:
        """Stop the kubelet thread; the resolver must not be used afterwards."""
        for source in self._sources:
            source.close()
        self._cache.clear()

    def __repr__(self) -> str:
        # Never the cache contents: they hold environment values.
        return f"Resolver(procfs_root={self._root!r}, cached_pids={len(self._cache)})"

    # -- /proc ----------------------------------------------------------------------

    def _count_and_log_once(self, kind: str, msg: str, *args: object) -> None:
        self._counters[kind] += 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(msg + " (logged once per kind; see attribution stats)", *args)

    def _proc_failed(self, pid: int, exc: procfs.ProcError) -> None:
        if exc.kind == procfs.VANISHED:
            # Normal: the process exited between the NVML call and this read.
            self._counters[exc.kind] += 1
            return
        self._count_and_log_once(
            exc.kind,
            "cannot read %s/%d (%s, errno %d)",
            self._root,
            pid,
            exc.kind,
            exc.err,
        )

    def _entry(self, pid: int, st: os.stat_result | None = None) -> _ProcEntry | None:
        """The cache entry of `pid`, read or re-validated; `st`: a stat of its stat file
        taken just now, if the caller has one."""
        cached = self._cache.get(pid)
        stat_path = cached.stat_path if cached is not None else f"{self._root}/{pid}/stat"
        if st is None:
            try:
                st = os.stat(stat_path)
            except OSError as exc:
                self._proc_failed(pid, procfs.classify(exc))
                self._cache.pop(pid, None)
                return None
        key = _stat_key(st)
        if cached is not None and cached.stat_key == key:
            # The very file the start time came from, untouched since: same process.
            self._counters["cache_hits"] += 1
            return cached
        # Trust this stat only when the file is older than a timestamp tick (see top).
        trusted = key if time.time() - st.st_mtime_ns / 1e9 > _RACY_SECONDS else None
        start: int | None
        try:
            start = procfs.read_start_time(stat_path)
        except procfs.ProcError as exc:
            self._proc_failed(pid, exc)
            if exc.kind != procfs.PARSE:
                self._cache.pop(pid, None)
                return None
            start = None  # garbage in stat: read the rest, but do not cache
        if cached is not None and start is not None and cached.start == start:
            self._counters["cache_hits"] += 1
            cached.stat_key = trusted
            return cached
        self._counters["cache_misses"] += 1
        entry = self._read(pid, procfs.ProcPaths.for_pid(self._root, pid), start)
        if entry is not None and start is not None:
            if self._want_software:
                # Only for an entry that will be cached: once per process lifetime.
                entry.software = self._read_software(pid, start, entry.image)
            entry.stat_path = stat_path
            entry.stat_key = trusted
            self._cache[pid] = entry
        else:
            self._cache.pop(pid, None)
        return entry

    def _read(self, pid: int, paths: procfs.ProcPaths, start: int | None) -> _ProcEntry | None:
        uid: int | None = None
        environ: dict[str, str] = {}
        cgroup: dict[str, str] = {}
        image = ""
        try:
            if self._want_owner:
                try:
                    uid = procfs.read_real_uid(paths)
                except procfs.ProcError as exc:
                    if exc.kind == procfs.VANISHED:
                        raise
                    self._proc_failed(pid, exc)
            if self._want_environ:
                environ, image = self._read_environ(pid, paths)
            if self._want_cgroup:
                try:
                    cgroup = parse_cgroup(procfs.read_cgroup(paths)).fields()
                except procfs.ProcError as exc:
                    if exc.kind == procfs.VANISHED:
                        raise
                    self._proc_failed(pid, exc)
        except procfs.ProcError as exc:
            self._proc_failed(pid, exc)
            return None
        return _ProcEntry(start, uid, environ, cgroup, image=image)

    def _read_environ(self, pid: int, paths: procfs.ProcPaths) -> tuple[dict[str, str], str]:
        """(allow-listed identity fields, the container image it names or "")."""
        try:
            data, complete = procfs.read_bounded(paths.environ, self._config.environ_max_bytes)
        except procfs.ProcError as exc:
            if exc.kind == procfs.DENIED:
                # Expected without CAP_SYS_PTRACE for other users' processes: quiet.
                self._counters["environ_denied"] += 1
                return {}, ""
            if exc.kind == procfs.VANISHED:
                raise
            self._proc_failed(pid, exc)
            return {}, ""
        if not complete:
            self._counters["environ_truncated"] += 1
        return self._environ.extract(data, complete=complete), self._image(pid, data, complete)

    def _image(self, pid: int, data: bytes, complete: bool) -> str:
        if not self._want_software:
            return ""
        try:
            return image_from_environ(data, complete=complete)
        except Exception as exc:  # noqa: BLE001 - the image must never cost attribution
            self._count_and_log_once(
                "software_errors", "reading the image of pid %d failed (%s)",
                pid, type(exc).__name__,
            )
            return ""

    def _read_software(self, pid: int, start: int, image: str) -> Software | None:
        """The libraries in the maps file of the process (pid, start) and the `image` its
        environment named, or None when neither is known. Never raises: what runs is a
        record's detail, never a reason to lose the process."""
        libraries = self._read_libraries(pid, start)
        if not image:
            return libraries
        if libraries is None:
            return Software(image=image)
        return Software(libraries.loaded, libraries.libraries, image)

    def _read_libraries(self, pid: int, start: int) -> Software | None:
        limit = self._config.maps_max_bytes
        try:
            data, complete = procfs.read_maps(self._root, pid, start, limit)
            self._counters["software_reads"] += 1
            if not complete:
                self._count_and_log_once(
                    "software_truncated",
                    "the maps file of pid %d is over maps_max_bytes (%d): libraries listed "
                    "after it are not seen",
                    pid,
                    limit,
                )
            return parse_maps(data, complete=complete)
        except procfs.ProcError as exc:
            if exc.kind == procfs.VANISHED:
                self._counters[procfs.VANISHED] += 1
            elif exc.kind == procfs.DENIED:
                # Reading another user's maps needs ptrace read access (root has it).
                self._counters["software_denied"] += 1
            else:
                self._count_and_log_once(
                    "software_errors", "cannot read the maps file of pid %d (%s, errno %d)",
                    pid, exc.kind, exc.err,
                )
        except Exception as exc:  # noqa: BLE001 - a parsing bug must not cost attribution
            self._count_and_log_once(
                "software_errors", "reading the maps file of pid %d failed (%s)",
                pid, type(exc).__name__,
            )
        return None

    # -- merging ----------------------------------------------------------------------

    def _resolve(
        self,
        proc: ProcessSample,
        entry: _ProcEntry | None,
        uuids: tuple[str, ...],
        generation: _Generation,
        key: _MemoKey,
    ) -> Attribution:
        if entry is not None:
            memo = entry.memo.get(key)
            if memo is not None:
                return memo
        fields: dict[str, str] = {}
        sources: dict[str, str] = {}
        query = Query(proc, entry, uuids)
        for source in self._sources:
            name = source.name
            for field_name, value in source.resolve(query).items():
                if field_name not in fields:
                    fields[field_name] = value
                    sources[field_name] = name
        attribution = Attribution(**fields, sources=sources)
        if entry is not None:
            if len(entry.memo) >= _MEMO_LIMIT:
                entry.memo.clear()
            entry.memo[key] = attribution
        return attribution
