"""Simulated GPUs: the GpuStateSource of tests, replay and `gpus: sim:N` daemons.

Processes appear on a simulated GPU when a simulated (or sim-bound) executor starts a job
and disappear when it ends (or stay, to simulate a leak); tests set temperature,
throttling, XIDs and loss. Everything here is make-believe and says so: it is used only
when asked for by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from launcher.gpustate import GIB, GpuInfo


@dataclass
class SimProcess:
    pid: int
    used_bytes: int
    utilization: float = 1.0


@dataclass
class SimGpu:
    uuid: str
    index: int
    memory_total_bytes: int
    name: str = "Simulated GPU"
    temperature_c: float = 45.0
    throttling: bool = False
    up: bool = True
    last_xid: float | None = None
    foreign_used_bytes: int = 0  # memory used outside any process we know (driver, others)
    processes: dict[int, SimProcess] = field(default_factory=dict)


class SimGpuSource:
    """N simulated GPUs. The simulated executor adds a job's processes when it starts and
    removes them when they exit (or leaves them behind, to simulate a leak); tests set
    temperature, throttling, XIDs and loss. Lost GPUs stay listed with `up=False`."""

    def __init__(self, count: int, *, memory_total_bytes: int = 80 * GIB,
                 xid_window_seconds: float = 3600.0, name: str = "Simulated GPU") -> None:
        self.gpus = [SimGpu(uuid=f"GPU-sim-{i:04d}", index=i,
                            memory_total_bytes=memory_total_bytes, name=name)
                     for i in range(count)]
        self._by_uuid = {g.uuid: g for g in self.gpus}
        self.xid_window = xid_window_seconds

    def gpu(self, key: str | int) -> SimGpu:
        """A GPU by uuid or index."""
        return self.gpus[key] if isinstance(key, int) else self._by_uuid[key]

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    def add_process(self, gpu: str | int, pid: int, used_bytes: int,
                    utilization: float = 1.0) -> None:
        self.gpu(gpu).processes[pid] = SimProcess(pid, used_bytes, utilization)

    def remove_process(self, gpu: str | int, pid: int) -> None:
        self.gpu(gpu).processes.pop(pid, None)

    def remove_pids(self, pids: Iterable[int]) -> None:
        """Remove these processes from every GPU (the processes exited)."""
        gone = set(pids)
        for g in self.gpus:
            for pid in gone & g.processes.keys():
                del g.processes[pid]

    def set_temperature(self, gpu: str | int, celsius: float) -> None:
        self.gpu(gpu).temperature_c = celsius

    def set_throttling(self, gpu: str | int, throttling: bool) -> None:
        self.gpu(gpu).throttling = throttling

    def xid(self, gpu: str | int, at: float) -> None:
        """An XID error on this GPU at time `at`."""
        self.gpu(gpu).last_xid = at

    def set_up(self, gpu: str | int, up: bool) -> None:
        """Lose (False) or recover (True) a GPU."""
        self.gpu(gpu).up = up

    def read(self, now: float) -> list[GpuInfo]:
        out = []
        for g in self.gpus:
            if not g.up:
                out.append(GpuInfo(uuid=g.uuid, index=g.index, name=g.name, up=False,
                                   pci_bus_id=f"00000000:{g.index + 1:02X}:00.0"))
                continue
            procs = [(p.pid, p.used_bytes) for p in g.processes.values()]
            used = min(g.memory_total_bytes, g.foreign_used_bytes + sum(u for _, u in procs))
            util = min(1.0, sum(p.utilization for p in g.processes.values()))
            out.append(GpuInfo(
                uuid=g.uuid, index=g.index, pci_bus_id=f"00000000:{g.index + 1:02X}:00.0",
                name=g.name, memory_total_bytes=g.memory_total_bytes, memory_used_bytes=used,
                temperature_c=g.temperature_c, throttling=g.throttling,
                recent_xid=g.last_xid is not None and 0 <= now - g.last_xid <= self.xid_window,
                up=True, processes=procs, utilization=util))
        return out
