"""Render one `Snapshot` into Prometheus text exposition bytes, once per sampling cycle.

The sampler thread calls `Renderer.render` (or the pure `render_snapshot`) after each
cycle and hands the bytes to the HTTP layer, so a scrape only sends cached bytes. New
families are built on every render: a process that is gone simply is not rendered.

This module must never do I/O, read the clock on its own (except to stamp
`generated_at`), keep cumulative counters (the HTTP layer owns those), or emit NaN/Inf.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from exporter.config import DEFAULT_HOST_LABEL
from exporter.exposition import families as fam
from exporter.exposition.compat import CompatOptions, XidTracker, render_compat
from exporter.exposition.textformat import escape_label_value, fmt_value, header
from exporter.owners import OWNER_LABELS, owner_label_values, owners_of
from gpu_audit import selfmetrics as sm
from gpu_audit.http.state import RenderedSnapshot
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.fields import CATALOGUE
from gpu_audit.model.mig import process_weights
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What to put in the exposition besides the canonical families."""

    dcgm_compat: bool = False
    pid_label: bool = False
    max_process_series_per_gpu: int = 256
    # The compat profile's host label name: dcgm-exporter's released "Hostname", or
    # "hostname" as its main branch spells it.
    dcgm_host_label: str = DEFAULT_HOST_LABEL
    # Leave out the two dcgm-exporter artefacts promtool's linter rejects (the modelName
    # label, DCGM_FI_DEV_PCIE_REPLAY_COUNTER); see exporter.compat.
    dcgm_promtool_clean: bool = False


class _Family:
    """Samples of one family, emitted with its header only when non-empty."""

    __slots__ = ("_open", "head", "lines", "name")

    def __init__(self, name: str, type_: str, help_: str) -> None:
        self.name = name
        self._open = name + "{"
        self.head = header(name, type_, help_)
        self.lines: list[str] = []

    def add(self, labels: str, value: float | None) -> None:
        if value is None:
            return
        # The common cases inline (this runs once per series per cycle); fmt_value has
        # the same rules and handles everything else.
        if type(value) is float and value.is_integer() and -1e15 < value < 1e15:
            text: str | None = str(int(value))
        elif type(value) is int:
            text = str(value)
        else:
            text = fmt_value(value)
            if text is None:
                return
        if labels:
            self.lines.append(f"{self._open}{labels}}} {text}\n")
        else:
            self.lines.append(f"{self.name} {text}\n")


class LabelCache:
    """Rendered label strings and unchanged sample blocks kept from one cycle to the next.

    Identities and labelled fields are stable across cycles, so escaping and joining
    their label values again every cycle is wasted work; slow-tier fields (ECC, NVLink
    errors, retired pages) and the supported-fields view keep their values for many
    cycles, so their whole block of lines is reused while the values compare equal.
    Entries not used in a cycle are dropped at `rotate()`, so the cache never outgrows
    one exposition.
    """

    __slots__ = ("_blocks", "_new", "_new_blocks", "_new_prefixes", "_old", "_prefixes")

    def __init__(self) -> None:
        self._old: dict[tuple[object, ...], str] = {}
        self._new: dict[tuple[object, ...], str] = {}
        # series identity -> the `name{labels} ` start of each of its lines
        self._prefixes: dict[tuple[object, ...], tuple[str, ...]] = {}
        self._new_prefixes: dict[tuple[object, ...], tuple[str, ...]] = {}
        self._blocks: dict[tuple[object, ...], tuple[object, list[str]]] = {}
        self._new_blocks: dict[tuple[object, ...], tuple[object, list[str]]] = {}

    def get(self, key: tuple[object, ...], build: Callable[[], str]) -> str:
        text = self._new.get(key)
        if text is None:
            text = self._old.get(key)
            if text is None:
                text = build()
            self._new[key] = text
        return text

    def line_prefixes(self, key: tuple[object, ...],
                      build: Callable[[], tuple[str, ...]]) -> tuple[str, ...]:
        """The cached `name{labels} ` starts of a series' lines: only the value is
        formatted each cycle."""
        hit = self._new_prefixes.get(key)
        if hit is None:
            hit = self._prefixes.get(key)
            if hit is None:
                hit = build()
            self._new_prefixes[key] = hit
        return hit

    def block(self, key: tuple[object, ...], values: object) -> list[str] | None:
        """The lines rendered last cycle for `key`, when its values are unchanged."""
        hit = self._blocks.get(key)
        if hit is not None and hit[0] == values:
            self._new_blocks[key] = hit
            return hit[1]
        return None

    def keep_block(self, key: tuple[object, ...], values: object, lines: list[str]) -> None:
        self._new_blocks[key] = (values, lines)

    def rotate(self) -> None:
        self._old, self._new = self._new, {}
        self._blocks, self._new_blocks = self._new_blocks, {}
        self._prefixes, self._new_prefixes = self._new_prefixes, {}


