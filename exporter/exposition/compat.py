"""The dcgm-exporter compatibility profile: dcgm-exporter's names, units and labels, so
dashboards (DCGM dashboard 12239), NVIDIA's GPU-operator recording rules and the alert
rules sites run against dcgm-exporter keep working when gpu-audit replaces it.

`COMPAT_FIELDS` is the one table of every compat name: which catalogue value it comes
from, the factor from our base unit to dcgm-exporter's (ratio -> %, bytes -> MiB,
joules -> mJ, hertz -> MHz, seconds -> us, bytes -> KiB), and how a labelled value is
reduced to dcgm-exporter's single series (one label set, a sum, a bit mask). The
renderer and `docs/METRICS.md` both read it. `DCGM_FI_DEV_XID_ERRORS` (the last XID
code) is the one name that is not a catalogue value; it is declared here too.

Labels are dcgm-exporter's: `gpu`, `UUID`, `pci_bus_id`, `device` ("nvidia<index>"),
`modelName`, `GPU_I_PROFILE`/`GPU_I_ID` on per-MIG-instance series, the host label
(`Hostname` by default, a setting because dcgm-exporter's main branch renames it to
`hostname`), `DCGM_FI_DRIVER_VERSION`, and `pod`/`namespace`/`container` when the GPU's
processes are attributed to a Kubernetes pod.

Departures, each forced by something and documented in docs/METRICS.md:
- dcgm-exporter's counters have no `_total`, and promtool rejects a counter without it,
  so they are typed `gauge` (HELP says so); rate() and increase() work the same.
- promtool's linter rejects two dcgm-exporter artefacts whatever their type: the
  camelCase `modelName` label and the name `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`. The
  profile is opt-in and exists to match dcgm-exporter, so both are emitted; the
  complaints they cause are listed exactly in `PROMTOOL_COMPLAINTS`, and the
  `promtool_clean` option leaves both out. The native names stay promtool-clean.
- A GPU that is down (lost, timed out) keeps only `DCGM_FI_DEV_XID_ERRORS`, with all its
  identity labels: its last XID (79 for a GPU that fell off the bus) is what an alert
  needs, and every other value would be a stale reading presented as current.
- On a MIG GPU the framebuffer fields (FB_USED, FB_FREE, FB_TOTAL) are one series per
  GPU instance with `GPU_I_PROFILE`/`GPU_I_ID`, which is where NVML gives per-instance
  values, and so are the DCGM profiling fields (DCGM_FI_PROF_*), which DCGM reports per
  GPU instance; device-wide fields (temperature, power, clocks...) stay one series per
  physical GPU, so summing them does not count a GPU once per instance.
- Profiling fields exist only where DCGM measures them (the dcgm backend with profiling
  available, or the simulator declaring `dcgm`): nothing is derived from NVML to stand
  in for them, so NVIDIA's dashboard panels on them (`NVIDIA_DASHBOARD_PANELS`) stay
  empty without DCGM, as they would with dcgm-exporter.

This module must never keep state beyond the last XID code per GPU (`XidTracker`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from exporter.config import DEFAULT_HOST_LABEL
from exporter.exposition.textformat import escape_label_value, fmt_value, header
from gpu_audit.model.attribution import AttributedProcess
from gpu_audit.model.fields import BY_KEY, CATALOGUE, CLOCK_EVENT_REASONS
from gpu_audit.model.samples import GpuSample, LabelValues, MigInstance
from gpu_audit.model.snapshot import Snapshot

Reduce = Literal["value", "sum", "bitmask"]

# promtool 2.42 `check metrics` complaints the compat names bring, by cause. Nothing
# else in a compat exposition may draw a complaint (tests assert exactly this).
CAMEL_CASE_COMPLAINT = "label names should be written in 'snake_case' not 'camelCase'"
COUNTER_IN_NAME_COMPLAINT = "metric name should not include type 'counter'"
MODEL_LABEL = "modelName"
# Names promtool rejects whatever their type; left out with promtool_clean.
LINT_REJECTED_NAMES: frozenset[str] = frozenset({"DCGM_FI_DEV_PCIE_REPLAY_COUNTER"})

_COUNTER_NOTE = (" A counter in dcgm-exporter, typed gauge here because its name has no _total"
                 " (promtool rejects such counters); rate() and increase() work the same.")
_CAMEL = re.compile(r"[a-z][A-Z]")


@dataclass(frozen=True, slots=True)
class CompatField:
    """One dcgm-exporter name and how its value is made from a catalogue value."""

    name: str
    key: str  # catalogue key
    scale: float  # factor from the catalogue's base unit to `unit`
    unit: str  # dcgm-exporter's unit
    help: str
    select: LabelValues | None = None  # the label values to take from a labelled field
    reduce: Reduce = "value"
    per_instance: bool = False  # MIG: one series per GPU instance
    declared_type: str = ""  # dcgm-exporter's type where it differs from the native one

    @property
    def dcgm_type(self) -> str:
        """The type dcgm-exporter declares (we emit every compat family as gauge)."""
        return self.declared_type or BY_KEY[self.key].type

    @property
    def source(self) -> str:
        m = BY_KEY[self.key]
        how = {"value": "", "sum": ", summed over every label set",
               "bitmask": ", active reasons OR-ed into nvml.h's bit mask"}[self.reduce]
        pick = ("{" + ",".join(f'{n}="{v}"' for n, v in zip(m.labels, self.select,
                                                          strict=True)) + "}"
                if self.select else "")
        inst = "; per MIG instance: gpu_mig_memory_*_bytes" if self.per_instance else ""
        return f"{m.name}{pick}{how}{inst} ({m.source})"

    def full_help(self) -> str:
        note = _COUNTER_NOTE if self.dcgm_type == "counter" else ""
        return (f"dcgm-exporter compatibility: {self.help}{note} From {BY_KEY[self.key].name}"
                f" in dcgm-exporter's unit ({self.unit}); sampled in the background.")


# dcgm-exporter's unit of each catalogue CompatName (the catalogue holds the factor).
_UNITS = {
    "DCGM_FI_DEV_GPU_UTIL": "%", "DCGM_FI_DEV_MEM_COPY_UTIL": "%",
    "DCGM_FI_DEV_ENC_UTIL": "%", "DCGM_FI_DEV_DEC_UTIL": "%",
    "DCGM_FI_DEV_FB_TOTAL": "MiB", "DCGM_FI_DEV_FB_USED": "MiB", "DCGM_FI_DEV_FB_FREE": "MiB",
    "DCGM_FI_DEV_FB_RESERVED": "MiB",
    "DCGM_FI_DEV_GPU_TEMP": "C", "DCGM_FI_DEV_MEMORY_TEMP": "C",
    "DCGM_FI_DEV_POWER_USAGE": "W", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "mJ",
    "DCGM_FI_DEV_SM_CLOCK": "MHz", "DCGM_FI_DEV_MEM_CLOCK": "MHz",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "0/1", "DCGM_FI_DEV_ROW_REMAP_FAILURE": "0/1",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "retries",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "ratio", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "ratio",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "B/s", "DCGM_FI_PROF_PCIE_RX_BYTES": "B/s",
}
# Framebuffer fields NVML also gives per MIG instance.
_PER_INSTANCE = frozenset({"DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"})

_DERIVED: tuple[CompatField, ...] = (
    CompatField("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clock_event_reason", 1.0, "bit mask",
                "Current clock event (throttle) reasons as nvml.h's bit mask.",
                reduce="bitmask"),
    CompatField("DCGM_FI_DEV_POWER_VIOLATION", "violation_time", 1e6, "us",
                "Throttling duration due to power constraints (in us).", select=("power",)),
    CompatField("DCGM_FI_DEV_THERMAL_VIOLATION", "violation_time", 1e6, "us",
                "Throttling duration due to thermal constraints (in us).",
                select=("thermal",)),
    CompatField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_errors", 1.0, "errors",
                "Total number of single-bit volatile ECC errors.",
                select=("corrected", "volatile")),
    CompatField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_errors", 1.0, "errors",
                "Total number of double-bit volatile ECC errors.",
                select=("uncorrected", "volatile")),
    CompatField("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_errors", 1.0, "errors",
                "Total number of single-bit persistent ECC errors.",
                select=("corrected", "aggregate")),
    CompatField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_errors", 1.0, "errors",
                "Total number of double-bit persistent ECC errors.",
                select=("uncorrected", "aggregate")),
    CompatField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "nvlink_bytes", 1.0 / 1024, "KiB",
                "Total number of NVLink bandwidth counters for all lanes (data KiB"
                " transmitted and received over every link).", reduce="sum"),
    CompatField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_rows", 1.0, "rows",
                "Number of remapped rows for correctable errors.", select=("correctable",),
                declared_type="counter"),
    CompatField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_rows", 1.0, "rows",
                "Number of remapped rows for uncorrectable errors.",
                select=("uncorrectable",), declared_type="counter"),
)

COMPAT_FIELDS: tuple[CompatField, ...] = (
    *(CompatField(c.name, m.key, c.scale, _UNITS[c.name], c.help or m.help,
                  per_instance=c.name in _PER_INSTANCE)
      for m in CATALOGUE for c in m.compat),
    *_DERIVED,
)

XID_NAME = "DCGM_FI_DEV_XID_ERRORS"
XID_HELP = ("dcgm-exporter compatibility: value of the last XID error seen (0 when none);"
            " kept, with the GPU's identity labels, while the GPU is down.")
XID_SOURCE = "the last code of gpu_xid_errors_total (NVML nvmlEventSetWait)"

COMPAT_NAMES: tuple[str, ...] = (*(f.name for f in COMPAT_FIELDS), XID_NAME)

# NVIDIA's DCGM dashboard (grafana.com 12239, dcgm-exporter's grafana/ folder): each
# panel and the dcgm-exporter name it reads. The two on DCGM_FI_PROF_* need DCGM
# profiling (the dcgm backend where profiling is available); on a GPU in MIG mode they
# show one line per GPU instance. docs/METRICS.md and dashboards/README.md list them.
NVIDIA_DASHBOARD_PANELS: tuple[tuple[str, str], ...] = (
    ("GPU Temperature", "DCGM_FI_DEV_GPU_TEMP"),
    ("GPU Avg. Temp", "DCGM_FI_DEV_GPU_TEMP"),
    ("GPU Power Usage", "DCGM_FI_DEV_POWER_USAGE"),
    ("GPU Power Total", "DCGM_FI_DEV_POWER_USAGE"),
    ("GPU SM Clocks", "DCGM_FI_DEV_SM_CLOCK"),
    ("GPU Utilization", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("Tensor Core Utilization", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("GPU Framebuffer Mem Used", "DCGM_FI_DEV_FB_USED"),
)


def needs_profiling(compat_name: str) -> bool:
    """True for a name only DCGM's profiling module measures (DCGM_FI_PROF_*)."""
    return compat_name.startswith("DCGM_FI_PROF_")

