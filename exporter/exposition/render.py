"""Render one `Snapshot` into Prometheus text exposition bytes, once per sampling cycle.

The sampler thread calls `Renderer.render` (or the pure `render_snapshot`) after each
cycle and hands the bytes to the HTTP layer, so a scrape only sends cached bytes. New
families are built on every render: a process that is gone simply is not rendered.

This module must never do I/O, read the clock on its own (except to stamp
`generated_at`), keep cumulative counters (the HTTP layer owns those), or emit NaN/Inf.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

from exporter.config import DEFAULT_HOST_LABEL
from exporter.exposition import families as fam
from exporter.exposition.compat import CompatOptions, XidTracker, render_compat
from exporter.exposition.lines import Family, LabelCache, fixed, join_labels, label_value
from exporter.exposition.processes import ProcessFamilies
from exporter.owners import OWNER_LABELS, Owner, owner_label_values
from gpu_audit import selfmetrics as sm
from gpu_audit.http.state import RenderedSnapshot
from gpu_audit.model.fields import CATALOGUE
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


def _gpu_prefix(g: GpuSample, simulated: bool = False) -> str:
    # Under the simulator every GPU, process, unattributed and allocation series says
    # so, so anything that sums usage can leave it out with {simulated!="true"}. Real
    # data gets no such label (its exposition is unchanged). Built once per GPU and
    # cycle, like the prefix itself, so the label costs nothing per series.
    base = f'gpu="{g.info.index}",uuid="{label_value(g.info.uuid)}"'
    return base + ',simulated="true"' if simulated else base


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
        f = fixed(m)
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
                                partial(join_labels, prefix, names, label_values)), v)
            cache.keep_block(block_key, dict(values), f.lines[start:])
        if m.dcgm_only:
            # DCGM profiling on a GPU in MIG mode: one series per GPU instance
            for g in up_gpus:
                for mi in g.mig:
                    if m.key in mi.values:
                        f.add(f'{prefixes[g.info.uuid]},mig_uuid="{label_value(mi.uuid)}",'
                              f'gpu_instance_id="{mi.gpu_instance_id}"', mi.values[m.key])
        if f.lines:
            catalogue_out.append(f.head)
            catalogue_out.extend(f.lines)
            series += len(f.lines)

    up, info, supported = fixed(fam.GPU_UP), fixed(fam.GPU_INFO), fixed(fam.GPU_FIELD_SUPPORTED)
    xid_total, xid_last = fixed(fam.GPU_XID_ERRORS), fixed(fam.GPU_XID_LAST)
    mig_info = fixed(fam.GPU_MIG_INFO)
    mig_total, mig_used = fixed(fam.GPU_MIG_MEMORY_TOTAL), fixed(fam.GPU_MIG_MEMORY_USED)
    backend = snap.backend
    simulated = "true" if backend.simulated else "false"
    for g in snap.gpus:
        i, prefix = g.info, prefixes[g.info.uuid]
        up.add(prefix, 1 if g.up else 0)
        info.add(  # gpu_info has its own simulated label, "true" or "false"
            f'{_gpu_prefix(g)},name="{label_value(i.name)}",serial="{label_value(i.serial)}",'
            f'pci_bus_id="{label_value(i.pci_bus_id)}",'
            f'driver_version="{label_value(i.driver_version or backend.driver_version)}",'
            f'cuda_version="{label_value(i.cuda_version or backend.cuda_version)}",'
            f'vbios_version="{label_value(i.vbios_version)}",'
            f'mig_mode="{"true" if i.mig_mode else "false"}",'
            f'backend="{label_value(backend.name)}",simulated="{simulated}"', 1)
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
            mprefix = (f'{prefix},mig_uuid="{label_value(mi.uuid)}",'
                       f'gpu_instance_id="{mi.gpu_instance_id}"')
            mig_info.add(f'{mprefix},compute_instance_id="{mi.compute_instance_id}",'
                         f'profile="{label_value(mi.profile)}"', 1)
            mig_total.add(mprefix, mi.memory_total_bytes)
            mig_used.add(mprefix, mi.memory_used_bytes)
    gpu_fams = [up, info, supported, xid_total, xid_last, mig_info, mig_total, mig_used]

    by_process = ProcessFamilies(cache, pid_label=opts.pid_label,
                                 max_series_per_gpu=opts.max_process_series_per_gpu,
                                 remember=labels is not None)
    for g in up_gpus:
        by_process.gpu(g, snap.processes.get(g.info.uuid, ()), prefixes[g.info.uuid])
    owner = _render_owners(snap, prefixes, by_process.owners)

    out = catalogue_out
    nfam = sum(1 for s in catalogue_out if s.startswith("# TYPE"))
    for f in (*gpu_fams, *by_process.process_families(), by_process.unattributed_mem,
              by_process.unattributed_util, by_process.allocation, owner):
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
    count = fixed(fam.SERIES)
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
        dropped_process_series=by_process.dropped,
        generated_at=time.time() if now is None else now,
        snapshot_timestamp=snap.timestamp,
        families=nfam,
    )


def _render_owners(snap: Snapshot, prefixes: Mapping[str, str],
                   up_owners: Mapping[str, tuple[Owner, ...]]) -> Family:
    """One gpu_owner_info series per GPU that has an owner: from its processes while it
    is up (`up_owners`), from the owners it had when last read while it is down."""
    info = fixed(fam.GPU_OWNER_INFO)
    for g in snap.gpus:
        owners = up_owners.get(g.info.uuid, ()) if g.up else snap.last_owners.get(g.info.uuid, ())
        values = owner_label_values(owners)
        if values is not None:
            info.add(join_labels(prefixes[g.info.uuid], OWNER_LABELS, values), 1)
    return info


def _render_self(snap: Snapshot) -> list[Family]:
    duration, stamp = fixed(fam.SAMPLE_DURATION), fixed(fam.SNAPSHOT_TIMESTAMP)
    errors = fixed(fam.SAMPLE_ERRORS)
    duration.add("", snap.sample_duration_seconds)
    stamp.add("", snap.timestamp)
    for kind, n in sm.SAMPLE_ERRORS.with_known(snap.error_counts):
        errors.add(f'kind="{label_value(kind)}"', n)
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