def _fixed(f: fam.FamilyDef) -> _Family:
    return _Family(f.name, f.type, f.full_help)


def _label_value(value: str) -> str:
    return escape_label_value(value)


def _gpu_prefix(g: GpuSample, simulated: bool = False) -> str:
    # Under the simulator every GPU, process, unattributed and allocation series says
    # so, so anything that sums usage can leave it out with {simulated!="true"}. Real
    # data gets no such label (its exposition is unchanged). Built once per GPU and
    # cycle, like the prefix itself, so the label costs nothing per series.
    base = f'gpu="{g.info.index}",uuid="{_label_value(g.info.uuid)}"'
    return base + ',simulated="true"' if simulated else base


class _Agg:
    """Sums over the processes sharing one identity label set."""

    __slots__ = ("count", "dec", "enc", "mem", "memu", "sm")

    def __init__(self) -> None:
        self.mem: float | None = None
        self.sm: float | None = None
        self.memu: float | None = None
        self.enc: float | None = None
        self.dec: float | None = None
        self.count = 0


def _plus(total: float | None, value: float | None) -> float | None:
    # NaN/Inf from a backend means "not measured": it neither sums nor poisons the sum.
    if value is None or not math.isfinite(value):
        return total
    return value if total is None else total + value


def _identity(ap: AttributedProcess, pid_label: bool) -> tuple[str, ...]:
    a = ap.attribution
    key = (a.user, a.project, a.job, a.k8s_namespace, a.k8s_pod, a.k8s_container,
           a.slurm_job_id, ap.process.name)
    return (*key, str(ap.process.pid)) if pid_label else key


def _process_rows(procs: Iterable[AttributedProcess], pid_label: bool) -> dict[tuple[str, ...],
                                                                              _Agg]:
    groups: dict[tuple[str, ...], _Agg] = {}
    isfinite = math.isfinite
    for ap in procs:
        key = _identity(ap, pid_label)
        p = ap.process
        agg = groups.get(key)
        if agg is None:
            # The common case, one process per identity: take its values as they are
            # (NaN/Inf still mean "not measured").
            agg = groups[key] = _Agg()
            agg.count = 1
            v: float | None = p.used_memory_bytes
            agg.mem = v if v is not None and isfinite(v) else None
            v = p.sm_util_ratio
            agg.sm = v if v is not None and isfinite(v) else None
            v = p.memory_util_ratio
            agg.memu = v if v is not None and isfinite(v) else None
            v = p.encoder_util_ratio
            agg.enc = v if v is not None and isfinite(v) else None
            v = p.decoder_util_ratio
            agg.dec = v if v is not None and isfinite(v) else None
            continue
        agg.count += 1
        agg.mem = _plus(agg.mem, p.used_memory_bytes)
        agg.sm = _plus(agg.sm, p.sm_util_ratio)
        agg.memu = _plus(agg.memu, p.memory_util_ratio)
        agg.enc = _plus(agg.enc, p.encoder_util_ratio)
        agg.dec = _plus(agg.dec, p.decoder_util_ratio)
    return groups


_PROC_LABELS = (*(label for label, _ in fam.PROCESS_IDENTITY_LABELS), "process_name")


def _allocation_source(ap: AttributedProcess) -> str:
    srcs = ap.attribution.sources
    if ap.attribution.job and "job" in srcs:
        return srcs["job"]
    if ap.attribution.user and "user" in srcs:
        return srcs["user"]
    for name in ("slurm_job_id", "k8s_pod", "project", "container_id"):
        if getattr(ap.attribution, name) and name in srcs:
            return srcs[name]
    return "unknown"