# Labels of a compat series, in dcgm-exporter's order; the conditional ones in brackets
# of the docs. The host label's name is a setting (DEFAULT_HOST_LABEL).
GPU_LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", MODEL_LABEL)
TAIL_LABELS: tuple[str, ...] = ("DCGM_FI_DRIVER_VERSION",)


def _check() -> None:
    names = list(COMPAT_NAMES)
    if len(set(names)) != len(names):
        raise AssertionError("a dcgm-exporter name is declared twice")
    for f in COMPAT_FIELDS:
        m = BY_KEY[f.key]
        if f.select is not None and len(f.select) != len(m.labels):
            raise AssertionError(f"{f.name}: select does not match {m.name}'s labels")
        if (f.select is None and f.reduce == "value") != (not m.labels):
            raise AssertionError(f"{f.name}: a labelled field needs select or a reduction")


_check()


def promtool_complaints(families: Mapping[str, Iterable[str]]) -> set[str]:
    """The distinct `promtool check metrics` lines ("NAME complaint") that compat families
    with these label names draw, by promtool 2.42's lint rules (camelCase label names; a
    type name inside the metric name). promtool repeats the label complaint once per
    series. Used by the docs and the tests."""
    out = set()
    for name, labels in families.items():
        if any(_CAMEL.search(lb) for lb in labels):
            out.add(f"{name} {CAMEL_CASE_COMPLAINT}")
        if "_counter_" in name.lower() or name.lower().endswith("_counter"):
            out.add(f"{name} {COUNTER_IN_NAME_COMPLAINT}")
    return out


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


