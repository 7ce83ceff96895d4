"""The dcgm-exporter compatibility profile: dcgm-exporter's names, units and labels for
its default fields, so DCGM dashboard 12239 and existing alert rules keep working.

For every catalogue entry with a `CompatName` the value is scaled from our base unit
(ratio -> %, bytes -> MiB, joules -> mJ, hertz -> MHz) and labelled as dcgm-exporter does:
`gpu`, `UUID`, `pci_bus_id`, `device` ("nvidia<index>"), `Hostname` and
`DCGM_FI_DRIVER_VERSION`. Extras: `DCGM_FI_DEV_XID_ERRORS` (the last XID code, 0 when
none) and the remapped-rows pair.

Two deliberate departures, both forced by `promtool check metrics`, which must pass with
no output on the whole exposition:
- dcgm-exporter's counters (energy, PCIe replay, remapped rows) have no `_total`, and
  promtool rejects a counter without it, so they are typed `gauge` and HELP says so;
  PromQL (rate, increase) works the same on either type.
- Two dcgm-exporter artefacts fail promtool whatever their type: the `modelName` label
  ("label names should be written in 'snake_case' not 'camelCase'"; promtool 2.42 lints
  every label name) and the name `DCGM_FI_DEV_PCIE_REPLAY_COUNTER` ("metric name should
  not include type 'counter'"). Dashboard 12239 queries neither (only `gpu` and
  `instance`), so both are left out unless `exact=True` is asked for; the model stays
  available as `gpu_info{name}` and the replay count as `gpu_pcie_replay_errors_total`.

This module must never keep state beyond the last XID code per GPU (`XidTracker`).
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter import families as fam
from exporter.textformat import escape_label_value, fmt_value, header
from gpu_audit.model.fields import CATALOGUE, MetricDef
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot

# Names promtool's linter rejects whatever we do; emitted only in exact mode.
LINT_REJECTED_NAMES: frozenset[str] = frozenset({"DCGM_FI_DEV_PCIE_REPLAY_COUNTER"})

_COUNTER_NOTE = (" A counter in dcgm-exporter, typed gauge here because its name has no _total"
                 " (promtool rejects such counters); rate() and increase() work the same.")


class XidTracker:
    """Remembers the last XID code per GPU across snapshots (DCGM keeps the field's last
    value; a snapshot only carries the events of its own cycle)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def update(self, snap: Snapshot) -> dict[str, int]:
        for g in snap.gpus:
            for ev in g.new_xids:
                prev = self._last.get(g.uuid)
                if prev is None or ev.timestamp >= prev[0]:
                    self._last[g.uuid] = (ev.timestamp, ev.xid)
            if g.uuid not in self._last and len(g.xid_totals) == 1:
                # Only one code was ever seen, so it is the last one.
                code = next(iter(g.xid_totals))
                self._last[g.uuid] = (g.xid_last_timestamp or 0.0, code)
        return {uuid: code for uuid, (_, code) in self._last.items()}


def _labels(g: GpuSample, snap: Snapshot, exact: bool) -> str:
    i = g.info
    driver = i.driver_version or snap.backend.driver_version
    parts = [f'gpu="{i.index}"', f'UUID="{escape_label_value(i.uuid)}"',
             f'pci_bus_id="{escape_label_value(i.pci_bus_id)}"', f'device="nvidia{i.index}"']
    if exact:
        parts.append(f'modelName="{escape_label_value(i.name)}"')
    parts.append(f'Hostname="{escape_label_value(snap.host)}"')
    parts.append(f'DCGM_FI_DRIVER_VERSION="{escape_label_value(driver)}"')
    if snap.backend.simulated:  # as on every other series made from simulated data
        parts.append('simulated="true"')
    return ",".join(parts)


def _help(m: MetricDef, compat_help: str) -> str:
    base = compat_help or m.help
    note = _COUNTER_NOTE if m.type == "counter" else ""
    return (f"dcgm-exporter compatibility: {base}{note} Same value as {m.name} in"
            f" dcgm-exporter's unit; sampled in the background; source: {m.source}.")


def render_compat(snap: Snapshot, out: list[str], last_xid_codes: Mapping[str, int],
                  exact: bool = False) -> tuple[int, int]:
    """Append the compat families to `out`; return (samples, families) written."""
    up = [g for g in snap.gpus if g.up]
    labels = {g.uuid: _labels(g, snap, exact) for g in up}
    series = families = 0

    def emit(name: str, help_: str, lines: list[str]) -> None:
        nonlocal series, families
        if lines:
            out.append(header(name, "gauge", help_))
            out.extend(lines)
            series += len(lines)
            families += 1

    for m in CATALOGUE:
        for c in m.compat:
            if c.name in LINT_REJECTED_NAMES and not exact:
                continue
            lines = []
            for g in up:
                if m.key in g.unsupported:
                    continue
                v = g.scalar(m.key)
                text = None if v is None else fmt_value(v * c.scale)
                if text is not None:
                    lines.append(f"{c.name}{{{labels[g.uuid]}}} {text}\n")
            emit(c.name, _help(m, c.help), lines)

    xid_lines = [f"{fam.DCGM_XID.name}{{{labels[g.uuid]}}} {last_xid_codes.get(g.uuid, 0)}\n"
                 for g in up]
    emit(fam.DCGM_XID.name, fam.DCGM_XID.full_help, xid_lines)

    for f, cause in ((fam.DCGM_CORRECTABLE_REMAPPED, "correctable"),
                     (fam.DCGM_UNCORRECTABLE_REMAPPED, "uncorrectable")):
        lines = []
        for g in up:
            if "remapped_rows" in g.unsupported:
                continue
            v = g.values.get("remapped_rows", {}).get((cause,))
            text = None if v is None else fmt_value(v)
            if text is not None:
                lines.append(f"{f.name}{{{labels[g.uuid]}}} {text}\n")
        emit(f.name, f.full_help, lines)
    return series, families