def render_snapshot(snap: Snapshot, opts: RenderOptions, *,
                    last_xid_codes: Mapping[str, int] | None = None,
                    now: float | None = None,
                    labels: LabelCache | None = None) -> RenderedSnapshot:
    """Render every family of one snapshot. Pure apart from stamping `generated_at`.

    `last_xid_codes` (gpu uuid -> last XID code, kept across snapshots by `Renderer`)
    feeds the compat profile's DCGM_FI_DEV_XID_ERRORS; without it only this snapshot's
    new XID events are known.
    """
    cache = labels if labels is not None else LabelCache()
    catalogue_out: list[str] = []
    series = 0
    up_gpus = [g for g in snap.gpus if g.up]
    prefixes = {g.info.uuid: _gpu_prefix(g, snap.backend.simulated) for g in snap.gpus}

    for m in CATALOGUE:
        f = _Family(m.name, m.type, m.full_help)
        names = m.labels
        for g in up_gpus:
            if m.key in g.unsupported:
                continue
            values = g.values.get(m.key)
            if not values:
                continue
            prefix = prefixes[g.info.uuid]
            if not names:
                f.add(prefix, values.get(()))
                continue
            block_key = (prefix, m.key)
            lines = cache.block(block_key, values)
            if lines is not None:
                f.lines.extend(lines)
                continue
            start = len(f.lines)
            for label_values, v in values.items():
                if len(label_values) != len(names):
                    continue  # a backend bug must not produce a malformed exposition
                f.add(cache.get((prefix, m.key, label_values),
                                partial(_join, prefix, names, label_values)), v)
            cache.keep_block(block_key, dict(values), f.lines[start:])
        if m.dcgm_only:
            # DCGM profiling on a GPU in MIG mode: one series per GPU instance
            for g in up_gpus:
                for mi in g.mig:
                    if m.key in mi.values:
                        f.add(f'{prefixes[g.info.uuid]},mig_uuid="{_label_value(mi.uuid)}",'
                              f'gpu_instance_id="{mi.gpu_instance_id}"', mi.values[m.key])
        if f.lines:
            catalogue_out.append(f.head)
            catalogue_out.extend(f.lines)
            series += len(f.lines)

    up, info, supported = _fixed(fam.GPU_UP), _fixed(fam.GPU_INFO), _fixed(fam.GPU_FIELD_SUPPORTED)
    xid_total, xid_last = _fixed(fam.GPU_XID_ERRORS), _fixed(fam.GPU_XID_LAST)
    mig_info = _fixed(fam.GPU_MIG_INFO)
    mig_total, mig_used = _fixed(fam.GPU_MIG_MEMORY_TOTAL), _fixed(fam.GPU_MIG_MEMORY_USED)
    backend = snap.backend
    simulated = "true" if backend.simulated else "false"
    for g in snap.gpus:
        i, prefix = g.info, prefixes[g.info.uuid]
        up.add(prefix, 1 if g.up else 0)
        info.add(  # gpu_info has its own simulated label, "true" or "false"
            f'{_gpu_prefix(g)},name="{_label_value(i.name)}",serial="{_label_value(i.serial)}",'
            f'pci_bus_id="{_label_value(i.pci_bus_id)}",'
            f'driver_version="{_label_value(i.driver_version or backend.driver_version)}",'
            f'cuda_version="{_label_value(i.cuda_version or backend.cuda_version)}",'
            f'vbios_version="{_label_value(i.vbios_version)}",'
            f'mig_mode="{"true" if i.mig_mode else "false"}",'
            f'backend="{_label_value(backend.name)}",simulated="{simulated}"', 1)
        # XID totals come from the event stream, not from reading the device, so they
        # stay visible while the GPU is down (XID 79 is exactly when it falls off).
        for code in sorted(g.xid_totals):
            xid_total.add(f'{prefix},xid="{code}"', g.xid_totals[code])
        xid_last.add(prefix, g.xid_last_timestamp)
        if not g.up:
            continue
        measured = frozenset(g.values)
        lines = cache.block(("supported", prefix), measured)
        if lines is None:
            start = len(supported.lines)
            for m in CATALOGUE:
                supported.add(f'{prefix},field="{m.name}"', 1 if m.key in measured else 0)
            lines = supported.lines[start:]
            cache.keep_block(("supported", prefix), measured, lines)
        else:
            supported.lines.extend(lines)
        for mi in g.mig:
            mprefix = (f'{prefix},mig_uuid="{_label_value(mi.uuid)}",'
                       f'gpu_instance_id="{mi.gpu_instance_id}"')
            mig_info.add(f'{mprefix},compute_instance_id="{mi.compute_instance_id}",'
                         f'profile="{_label_value(mi.profile)}"', 1)
            mig_total.add(mprefix, mi.memory_total_bytes)
            mig_used.add(mprefix, mi.memory_used_bytes)
    gpu_fams = [up, info, supported, xid_total, xid_last, mig_info, mig_total, mig_used]

    proc_fams, dropped = _render_processes(snap, up_gpus, prefixes, opts, cache)
    unattributed = _render_unattributed(snap, up_gpus, prefixes)
    allocation = _render_allocation(snap, up_gpus, prefixes, cache)
    owner = _render_owners(snap, prefixes)

    out = catalogue_out
    nfam = sum(1 for s in catalogue_out if s.startswith("# TYPE"))
    for f in (*gpu_fams, *proc_fams, *unattributed, allocation, owner):
        if f.lines:
            out.append(f.head)
            out.extend(f.lines)
            series += len(f.lines)
            nfam += 1

    if opts.dcgm_compat:
        codes = last_xid_codes if last_xid_codes is not None else XidTracker().update(snap)
        n, nf = render_compat(snap, out, codes, CompatOptions(
            host_label=opts.dcgm_host_label, promtool_clean=opts.dcgm_promtool_clean))
        series += n
        nfam += nf

    self_fams = _render_self(snap)
    for f in self_fams:
        if f.lines:
            out.append(f.head)
            out.extend(f.lines)
            series += len(f.lines)
            nfam += 1
    series += 1  # gpu_audit_series itself
    count = _fixed(fam.SERIES)
    count.add("", series)
    out.append(count.head)
    out.extend(count.lines)
    nfam += 1

    # errors="replace": a label value that is not valid Unicode (a surrogate escape from
    # /proc bytes) must still give a valid UTF-8 exposition.
    body = "".join(out).encode("utf-8", errors="replace")
    return RenderedSnapshot(
        body=body,
        series=series,
        dropped_process_series=dropped,
        generated_at=time.time() if now is None else now,
        snapshot_timestamp=snap.timestamp,
        families=nfam,
    )