@dataclass(frozen=True, slots=True)
class CompatOptions:
    """How the profile labels its series."""

    host_label: str = DEFAULT_HOST_LABEL
    promtool_clean: bool = False  # leave out modelName and the _COUNTER name


def _quote(value: str) -> str:
    """A label value escaped for the text format."""
    return escape_label_value(value)


def _pod_labels(procs: Iterable[AttributedProcess]) -> str:
    """pod/namespace/container of the Kubernetes container the processes belong to.

    Several containers on one GPU (time-slicing, MPS) keep only what they all share,
    as the kubelet source does for a shared device; nothing when none is in a pod."""
    refs = {(a.k8s_pod, a.k8s_namespace, a.k8s_container)
            for a in (ap.attribution for ap in procs) if a.k8s_pod or a.k8s_namespace}
    if not refs:
        return ""
    pods, namespaces, containers = ({r[i] for r in refs} for i in range(3))
    parts = []
    if len(namespaces) == 1 and len(pods) == 1:
        parts.append(f'pod="{_quote(next(iter(pods)))}"')
        if len(containers) == 1 and next(iter(containers)):
            parts.append(f'container="{_quote(next(iter(containers)))}"')
    if len(namespaces) == 1 and next(iter(namespaces)):
        parts.append(f'namespace="{_quote(next(iter(namespaces)))}"')
    return "".join("," + p for p in sorted(parts) if not p.startswith('pod=""'))


