"""The families rendered from a GPU's processes, in one pass over them per cycle.

Per identity label set (user, project, job, namespace, pod, container, Slurm job,
process name[, pid]): memory, SM / memory / encoder / decoder utilisation and the process
count (`gpu_process_*`), capped per GPU; per GPU: the memory and utilisation no
attributed process explains (`gpu_unattributed_*`), one `gpu_allocation_info` per
owner, the owners for `gpu_owner_info`, and the MIG slice weights.

One pass (512 processes per cycle at 8 GPUs x 64): what each Attribution
contributes (its identity labels, whether it is attributed, its allocation key and
source, its owner) is worked out once per Attribution object and kept while the resolver
hands that object out; a process alone under its label set (the common case) is written
straight from its sample; line starts come from the LabelCache and only values are
formatted.

This module must never do I/O, keep state across cycles outside the LabelCache, or emit
NaN/Inf: NaN/Inf from a backend means "not measured", which neither sums nor poisons a sum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from exporter.exposition import families as fam
from exporter.exposition.lines import Family, LabelCache, fixed, join_labels, num
from exporter.owners import Owner
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.mig import process_weights
from gpu_audit.model.samples import GpuSample, ProcessSample

PROC_LABELS = (*(label for label, _ in fam.PROCESS_IDENTITY_LABELS), "process_name")
ALLOC_LABELS = ("job", "user", "project", "namespace", "pod", "container", "slurm_job",
                "source")
_isfinite = math.isfinite
# The text of each ratio NVML can report (a whole percent / 100) below 1, as num()
# writes it: a lookup instead of formatting a float per series per cycle. Any other
# value is formatted as before.
_RATIO_TEXT = {k / 100.0: num(k / 100.0) for k in range(100)}

# What one Attribution contributes to the process families, worked out once per
# Attribution object: (the attribution, identity label values, attributed?, owner or
# None, [allocation source, filled when an allocation line first needs it]). A tuple,
# not an object: building it is on the path of every process the first time. The
# allocation labels are the identity's values in another order, so the identity also
# names the allocation (one line per distinct identity and GPU).
_Facts = tuple[Attribution, tuple[str, ...], bool, "Owner | None", list[str | None]]


def _facts_of(a: Attribution) -> _Facts:
    owner = (a.user, a.project, a.job, a.slurm_job_id)
    return (a,
            (a.user, a.project, a.job, a.k8s_namespace, a.k8s_pod, a.k8s_container,
             a.slurm_job_id),
            a.attributed,
            owner if any(owner) else None,
            [None])


def allocation_source(a: Attribution) -> str:
    """The source that named the allocation: the job's, else the user's, else the first
    of the Slurm job, pod, project and container that is known."""
    srcs = a.sources
    if a.job and "job" in srcs:
        return srcs["job"]
    if a.user and "user" in srcs:
        return srcs["user"]
    for name in ("slurm_job_id", "k8s_pod", "project", "container_id"):
        if getattr(a, name) and name in srcs:
            return srcs[name]
    return "unknown"


def _plus(total: float | None, value: float | None) -> float | None:
    if value is None or not _isfinite(value):
        return total
    return value if total is None else total + value


class _Agg:
    """Sums over the processes sharing one identity label set."""

    __slots__ = ("count", "dec", "enc", "mem", "memu", "sm")

    def __init__(self, p: ProcessSample) -> None:
        # NaN/Inf mean "not measured" (written out: one per identity per cycle)
        isfinite = _isfinite
        v: float | None = p.used_memory_bytes
        self.mem = v if v is not None and isfinite(v) else None
        v = p.sm_util_ratio
        self.sm = v if v is not None and isfinite(v) else None
        v = p.memory_util_ratio
        self.memu = v if v is not None and isfinite(v) else None
        v = p.encoder_util_ratio
        self.enc = v if v is not None and isfinite(v) else None
        v = p.decoder_util_ratio
        self.dec = v if v is not None and isfinite(v) else None
        self.count = 1

    def add(self, p: ProcessSample) -> None:
        self.count += 1
        self.mem = _plus(self.mem, p.used_memory_bytes)
        self.sm = _plus(self.sm, p.sm_util_ratio)
        self.memu = _plus(self.memu, p.memory_util_ratio)
        self.enc = _plus(self.enc, p.encoder_util_ratio)
        self.dec = _plus(self.dec, p.decoder_util_ratio)


def _ratio(v: float) -> str:
    # ratios capped at 1 ("1" is what num writes for 1.0)
    text = _RATIO_TEXT.get(v)
    if text is None:
        text = "1" if v >= 1.0 else num(v)
    return text


def _line_prefixes(fams: Sequence[Family], prefix: str, names: tuple[str, ...],
                   key: tuple[str, ...]) -> tuple[str, ...]:
    labels = join_labels(prefix, names, key)
    return tuple(f"{f.name}{{{labels}}} " for f in fams)


class ProcessFamilies:
    """Collects the process-derived families of one render, GPU by GPU (`gpu()`, in
    the order the GPUs are rendered)."""

    def __init__(self, cache: LabelCache, *, pid_label: bool, max_series_per_gpu: int,
                 remember: bool = True) -> None:
        """`remember`: keep what each Attribution contributes in `cache` for the next
        render; False for a one-off render (a cache nobody keeps), where holding it
        until the render ends would only feed the garbage collector."""
        self.cache = cache
        self.remember = remember
        self.pid_label = pid_label
        self.cap = max(0, max_series_per_gpu)
        self.names = (*PROC_LABELS, "pid") if pid_label else PROC_LABELS
        self.mem, self.sm = fixed(fam.PROCESS_MEMORY), fixed(fam.PROCESS_SM)
        self.memu, self.enc = fixed(fam.PROCESS_MEM_UTIL), fixed(fam.PROCESS_ENC)
        self.dec, self.count = fixed(fam.PROCESS_DEC), fixed(fam.PROCESS_COUNT)
        self.weight = fixed(fam.PROCESS_MIG_WEIGHT)
        self.unattributed_mem = fixed(fam.UNATTRIBUTED_MEMORY)
        self.unattributed_util = fixed(fam.UNATTRIBUTED_UTIL)
        self.allocation = fixed(fam.ALLOCATION_INFO)
        self.dropped: dict[str, int] = {}
        self.owners: dict[str, tuple[Owner, ...]] = {}  # GPU uuid -> its owners, sorted

    def process_families(self) -> list[Family]:
        return [self.mem, self.sm, self.memu, self.enc, self.dec, self.count, self.weight]

    def gpu(self, g: GpuSample, procs: Sequence[AttributedProcess], prefix: str) -> None:
        """Everything one up GPU's processes contribute; `prefix`: its GPU labels."""
        facts_now, facts_last = self.cache.facts_now, self.cache.facts_last
        texts_now, texts_last = self.cache.texts_now, self.cache.texts_last
        alloc = self.allocation.lines.append
        pid_label = self.pid_label
        remember = self.remember
        isfinite = _isfinite
        groups: dict[tuple[str, ...], ProcessSample | _Agg] = {}
        explained_mem = 0.0
        explained_util = 0.0
        attributed = False
        with_util = False
        alloc_seen: set[tuple[str, ...]] = set()  # identities with an allocation line
        owners: set[Owner] = set()
        for ap in procs:
            p = ap.process
            a = ap.attribution
            # LabelCache.facts, inlined: this runs for every process
            ia = id(a)
            f = facts_now.get(ia)
            if f is None or f[0] is not a:
                f = facts_last.get(ia)
                if f is None or f[0] is not a:
                    f = _facts_of(a)
                if remember:
                    facts_now[ia] = f
            _, ident, owned, owner, source_box = f
            key = (*ident, p.name, str(p.pid)) if pid_label else (*ident, p.name)
            row = groups.get(key)
            if row is None:
                groups[key] = p  # alone so far: written straight from its sample
            elif type(row) is _Agg:
                row.add(p)
            else:
                agg = groups[key] = _Agg(row)  # type: ignore[arg-type]
                agg.add(p)
            if owned:
                attributed = True
                v = p.used_memory_bytes
                if v is not None and isfinite(v):
                    explained_mem += v
                u = p.sm_util_ratio
                if u is not None:
                    with_util = True
                    if isfinite(u):
                        explained_util += u
                if ident not in alloc_seen:
                    alloc_seen.add(ident)
                    source = source_box[0]
                    if source is None:
                        source = source_box[0] = allocation_source(a)
                    # LabelCache texts, inlined: one allocation per job and GPU
                    series = ("alloc", prefix, ident, source)
                    line = texts_last.get(series) or texts_now.get(series)
                    if line is None:
                        line = self._allocation_line(prefix, ident, source)
                    texts_now[series] = line
                    alloc(line)
            if owner is not None:
                owners.add(owner)
        self.owners[g.info.uuid] = tuple(sorted(owners))
        if groups:
            self._rows(g, groups, prefix)
            self._mig_weights(g, procs, prefix)
        used = g.scalar("memory_used")
        if used is not None:
            self.unattributed_mem.add(prefix, _floor0(used, explained_mem))
        util = g.scalar("utilization_gpu")
        # With attributed processes but no utilisation sample for any of them, the split
        # is unknown: say nothing rather than call all of it unattributed.
        if util is not None and not (attributed and not with_util):
            self.unattributed_util.add(prefix, _floor0(util, explained_util))

    def _allocation_line(self, prefix: str, ident: tuple[str, ...], source: str) -> str:
        user, project, job, namespace, pod, container, slurm_job = ident
        labels = join_labels(prefix, ALLOC_LABELS, (job, user, project, namespace, pod,
                                                    container, slurm_job, source))
        return f"{self.allocation.name}{{{labels}}} 1\n"

    def _rows(self, g: GpuSample, groups: dict[tuple[str, ...], ProcessSample | _Agg],
              prefix: str) -> None:
        items: Iterable[tuple[tuple[str, ...], ProcessSample | _Agg]] = groups.items()
        if len(groups) > self.cap:
            # Keep the biggest by memory; ties broken by label set so the choice is stable.
            aggs = [(k, r if type(r) is _Agg else _Agg(r))  # type: ignore[arg-type]
                    for k, r in groups.items()]
            aggs.sort(key=lambda kv: (-(kv[1].mem or 0.0), kv[0]))
            self.dropped[g.info.uuid] = len(aggs) - self.cap
            items = aggs[:self.cap]
        fams = (self.mem, self.sm, self.memu, self.enc, self.dec, self.count)
        mem, sm, memu = self.mem.lines.append, self.sm.lines.append, self.memu.lines.append
        enc, dec, count = self.enc.lines.append, self.dec.lines.append, self.count.lines.append
        starts_now, starts_last = self.cache.starts_now, self.cache.starts_last
        isfinite = _isfinite
        ratio_text = _RATIO_TEXT
        for key, row in items:
            # LabelCache.starts / keep_starts, inlined: this runs for every series
            series = (prefix, key)
            found = starts_last.get(series)
            if found is None:
                found = starts_now.get(series)
                if found is None:
                    found = _line_prefixes(fams, prefix, self.names, key)
            starts_now[series] = found
            pmem, psm, pmemu, penc, pdec, pcount = found
            if type(row) is _Agg:
                # Values are finite or None here; sums of finite byte counts and ratios
                # stay finite. Memory is an int (a float only from a simulator).
                v: float | None = row.mem
                if v is not None:
                    mem(pmem + (str(v) if type(v) is int else num(v)) + "\n")
                if (v := row.sm) is not None:
                    sm(psm + _ratio(v) + "\n")
                if (v := row.memu) is not None:
                    memu(pmemu + _ratio(v) + "\n")
                if (v := row.enc) is not None:
                    enc(penc + _ratio(v) + "\n")
                if (v := row.dec) is not None:
                    dec(pdec + _ratio(v) + "\n")
                count(f"{pcount}{row.count}\n")
                continue
            # One process: its own values, NaN/Inf left out as "not measured".
            p: ProcessSample = row  # type: ignore[assignment]
            m = p.used_memory_bytes
            if type(m) is int:
                mem(f"{pmem}{m}\n")
            elif m is not None and isfinite(m):
                mem(pmem + num(m) + "\n")
            # (written out per ratio: a loop over them costs a tuple per process)
            if (r := p.sm_util_ratio) is not None:
                if (text := ratio_text.get(r)) is not None:
                    sm(f"{psm}{text}\n")
                elif isfinite(r):
                    sm(psm + ("1" if r >= 1.0 else num(r)) + "\n")
            if (r := p.memory_util_ratio) is not None:
                if (text := ratio_text.get(r)) is not None:
                    memu(f"{pmemu}{text}\n")
                elif isfinite(r):
                    memu(pmemu + ("1" if r >= 1.0 else num(r)) + "\n")
            if (r := p.encoder_util_ratio) is not None:
                if (text := ratio_text.get(r)) is not None:
                    enc(f"{penc}{text}\n")
                elif isfinite(r):
                    enc(penc + ("1" if r >= 1.0 else num(r)) + "\n")
            if (r := p.decoder_util_ratio) is not None:
                if (text := ratio_text.get(r)) is not None:
                    dec(f"{pdec}{text}\n")
                elif isfinite(r):
                    dec(pdec + ("1" if r >= 1.0 else num(r)) + "\n")
            count(f"{pcount}1\n")

    def _mig_weights(self, g: GpuSample, procs: Iterable[AttributedProcess],
                     prefix: str) -> None:
        """gpu_process_mig_weight_ratio: per identity and MIG instance it runs in, the
        instance's weight, on a GPU counted by the slice (gpu_audit.model.mig)."""
        weights = process_weights(g)
        if weights is None:
            return
        seen: set[tuple[str, ...]] = set()
        for ap in procs:
            gi = ap.process.gpu_instance_id
            if gi is None:
                continue
            a = ap.attribution
            key = (a.user, a.project, a.job, a.k8s_namespace, a.k8s_pod, a.k8s_container,
                   a.slurm_job_id, ap.process.name, str(gi))
            if key in seen:
                continue
            seen.add(key)
            self.weight.add(join_labels(prefix, (*PROC_LABELS, "gpu_instance_id"), key),
                            weights[gi])


def _floor0(total: float, explained: float) -> float | None:
    if not math.isfinite(total):
        return None
    return max(0.0, total - explained)
