"""Loading simulator scenarios: shipped names or files, validated, expanded into a plan.

`load_scenario` reads a scenario (a shipped short name such as "busy", or a path),
validates it against exporter.sim.schema, runs the whole-file checks (unique uuids and
pids, memory budgets, MIG layouts, event targets, placeholders) and expands it into a
`Scenario`: concrete GPUs with identities and concrete processes with the identity
information attribution needs. Every problem found, structural or semantic, is reported
together in one ConfigError with its line number.

This module must never compute samples or fall back to a default scenario.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from exporter.sim.curves import curve_bounds, seed_key
from exporter.sim.schema import (
    CurveSpec,
    EventSpec,
    GpuSpec,
    HostSpec,
    MigSpec,
    PodSpec,
    ProcessSpec,
    ScenarioSpec,
    UtilSpec,
)
from gpu_audit.errors import ConfigError
from gpu_audit.model.samples import GpuInfo, MigInstance, ProcessIdentity, ProcessType
from gpu_audit.yamlload import format_validation_error, load_yaml, read_text

SHIPPED: tuple[str, ...] = ("busy", "idle", "leak", "hot", "xid", "mig", "large")

CLOCK_TICKS_PER_SECOND = 100  # USER_HZ on every Linux architecture we target
PLACEHOLDERS: tuple[str, ...] = ("pid", "gpu", "rank", "local_rank", "hex64", "uuid", "uuid_")
# Typical PCI bus numbers of an 8-GPU HGX board, used when a scenario names none.
_DEFAULT_BUSES: tuple[int, ...] = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_MiB = 1024**2

Loc = tuple[str | int, ...]
ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """One concrete simulated GPU."""

    info: GpuInfo
    spec: GpuSpec
    mig: tuple[MigInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """One concrete simulated process on one GPU."""

    gpu_index: int
    pid: int
    name: str
    uid: int | None
    type: ProcessType
    start: float
    end: float | None
    memory: CurveSpec
    util: UtilSpec
    gpu_instance_id: int | None
    compute_instance_id: int | None
    identity: ProcessIdentity
    source_index: int  # position in the file's `processes` list
    pod: PodSpec | None = None
    device_id: str = ""  # what a device plugin calls its GPU: the GPU or MIG uuid
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated, expanded scenario. Immutable; the backend compiles it for sampling."""

    name: str
    description: str
    source: str
    spec: ScenarioSpec
    gpus: tuple[GpuPlan, ...]
    processes: tuple[ProcessPlan, ...]
    events: tuple[EventSpec, ...]

    @property
    def seed(self) -> int:
        return self.spec.seed

    @property
    def duration_seconds(self) -> float:
        return self.spec.duration_seconds

    def pod_allocations(self) -> list[PodAllocation]:
        """What a kubelet on this node would list: each declared pod container with the
        devices its processes run on, in scenario order."""
        out: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        for p in self.processes:
            if p.pod is None:
                continue
            devices = out.setdefault((p.pod.namespace, p.pod.name, p.pod.container), {})
            ids = devices.setdefault(p.resource, [])
            if p.device_id not in ids:
                ids.append(p.device_id)
        return [PodAllocation(ns, pod, container, res, tuple(ids))
                for (ns, pod, container), devices in out.items()
                for res, ids in devices.items()]


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """One container's devices of one resource, as the kubelet's List() reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def shipped_path(name: str) -> Path:
    """The packaged file of a shipped scenario."""
    return Path(str(resources.files("exporter.sim").joinpath("scenarios", f"{name}.yaml")))


def load_scenario(name_or_path: str) -> Scenario:
    """Load a shipped scenario by short name, or a scenario file by path.

    Raises ConfigError listing every problem (with line numbers) when the file is
    missing, not YAML, or not a valid scenario.
    """
    path = shipped_path(name_or_path) if name_or_path in SHIPPED else Path(name_or_path)
    source = str(path)
    if not path.is_file():
        raise ConfigError(
            source,
            [f"no such scenario file; shipped scenarios are: {', '.join(SHIPPED)}"],
        )
    return parse_scenario(read_text(path), source)


def parse_scenario(text: str, source: str) -> Scenario:
    """Validate and expand scenario YAML text (see load_scenario)."""
    data, marks = load_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, ["top level must be a mapping with name, gpus, processes"])
    checker = _Checker(marks)
    try:
        spec: ScenarioSpec | None = ScenarioSpec.model_validate(data)
    except ValidationError as exc:
        spec = None
        checker.problems.extend(format_validation_error(exc, marks, data))
    if spec is not None:
        gpus = list(enumerate(spec.gpus))
        procs = list(enumerate(spec.processes))
        events = list(enumerate(spec.events))
        seed, name, boot = spec.seed, spec.name, spec.boot_seconds
        all_gpus_valid = True
    else:
        # Check what did validate, so one run reports structural and semantic problems.
        gpus = _partial(GpuSpec, data.get("gpus"))
        procs = _partial(ProcessSpec, data.get("processes"))
        events = _partial(EventSpec, data.get("events"))
        raw_gpus = data.get("gpus")
        all_gpus_valid = isinstance(raw_gpus, list) and len(gpus) == len(raw_gpus)
        raw_seed = data.get("seed")
        seed = raw_seed if isinstance(raw_seed, int) else 0
        name = str(data.get("name", ""))
        boot = data.get("boot_seconds", 86400.0)
        boot = float(boot) if isinstance(boot, int | float) else 86400.0
    versions = (
        (spec.driver_version, spec.cuda_version) if spec is not None else ("", "")
    )
    plans = checker.gpus(gpus, seed, name, versions)
    processes = checker.processes(
        specs=procs, gpus=plans, all_gpus_valid=all_gpus_valid, seed=seed, name=name, boot=boot
    )
    checker.events(events, len(plans), all_gpus_valid)
    if spec is not None and spec.host is not None:
        checker.host(spec.host, len(plans) if all_gpus_valid else None, bool(spec.processes))
    if checker.problems:
        raise ConfigError(source, checker.problems)
    assert spec is not None
    return Scenario(
        name=spec.name,
        description=spec.description,
        source=source,
        spec=spec,
        gpus=tuple(plans),
        processes=tuple(processes),
        events=tuple(sorted(spec.events, key=lambda e: e.at)),
    )


def _partial(model: type[ModelT], raw: Any) -> list[tuple[int, ModelT]]:
    if not isinstance(raw, list):
        return []
    out = []
    for i, item in enumerate(raw):
        try:
            out.append((i, model.model_validate(item)))
        except ValidationError:
            continue
    return out


def _uuid_text(*parts: object) -> str:
    hi, lo = seed_key(*parts, "hi"), seed_key(*parts, "lo")
    h = f"{hi:016x}{lo:016x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def mig_memory_default(profile: str) -> int:
    """Instance memory from a profile name ("3g.40gb" -> about 40 GB, MiB-aligned)."""
    gb = float(profile.split(".", 1)[1].split("gb", 1)[0])
    return int(gb * 1024 * 0.98) * _MiB


class _Checker:
    """Collects every whole-file problem, each with its line number."""

    def __init__(self, marks: Mapping[Loc, int]) -> None:
        self.marks = marks
        self.problems: list[str] = []

    def add(self, loc: Loc, message: str) -> None:
        path = loc
        line = None
        while path:
            if path in self.marks:
                line = self.marks[path]
                break
            path = path[:-1]
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        self.problems.append(f"{f'line {line}: ' if line else ''}{dotted}: {message}")

    # --- GPUs ----------------------------------------------------------------------------
    def gpus(
        self, specs: list[tuple[int, GpuSpec]], seed: int, name: str, versions: tuple[str, str]
    ) -> list[GpuPlan]:
        driver_version, cuda_version = versions
        plans: list[GpuPlan] = []
        seen: dict[str, Loc] = {}

        def unique(uuid: str, loc: Loc) -> None:
            if uuid in seen:
                dotted = ".".join(str(p) for p in seen[uuid])
                self.add(loc, f"duplicate uuid {uuid!r} (also at {dotted})")
            else:
                seen[uuid] = loc

        for gi, spec in specs:
            base: Loc = ("gpus", gi)
            for field in ("uuids", "serials", "pci_bus_ids"):
                given = getattr(spec, field)
                if given is not None and len(given) != spec.count:
                    self.add((*base, field), f"has {len(given)} entries but count is {spec.count}")
            self._gpu_ranges(spec, base)
            mig_loc: Loc = (*base, "mig")
            if spec.mig is not None:
                self._mig_layout(spec, mig_loc)
                for mi, m in enumerate(spec.mig):
                    if m.uuid and spec.count > 1:
                        self.add((*mig_loc, mi, "uuid"),
                                 "an explicit MIG uuid needs a GPU group with count 1")
            for k in range(spec.count):
                index = len(plans)
                uuid = _nth_or_none(spec.uuids, k) or f"GPU-{_uuid_text(seed, name, 'gpu', index)}"
                loc: Loc = (*base, "uuids", k) if spec.uuids else base
                if not uuid.startswith("GPU-"):
                    self.add(loc, f"GPU uuid {uuid!r} must start with 'GPU-' like NVML's")
                unique(uuid, loc)
                bus = _DEFAULT_BUSES[index % 8] + 0x100 * (index // 8)
                info = GpuInfo(
                    uuid=uuid,
                    index=index,
                    name=spec.model,
                    serial=_nth_or_none(spec.serials, k)
                    or f"1{seed_key(seed, name, index) % 10**12:012d}",
                    pci_bus_id=_nth_or_none(spec.pci_bus_ids, k)
                    or f"{bus // 0x100:08X}:{bus % 0x100:02X}:00.0",
                    vbios_version=spec.vbios_version,
                    driver_version=driver_version,
                    cuda_version=cuda_version,
                    minor_number=index,
                    mig_mode=spec.mig is not None,
                )
                mig = []
                for mi, m in enumerate(spec.mig or ()):
                    generated = _uuid_text(seed, name, "mig", index, m.gpu_instance_id)
                    muuid = m.uuid or f"MIG-{generated}"
                    if not muuid.startswith("MIG-"):
                        self.add((*mig_loc, mi, "uuid"), "MIG uuid must start with 'MIG-'")
                    unique(muuid, (*mig_loc, mi, "uuid"))
                    mig.append(MigInstance(
                        uuid=muuid,
                        gpu_instance_id=m.gpu_instance_id,
                        compute_instance_id=m.compute_instance_id,
                        profile=m.profile,
                        memory_total_bytes=_mig_memory(m),
                    ))
                plans.append(GpuPlan(info=info, spec=spec, mig=tuple(mig)))
        return plans

    def _gpu_ranges(self, spec: GpuSpec, base: Loc) -> None:
        if spec.memory_reserved >= spec.memory_total:
            self.add((*base, "memory_reserved"), "must be less than memory_total")
        max_power = spec.max_power_watts or spec.power_limit_watts * 0.95
        if spec.idle_power_watts > max_power:
            self.add((*base, "idle_power_watts"), f"above the full-load draw {max_power:g} W")
        if spec.max_power_watts is not None and spec.max_power_watts > spec.power_limit_watts:
            self.add((*base, "max_power_watts"), "above power_limit_watts")
        thermal = spec.thermal
        if thermal.hw_slowdown_celsius < thermal.slowdown_celsius:
            self.add((*base, "thermal", "hw_slowdown_celsius"), "below slowdown_celsius")
        if thermal.curve is not None:
            lo, hi = curve_bounds(thermal.curve, None)
            if lo < 0 or hi > 120:
                self.add((*base, "thermal", "curve"), "temperatures must stay within 0..120 C")
        if spec.clocks.sm_idle_mhz > spec.clocks.sm_max_mhz:
            self.add((*base, "clocks", "sm_idle_mhz"), "above sm_max_mhz")
        if spec.nvlink is not None:
            bad = [link for link in spec.nvlink.down_links if not 0 <= link < spec.nvlink.links]
            if bad:
                self.add((*base, "nvlink", "down_links"), f"no such link(s) {bad}")

    def _mig_layout(self, spec: GpuSpec, loc: Loc) -> None:
        assert spec.mig is not None
        ids = [m.gpu_instance_id for m in spec.mig]
        for mi, gid in enumerate(ids):
            if gid in ids[:mi]:
                self.add((*loc, mi, "gpu_instance_id"), f"duplicate gpu_instance_id {gid}")
        slices = sum(m.slices for m in spec.mig)
        if slices > 7:
            self.add(loc, f"instances use {slices} compute slices; a GPU has 7")
        memory = sum(_mig_memory(m) for m in spec.mig)
        if memory > spec.memory_total:
            self.add(loc, f"instances need {_describe_bytes(memory)}; the GPU has "
                          f"{_describe_bytes(spec.memory_total)}")

    # --- processes -------------------------------------------------------------------------
    def processes(
        self,
        *,
        specs: list[tuple[int, ProcessSpec]],
        gpus: list[GpuPlan],
        all_gpus_valid: bool,
        seed: int,
        name: str,
        boot: float,
    ) -> list[ProcessPlan]:
        out: list[ProcessPlan] = []
        pids_on_gpu: dict[tuple[int, int], Loc] = {}
        for pi, spec in specs:
            base: Loc = ("processes", pi)
            targets = self._targets(spec, len(gpus), all_gpus_valid, base)
            self._placeholders(spec, base)
            self._util_ranges(spec.util, (*base, "util"))
            if boot + spec.start < 0:
                self.add((*base, "start"),
                         f"starts before the driver loaded (boot_seconds {boot:g})")
            rank = 0
            for gpu_index in targets:
                gpu = gpus[gpu_index]
                instance = self._mig_target(spec, gpu, base)
                for local in range(spec.per_gpu):
                    pid = spec.pid + rank
                    key = (gpu_index, pid)
                    if key in pids_on_gpu:
                        where = ".".join(str(p) for p in pids_on_gpu[key])
                        self.add((*base, "pid"),
                                 f"pid {pid} is already on GPU {gpu_index} ({where})")
                    else:
                        pids_on_gpu[key] = base
                    values = _placeholder_values(
                        (seed, name, pi, rank), pid=pid, gpu=gpu_index, rank=rank, local=local
                    )
                    ticks = spec.start_time_ticks
                    if ticks is None:
                        ticks = max(0, int((boot + spec.start) * CLOCK_TICKS_PER_SECOND))
                    out.append(ProcessPlan(
                        gpu_index=gpu_index,
                        pid=pid,
                        name=spec.name,
                        uid=spec.uid,
                        type=spec.type,
                        start=spec.start,
                        end=spec.end,
                        memory=spec.memory,
                        util=spec.util,
                        gpu_instance_id=instance.gpu_instance_id if instance else None,
                        compute_instance_id=instance.compute_instance_id if instance else None,
                        identity=ProcessIdentity(
                            pid=pid,
                            uid=spec.uid,
                            start_time_ticks=ticks,
                            environ={key: _fill_placeholders(text, values)
                                     for key, text in spec.environ.items()},
                            cgroup=_fill_placeholders(spec.cgroup, values),
                            software={name: version or ""
                                      for name, version in spec.software.items()},
                        ),
                        source_index=pi,
                        pod=spec.pod,
                        device_id=instance.uuid if instance else gpu.info.uuid,
                        resource=(f"nvidia.com/mig-{instance.profile}" if instance
                                  else "nvidia.com/gpu"),
                    ))
                    rank += 1
        self._memory_budgets(out, gpus)
        return out

    def _targets(self, spec: ProcessSpec, n_gpus: int, all_valid: bool, base: Loc) -> list[int]:
        wanted = list(range(n_gpus)) if spec.gpu == "all" else (
            [spec.gpu] if isinstance(spec.gpu, int) else list(spec.gpu)
        )
        if len(set(wanted)) != len(wanted):
            self.add((*base, "gpu"), "lists a GPU twice")
        bad = [g for g in wanted if not 0 <= g < n_gpus]
        if bad and all_valid:
            self.add((*base, "gpu"), f"no such GPU {bad}; the scenario has GPUs 0..{n_gpus - 1}")
        return [g for g in dict.fromkeys(wanted) if 0 <= g < n_gpus]

    def _mig_target(self, spec: ProcessSpec, gpu: GpuPlan, base: Loc) -> MigInstance | None:
        if spec.mig is None:
            if gpu.info.mig_mode:
                self.add((*base, "mig"), f"GPU {gpu.info.index} is in MIG mode: name the instance")
            return None
        if not gpu.info.mig_mode:
            self.add((*base, "mig"), f"GPU {gpu.info.index} is not in MIG mode")
            return None
        for inst in gpu.mig:
            if inst.gpu_instance_id == spec.mig:
                return inst
        self.add((*base, "mig"), f"GPU {gpu.info.index} has no MIG instance {spec.mig}")
        return None

    def _placeholders(self, spec: ProcessSpec, base: Loc) -> None:
        fields: list[tuple[Loc, str]] = [((*base, "cgroup"), spec.cgroup)]
        fields += [((*base, "environ", k), v) for k, v in spec.environ.items()]
        for loc, text in fields:
            try:
                names = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
            except ValueError as exc:
                self.add(loc, f"bad placeholder syntax: {exc}")
                continue
            unknown = [n for n in names if n not in PLACEHOLDERS]
            if unknown:
                self.add(loc, f"unknown placeholder(s) {unknown}; known: {list(PLACEHOLDERS)}")

    def _util_ranges(self, util: UtilSpec, loc: Loc) -> None:
        for field in ("sm", "mem", "enc", "dec"):
            lo, hi = curve_bounds(getattr(util, field), None)
            if lo < 0 or hi > 1:
                self.add((*loc, field), "utilisation is a ratio: keep it (and its noise) in 0..1")

    def _memory_budgets(self, procs: list[ProcessPlan], gpus: list[GpuPlan]) -> None:
        peaks: dict[int, float] = {}
        over: set[int] = set()  # processes already reported alone
        for p in procs:
            span = None if p.end is None else p.end - p.start
            lo, hi = curve_bounds(p.memory, span)
            loc: Loc = ("processes", p.source_index, "memory")
            if lo < 0:
                self.add(loc, "memory must not go below 0")
            if math.isinf(hi):
                self.add(loc, "grows without bound: give the linear curve a max "
                              "(or the process an end)")
                continue
            peaks[id(p)] = hi
            gpu = gpus[p.gpu_index]
            room = gpu.spec.memory_total - gpu.spec.memory_reserved
            if p.gpu_instance_id is not None:
                inst = next(m for m in gpu.mig if m.gpu_instance_id == p.gpu_instance_id)
                room = float(inst.memory_total_bytes or 0)
            if hi > room:
                over.add(id(p))
                self.add(loc, f"peaks at {_describe_bytes(hi)}, more than the "
                              f"{_describe_bytes(room)} available on GPU {p.gpu_index}")
        # The set of live processes only changes at a start, so the worst total is at one.
        reported: set[tuple[int, int | None]] = set()
        for p in procs:
            group = (p.gpu_index, p.gpu_instance_id)
            if group in reported:
                continue
            live = [q for q in procs if (q.gpu_index, q.gpu_instance_id) == group
                    and q.start <= p.start and (q.end is None or q.end > p.start)]
            total = sum(peaks.get(id(q), 0.0) for q in live)
            gpu = gpus[p.gpu_index]
            room = gpu.spec.memory_total - gpu.spec.memory_reserved
            if p.gpu_instance_id is not None:
                inst = next(m for m in gpu.mig if m.gpu_instance_id == p.gpu_instance_id)
                room = float(inst.memory_total_bytes or 0)
            if total > room and len(live) > 1 and not any(id(q) in over for q in live):
                reported.add(group)
                self.add(("processes", p.source_index, "memory"),
                         f"with the processes beside it on GPU {p.gpu_index} the peak total is "
                         f"{_describe_bytes(total)}, more than the "
                         f"{_describe_bytes(room)} available")

    # --- events ------------------------------------------------------------------------------
    def events(self, specs: list[tuple[int, EventSpec]], n_gpus: int, all_valid: bool) -> None:
        lost: dict[int, list[tuple[float, float]]] = {}
        for ei, ev in specs:
            if not ev.gpu < n_gpus:
                if all_valid:
                    self.add(("events", ei, "gpu"), f"no such GPU {ev.gpu}; the scenario has "
                                                    f"GPUs 0..{n_gpus - 1}")
                continue
            if ev.kind == "lost":
                end = ev.until if ev.until is not None else math.inf
                for a, b in lost.get(ev.gpu, []):
                    if ev.at < b and a < end:
                        self.add(("events", ei), f"overlaps another lost period of GPU {ev.gpu}")
                lost.setdefault(ev.gpu, []).append((ev.at, end))


    def host(self, host: HostSpec, n_gpus: int | None, declares_processes: bool) -> None:
        if n_gpus is not None and len(host.devices) != n_gpus:
            self.add(("host", "devices"), f"{len(host.devices)} device path(s) for {n_gpus} "
                                          "GPU(s): one per GPU, in GPU order")
        if len(set(host.devices)) != len(host.devices):
            self.add(("host", "devices"), "a device path is listed twice")
        if declares_processes:
            # their fake /proc is not written: attribution reads this host's own /proc
            self.add(("processes",), "a scenario with `host` runs this host's processes; "
                                     "it cannot also declare simulated ones")


def _describe_bytes(size: float) -> str:
    return f"{size / 1024**3:.2f} GiB ({size:.0f} bytes)"


def _nth_or_none(values: list[str] | None, index: int) -> str | None:
    return values[index] if values is not None and index < len(values) else None


def _mig_memory(m: MigSpec) -> int:
    return int(m.memory_total) if m.memory_total is not None else mig_memory_default(m.profile)


def _placeholder_values(
    key: tuple[object, ...], *, pid: int, gpu: int, rank: int, local: int
) -> dict[str, str]:
    uuid = _uuid_text(*key, "pod")
    hex64 = "".join(f"{seed_key(*key, 'ctr', i):016x}" for i in range(4))
    return {
        "pid": str(pid),
        "gpu": str(gpu),
        "rank": str(rank),
        "local_rank": str(local),
        "hex64": hex64,
        "uuid": uuid,
        "uuid_": uuid.replace("-", "_"),
    }


def _fill_placeholders(text: str, values: Mapping[str, str]) -> str:
    if "{" not in text:
        return text
    try:
        return text.format_map(values)
    except (KeyError, ValueError, IndexError):
        return text  # already reported by _placeholders
