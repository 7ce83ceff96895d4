"""The simulator backend: a GpuBackend that plays a scenario instead of reading hardware.

Used only when asked for by name (`--backend sim --scenario NAME|FILE`). It says so
everywhere: BackendInfo.simulated is True (the renderer turns that into a
`simulated="true"` label) and `open()` logs a WARNING that the data is simulated.

Scenario time runs from `start_time` (default: the wall time at open, so timestamps look
current) at `time_scale` scenario seconds per second of `clock`. The `now` the sampler
passes in is ignored: the backend reads its own injectable clock, so tests can drive it
deterministically and demos can run hours of story in minutes. `time_scale` speeds up
the story (processes, ramps, events), not the physics: counters accrue per second of
`clock` (exporter.sim.device), and `gpu-audit run` dates its snapshots and records on
the wall clock (exporter.sim.harness), so a bill of the run's wall-clock period holds
the GPU time and energy that period had.

This module must never be chosen as a fallback for a failed real backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from exporter.config import ExporterConfig
from exporter.sim.device import SimDevice
from exporter.sim.hostprocs import HostProcesses
from exporter.sim.scenario import SHIPPED, Scenario, load_scenario
from gpu_audit.errors import ConfigError
from gpu_audit.model.samples import BackendInfo, GpuSample

log = logging.getLogger("gpu_audit.sim")


class SimBackend:
    """Plays a scenario as a GPU backend."""

    name = "sim"

    def __init__(
        self,
        scenario: Scenario,
        *,
        time_scale: float = 1.0,
        start_time: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, not {time_scale}")
        self.scenario = scenario
        self.time_scale = time_scale
        self._start_time = start_time
        self._clock = clock
        self._opened_at: float | None = None
        self._origin = 0.0
        self._devices: list[SimDevice] = []
        self._last_t = 0.0
        self._errors: dict[str, int] = {}
        self._host: HostProcesses | None = None

    @property
    def uses_host_processes(self) -> bool:
        """True when the scenario runs this host's real processes (`host:`): attribution
        must then read the host's own /proc, not a fake one."""
        return self.scenario.spec.host is not None

    def open(self) -> BackendInfo:
        """Build the simulated devices. Never raises BackendUnavailable: the scenario was
        validated when it was loaded."""
        self._opened_at = self._clock()
        self._origin = self._start_time if self._start_time is not None else self._opened_at
        self._last_t = 0.0
        self._errors = {}
        spec = self.scenario.spec
        self._devices = [
            SimDevice(
                plan,
                [p for p in self.scenario.processes if p.gpu_index == plan.info.index],
                [e for e in self.scenario.events if e.gpu == plan.info.index],
                seed=spec.seed,
                dcgm=spec.dcgm,
                boot_seconds=spec.boot_seconds,
                origin=self._origin,
                time_scale=self.time_scale,
            )
            for plan in self.scenario.gpus
        ]
        host = self.scenario.spec.host
        self._host = HostProcesses(host) if host is not None else None
        if host is not None:
            log.warning("SIMULATED DATA: this host's processes holding %s run on the "
                        "simulated GPUs", ", ".join(host.devices))
        log.warning(
            "SIMULATED DATA: backend 'sim' is playing scenario %r (%d GPUs, %d processes, "
            "time scale %g); no real GPU is read",
            self.scenario.name, len(self._devices), len(self.scenario.processes),
            self.time_scale,
        )
        return BackendInfo(
            name="sim",
            driver_version=spec.driver_version,
            cuda_version=spec.cuda_version,
            library_version="sim",
            simulated=True,
            detail=f"scenario {self.scenario.name}",
        )

    @property
    def elapsed_scenario_seconds(self) -> float:
        """Scenario seconds since open (never negative)."""
        if self._opened_at is None:
            return 0.0
        return max((self._clock() - self._opened_at) * self.time_scale, 0.0)

    def wall_time(self) -> float:
        """The clock the scenario runs against (the wall clock unless a test gives one)."""
        return self._clock()

    def scenario_time(self) -> float:
        """The current scenario time as unix seconds (start_time + elapsed)."""
        return self._origin + self.elapsed_scenario_seconds

    @property
    def devices(self) -> Sequence[SimDevice]:
        return tuple(self._devices)

    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        """Every simulated GPU at the current scenario time (`now` is not used)."""
        if self._opened_at is None:
            raise RuntimeError("SimBackend.sample() called before open()")
        # A wall clock stepped backwards must not make counters go backwards.
        t = max(self.elapsed_scenario_seconds, self._last_t)
        self._last_t = t
        if self._host is None:
            samples = [device.sample(t, slow) for device in self._devices]
        else:
            for ev in self._host.poll():
                if ev.gpu < len(self._devices):
                    self._devices[ev.gpu].inject(ev.kind, t, ev.xid)
                else:
                    log.warning("simulator: live event for GPU %d, which does not exist "
                                "(skipped)", ev.gpu)
            held = self._host.scan()
            samples = [device.sample(t, slow, held.get(i, ()))
                       for i, device in enumerate(self._devices)]
        for s in samples:
            if not s.up and s.error:
                self._errors[s.error] = self._errors.get(s.error, 0) + 1
        return samples

    def error_counts(self) -> Mapping[str, int]:
        return dict(self._errors)

    def close(self) -> None:
        self._devices = []
        self._host = None
        self._opened_at = None


def create(config: ExporterConfig) -> SimBackend:
    """The simulator backend for `config` (needs config.scenario)."""
    if not config.scenario:
        raise ConfigError(
            "exporter.scenario",
            [
                "backend 'sim' needs a scenario: pass --scenario NAME|FILE or set "
                f"exporter.scenario (shipped: {', '.join(SHIPPED)})"
            ],
        )
    return SimBackend(load_scenario(config.scenario), time_scale=config.time_scale)
