"""The resolver: ties every GPU process of a cycle to its user, project, job, container,
pod and Slurm job, and records which source gave each answer.

Sources (see docs/ATTRIBUTION.md), asked in the configured order of precedence, the first
that knows a field winning it: the job-mapping directory, allow-listed environ keys, the
cgroup path, the process owner, and the kubelet's pod-resources map.

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

This module must never raise out of attribute() because of a process (vanished,
unreadable, garbage in its files), never block on the kubelet, and never store or log
any environment variable other than the allow-listed ones' cleaned values.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.attribution import procfs
from exporter.attribution.cgroup import parse_cgroup
from exporter.attribution.config import AttributionConfig
from exporter.attribution.environ import EnvironMapping
from exporter.attribution.jobmap import JobMap
from exporter.attribution.sanitize import clean_text
from exporter.attribution.users import CachedLookup, UserLookup, passwd_file_lookup, system_lookup
from gpu_audit.model.attribution import (
    SOURCE_CGROUP,
    SOURCE_ENVIRON,
    SOURCE_JOBMAP,
    SOURCE_KUBELET,
    SOURCE_OWNER,
    AttributedProcess,
    Attribution,
)
from gpu_audit.model.samples import GpuSample, ProcessSample

if TYPE_CHECKING:
    from exporter.attribution.kubelet import KubeletWatcher, PodRef

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
    memo: dict[tuple[object, ...], Attribution] = field(default_factory=dict)


_Generation = tuple[int, int]


class Resolver:
    """Attribution for the processes of each sampling cycle."""

    def __init__(
        self,
        config: AttributionConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        user_lookup: UserLookup | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._root = str(config.procfs_root)
        self._sources = config.sources
        self._want_environ = SOURCE_ENVIRON in config.sources
        self._want_cgroup = SOURCE_CGROUP in config.sources
        self._want_owner = SOURCE_OWNER in config.sources
        self._max_length = config.environ_value_max_length
        self._environ = EnvironMapping.build(
            config.environ_keys, config.environ_fields, config.environ_value_max_length
        )
        if user_lookup is None:
            user_lookup = (
                passwd_file_lookup(config.passwd_file) if config.passwd_file else system_lookup
            )
        self._users = CachedLookup(user_lookup)
        self._jobmap: JobMap | None = None
        if SOURCE_JOBMAP in config.sources:
            self._jobmap = JobMap(
                config.jobmap_dir,
                max_file_bytes=config.jobmap_max_file_bytes,
                max_value_length=config.environ_value_max_length,
                wall_clock=wall_clock,
            )
        self._kubelet: KubeletWatcher | None = None
        if SOURCE_KUBELET in config.sources and config.kubelet.enabled:
            # grpc costs ~150 ms to import: only nodes that use the kubelet pay for it.
            from exporter.attribution import kubelet  # noqa: PLC0415

            self._kube_fields = kubelet.fields_for
            self._kubelet = kubelet.KubeletWatcher(
                config.kubelet, clock=clock, max_value_length=config.environ_value_max_length
            )
            self._kubelet.start()
        self._cache: dict[int, _ProcEntry] = {}
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
        if self._jobmap is not None:
            self._jobmap.refresh()
        kube_gen, kube_map = (0, {}) if self._kubelet is None else self._kubelet.current()
        generation = (self._jobmap.generation if self._jobmap else 0, kube_gen)
        seen: dict[int, _ProcEntry | None] = {}
        out: dict[str, tuple[AttributedProcess, ...]] = {}
        cache = self._cache
        stat = os.stat
        hits = 0
        try:
            for gpu in gpus:
                uuid = gpu.info.uuid
                mig = {m.gpu_instance_id: m.uuid for m in gpu.mig} if gpu.mig else None
                plain: tuple[str, ...] = (uuid,)
                plain_key = (plain, generation)
                results = []
                for proc in gpu.processes:
                    pid = proc.pid
                    uuids, key = plain, plain_key
                    gi = proc.gpu_instance_id
                    if mig and gi is not None and gi in mig:
                        # A MIG instance may be allocated on its own: ask about it first.
                        uuids = (mig[gi], uuid)
                        key = (uuids, generation)
                    try:
                        if pid in seen:
                            entry = seen[pid]
                        else:
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
                            attribution = self._resolve(proc, entry, uuids, generation, kube_map)
                    except Exception as exc:  # noqa: BLE001 - one process must not cost the cycle
                        self._count_and_log_once(
                            "attribution_errors",
                            "attributing pid %d failed (%s); reported as unattributed",
                            pid,
                            type(exc).__name__,
                        )
                        attribution = Attribution()
                    results.append(AttributedProcess(uuid, proc, attribution))
                out[uuid] = tuple(results)
        finally:
            self._counters["cache_hits"] += hits
        for pid in [p for p in cache if p not in seen]:
            del cache[pid]
            self._counters["evictions"] += 1
        return out

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
        }
        out.update(self._counters)
        if self._jobmap is not None:
            out["jobmap_errors"] = self._jobmap.errors
            out["jobmap_reloads"] = self._jobmap.reloads
        if self._kubelet is not None:
            out["kubelet_errors"] = self._kubelet.errors
            out["kubelet_refreshes"] = self._kubelet.refreshes
        return out

    def refresh_kubelet(self) -> bool:
        """Refresh the kubelet map now (tests, start-up); False when disabled or failed."""
        return self._kubelet.refresh() if self._kubelet is not None else False

    def close(self) -> None:
        """Stop the kubelet thread; the resolver must not be used afterwards."""
        if self._kubelet is not None:
            self._kubelet.close()
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
        try:
            if self._want_owner:
                try:
                    uid = procfs.read_real_uid(paths)
                except procfs.ProcError as exc:
                    if exc.kind == procfs.VANISHED:
                        raise
                    self._proc_failed(pid, exc)
            if self._want_environ:
                environ = self._read_environ(pid, paths)
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
        return _ProcEntry(start, uid, environ, cgroup)

    def _read_environ(self, pid: int, paths: procfs.ProcPaths) -> dict[str, str]:
        try:
            data, complete = procfs.read_bounded(paths.environ, self._config.environ_max_bytes)
        except procfs.ProcError as exc:
            if exc.kind == procfs.DENIED:
                # Expected without CAP_SYS_PTRACE for other users' processes: quiet.
                self._counters["environ_denied"] += 1
                return {}
            if exc.kind == procfs.VANISHED:
                raise
            self._proc_failed(pid, exc)
            return {}
        if not complete:
            self._counters["environ_truncated"] += 1
        return self._environ.extract(data, complete=complete)

    # -- merging ----------------------------------------------------------------------

    def _resolve(
        self,
        proc: ProcessSample,
        entry: _ProcEntry | None,
        uuids: tuple[str, ...],
        generation: _Generation,
        kube_map: Mapping[str, tuple[PodRef, ...]],
    ) -> Attribution:
        key = (uuids, generation)
        if entry is not None:
            memo = entry.memo.get(key)
            if memo is not None:
                return memo
        fields: dict[str, str] = {}
        sources: dict[str, str] = {}
        for source in self._sources:
            for name, value in self._source_fields(source, proc, entry, uuids, kube_map).items():
                if name not in fields:
                    fields[name] = value
                    sources[name] = source
        attribution = Attribution(**fields, sources=sources)
        if entry is not None:
            if len(entry.memo) >= _MEMO_LIMIT:
                entry.memo.clear()
            entry.memo[key] = attribution
        return attribution

    def _source_fields(
        self,
        source: str,
        proc: ProcessSample,
        entry: _ProcEntry | None,
        uuids: tuple[str, ...],
        kube_map: Mapping[str, tuple[PodRef, ...]],
    ) -> Mapping[str, str]:
        if source == SOURCE_JOBMAP:
            if self._jobmap is None:
                return {}
            record, ambiguous = self._jobmap.lookup(proc.pid, uuids)
            if ambiguous:
                self._counters["jobmap_ambiguous"] += 1
            return record.fields if record is not None else {}
        if source == SOURCE_ENVIRON:
            return entry.environ if entry is not None else {}
        if source == SOURCE_CGROUP:
            return entry.cgroup if entry is not None else {}
        if source == SOURCE_OWNER:
            return self._owner(proc, entry)
        if source == SOURCE_KUBELET:
            for uuid in uuids:
                refs = kube_map.get(uuid)
                if refs:
                    return self._kube_fields(refs)
            return {}
        return {}

    def _owner(self, proc: ProcessSample, entry: _ProcEntry | None) -> dict[str, str]:
        uid = entry.uid if entry is not None else None
        if uid is None and entry is None:
            # The process is gone or unreadable: fall back to what the backend reported.
            uid = proc.uid
            if uid is None and proc.identity is not None:
                uid = proc.identity.uid
        if uid is None:
            return {}
        name = self._users(uid)
        text = clean_text(name, self._max_length) if name else ""
        return {"user": text or f"uid:{uid}"}