def _join(prefix: str, names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return prefix + "".join(f',{n}="{_label_value(v)}"' for n, v in zip(names, values, strict=True))


def _num(v: float) -> str:
    """A finite sample value as fmt_value writes it. Only for values finite by
    construction: _process_rows drops NaN/Inf, and sums of finite byte counts and
    ratios stay finite."""
    if type(v) is int:
        return str(v)
    if v.is_integer() and -1e15 < v < 1e15:
        return str(int(v))
    return repr(float(v))


def _process_line_prefixes(fams: tuple[_Family, ...], prefix: str, names: tuple[str, ...],
                           key: tuple[str, ...]) -> tuple[str, ...]:
    labels = _join(prefix, names, key)
    return tuple(f"{f.name}{{{labels}}} " for f in fams)


def _render_processes(snap: Snapshot, up_gpus: list[GpuSample], prefixes: Mapping[str, str],
                      opts: RenderOptions,
                      cache: LabelCache) -> tuple[list[_Family], dict[str, int]]:
    mem, sm = _fixed(fam.PROCESS_MEMORY), _fixed(fam.PROCESS_SM)
    memu, enc = _fixed(fam.PROCESS_MEM_UTIL), _fixed(fam.PROCESS_ENC)
    dec, count = _fixed(fam.PROCESS_DEC), _fixed(fam.PROCESS_COUNT)
    fams = (mem, sm, memu, enc, dec, count)
    weight_f = _fixed(fam.PROCESS_MIG_WEIGHT)
    names = (*_PROC_LABELS, "pid") if opts.pid_label else _PROC_LABELS
    dropped: dict[str, int] = {}
    cap = max(0, opts.max_process_series_per_gpu)
    for g in up_gpus:
        procs = snap.processes.get(g.info.uuid, ())
        if not procs:
            continue
        groups = _process_rows(procs, opts.pid_label)
        _mig_weights(weight_f, g, procs, prefixes[g.info.uuid])
        items = list(groups.items())
        if len(items) > cap:
            # Keep the biggest by memory; ties broken by label set so the choice is stable.
            items.sort(key=lambda kv: (-(kv[1].mem or 0.0), kv[0]))
            dropped[g.info.uuid] = len(items) - cap
            items = items[:cap]
        prefix = prefixes[g.info.uuid]
        for key, agg in items:
            pmem, psm, pmemu, penc, pdec, pcount = cache.line_prefixes(
                (prefix, key), partial(_process_line_prefixes, fams, prefix, names, key))
            # Values are finite or None here (_process_rows); ratios capped at 1 ("1" is
            # what _num writes for 1.0). Memory is an int (a float only from a simulator).
            v: float | None = agg.mem
            if v is not None:
                mem.lines.append(pmem + (str(v) if type(v) is int else _num(v)) + "\n")
            v = agg.sm
            if v is not None:
                sm.lines.append(psm + ("1" if v >= 1.0 else _num(v)) + "\n")
            v = agg.memu
            if v is not None:
                memu.lines.append(pmemu + ("1" if v >= 1.0 else _num(v)) + "\n")
            v = agg.enc
            if v is not None:
                enc.lines.append(penc + ("1" if v >= 1.0 else _num(v)) + "\n")
            v = agg.dec
            if v is not None:
                dec.lines.append(pdec + ("1" if v >= 1.0 else _num(v)) + "\n")
            count.lines.append(f"{pcount}{agg.count}\n")
    return [*fams, weight_f], dropped


def _mig_weights(out: _Family, g: GpuSample, procs: Iterable[AttributedProcess],
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
        key = (*_identity(ap, False), str(gi))
        if key in seen:
            continue
        seen.add(key)
        out.add(_join(prefix, (*_PROC_LABELS, "gpu_instance_id"), key), weights[gi])


def _render_unattributed(snap: Snapshot, up_gpus: list[GpuSample],
                         prefixes: Mapping[str, str]) -> list[_Family]:
    mem_f, util_f = _fixed(fam.UNATTRIBUTED_MEMORY), _fixed(fam.UNATTRIBUTED_UTIL)
    for g in up_gpus:
        attributed = [ap.process for ap in snap.processes.get(g.info.uuid, ())
                      if ap.attribution.attributed]
        prefix = prefixes[g.info.uuid]
        used = g.scalar("memory_used")
        if used is not None:
            explained: float | None = 0.0
            for p in attributed:
                explained = _plus(explained, p.used_memory_bytes)
            mem_f.add(prefix, _floor0(used, explained))
        util = g.scalar("utilization_gpu")
        if util is not None:
            utils = [p.sm_util_ratio for p in attributed if p.sm_util_ratio is not None]
            # With attributed processes but no utilisation sample for any of them, the
            # split is unknown: say nothing rather than call all of it unattributed.
            if attributed and not utils:
                continue
            explained_u: float | None = 0.0
            for u in utils:
                explained_u = _plus(explained_u, u)
            util_f.add(prefix, _floor0(util, explained_u))
    return [mem_f, util_f]


def _floor0(total: float, explained: float | None) -> float | None:
    if not math.isfinite(total):
        return None
    return max(0.0, total - (explained or 0.0))


def _render_allocation(snap: Snapshot, up_gpus: list[GpuSample],
                       prefixes: Mapping[str, str], cache: LabelCache) -> _Family:
    alloc = _fixed(fam.ALLOCATION_INFO)
    for g in up_gpus:
        seen: set[tuple[str, ...]] = set()
        for ap in snap.processes.get(g.info.uuid, ()):
            a = ap.attribution
            if not a.attributed:
                continue
            key = (a.job, a.user, a.project, a.k8s_namespace, a.k8s_pod, a.k8s_container,
                   a.slurm_job_id)
            if key in seen:
                continue
            seen.add(key)
            source = _allocation_source(ap)
            prefix = prefixes[g.info.uuid]
            alloc.add(cache.get(("alloc", prefix, key, source),
                                partial(_join, prefix, _ALLOC_LABELS, (*key, source))), 1)
    return alloc


_ALLOC_LABELS = ("job", "user", "project", "namespace", "pod", "container", "slurm_job",
                 "source")


def _render_owners(snap: Snapshot, prefixes: Mapping[str, str]) -> _Family:
    """One gpu_owner_info series per GPU that has an owner: from its processes while it
    is up, from the owners it had when last read while it is down."""
    info = _fixed(fam.GPU_OWNER_INFO)
    for g in snap.gpus:
        owners = (owners_of(snap.processes.get(g.info.uuid, ())) if g.up
                  else snap.last_owners.get(g.info.uuid, ()))
        values = owner_label_values(owners)
        if values is not None:
            info.add(_join(prefixes[g.info.uuid], OWNER_LABELS, values), 1)
    return info


def _render_self(snap: Snapshot) -> list[_Family]:
    duration, stamp = _fixed(fam.SAMPLE_DURATION), _fixed(fam.SNAPSHOT_TIMESTAMP)
    errors = _fixed(fam.SAMPLE_ERRORS)
    duration.add("", snap.sample_duration_seconds)
    stamp.add("", snap.timestamp)
    for kind, n in sm.SAMPLE_ERRORS.with_known(snap.error_counts):
        errors.add(f'kind="{_label_value(kind)}"', n)
    return [duration, stamp, errors]


@dataclass
class Renderer:
    """The sampler thread's renderer: `render_snapshot` plus the little state the compat
    profile needs across cycles (the last XID code per GPU)."""

    opts: RenderOptions
    _xids: XidTracker = field(default_factory=XidTracker)
    _labels: LabelCache = field(default_factory=LabelCache)

    def render(self, snap: Snapshot, now: float | None = None) -> RenderedSnapshot:
        codes = self._xids.update(snap)
        out = render_snapshot(snap, self.opts, last_xid_codes=codes, now=now,
                              labels=self._labels)
        self._labels.rotate()
        return out