class _Labels:
    """The label text of one GPU's compat series (and of its MIG instances)."""

    def __init__(self, g: GpuSample, snap: Snapshot, opts: CompatOptions) -> None:
        i = g.info
        driver = i.driver_version or snap.backend.driver_version
        head = (f'gpu="{i.index}",UUID="{_quote(i.uuid)}",pci_bus_id="{_quote(i.pci_bus_id)}",'
                f'device="nvidia{i.index}"')
        if not opts.promtool_clean:
            head += f',{MODEL_LABEL}="{_quote(i.name)}"'
        self._head = head
        tail = f',{opts.host_label}="{_quote(snap.host)}",DCGM_FI_DRIVER_VERSION="{_quote(driver)}"'
        self._sim = ',simulated="true"' if snap.backend.simulated else ""
        self._tail = tail
        self._procs = snap.processes.get(g.uuid, ())
        self.gpu = head + tail + _pod_labels(self._procs) + self._sim

    def instance(self, mi: MigInstance) -> str:
        procs = [ap for ap in self._procs if ap.process.gpu_instance_id == mi.gpu_instance_id]
        return (f'{self._head},GPU_I_PROFILE="{_quote(mi.profile)}",'
                f'GPU_I_ID="{mi.gpu_instance_id}"{self._tail}{_pod_labels(procs)}{self._sim}')


def _value(f: CompatField, g: GpuSample) -> float | None:
    values = g.values.get(f.key)
    if not values:
        return None
    if f.select is not None:
        return values.get(f.select)
    if f.reduce == "sum":
        return float(sum(values.values()))
    if f.reduce == "bitmask":
        mask = 0
        for (reason,), active in values.items():
            if active:
                mask |= CLOCK_EVENT_REASONS.get(reason, 0)
        return float(mask)
    return values.get(())


def _instance_value(f: CompatField, mi: MigInstance) -> float | None:
    total, used = mi.memory_total_bytes, mi.memory_used_bytes
    if f.key == "memory_total":
        return None if total is None else float(total)
    if f.key == "memory_used":
        return None if used is None else float(used)
    if f.key == "memory_free":
        return None if total is None or used is None else float(max(total - used, 0))
    return None


def render_compat(snap: Snapshot, out: list[str], last_xid_codes: Mapping[str, int],
                  opts: CompatOptions | None = None) -> tuple[int, int]:
    """Append the compat families to `out`; return (samples, families) written."""
    opts = opts or CompatOptions()
    labels = {g.uuid: _Labels(g, snap, opts) for g in snap.gpus}
    up = [g for g in snap.gpus if g.up]
    series = families = 0

    def emit(name: str, help_: str, lines: list[str]) -> None:
        nonlocal series, families
        if lines:
            out.append(header(name, "gauge", help_))
            out.extend(lines)
            series += len(lines)
            families += 1

    for f in COMPAT_FIELDS:
        if f.name in LINT_REJECTED_NAMES and opts.promtool_clean:
            continue
        lines = []
        for g in up:
            measured = [mi for mi in g.mig if f.key in mi.values]
            if measured:  # measured per MIG instance (DCGM profiling)
                for mi in measured:
                    text = _text(mi.values[f.key], f.scale)
                    if text is not None:
                        lines.append(f"{f.name}{{{labels[g.uuid].instance(mi)}}} {text}\n")
                continue
            if f.key in g.unsupported:
                continue
            if f.per_instance and g.mig:
                for mi in g.mig:
                    text = _text(_instance_value(f, mi), f.scale)
                    if text is not None:
                        lines.append(f"{f.name}{{{labels[g.uuid].instance(mi)}}} {text}\n")
                continue
            text = _text(_value(f, g), f.scale)
            if text is not None:
                lines.append(f"{f.name}{{{labels[g.uuid].gpu}}} {text}\n")
        emit(f.name, f.full_help(), lines)

    # Every GPU the exporter knows, up or not: a GPU that fell off the bus keeps its
    # last XID (79), which is exactly when an XID alert must not resolve.
    emit(XID_NAME, XID_HELP,
         [f"{XID_NAME}{{{labels[g.uuid].gpu}}} {last_xid_codes.get(g.uuid, 0)}\n"
          for g in snap.gpus])
    return series, families


def _text(value: float | None, scale: float) -> str | None:
    if value is None:
        return None
    scaled = value * scale
    if not math.isfinite(scaled):
        return None  # NaN/Inf means "not measured"
    if scale != 1.0 and abs(scaled - round(scaled)) < 1e-9 * max(1.0, abs(scaled)):
        scaled = float(round(scaled))  # 5 GiB / MiB is 5120, not 5119.999999999999
    return fmt_value(scaled)

