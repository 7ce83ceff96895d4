"""The simulator's wiring around the exporter: what `--backend sim` needs besides its
samples, as the exporter's `BackendHooks` (exporter/backends/base.py).

- a fake /proc mirroring the simulated processes (and an empty user database), so the
  real resolver attributes them, when the configured procfs root is the default /proc;
- a simulated kubelet (its pod-resources API) when the scenario declares pods and no
  kubelet is configured, so the real kubelet source reads them;
- the clock of the sampling cycles: the wall clock the run uses, also with a
  `time_scale` (the story runs faster, the records are dated when they were sampled:
  each covers the wall time since the last, the audit's `exporter_stop` comes after
  them, and a bill of the run's wall-clock period finds them);
- the SIMULATED DATA warning once the backend is open.

`sim_backend(config)` is the simulator's entry point for the app layer
(gpu_audit_app/run.py); the exporter's production modules never import this package.
Everything here is removed at `close()`. It must never be used unless the simulator was
asked for by name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exporter.attribution.config import AttributionConfig
from exporter.config import ExporterConfig
from exporter.sim.backend import SimBackend, create
from exporter.sim.fakeproc import SimProcfs
from gpu_audit.model.samples import BackendInfo, GpuSample

log = logging.getLogger("gpu_audit.exporter")


class SimHarness:
    """The simulator's `BackendHooks`."""

    def __init__(self, backend: SimBackend, interval_seconds: float) -> None:
        self._backend = backend
        self._interval_seconds = interval_seconds
        self._procfs: SimProcfs | None = None
        self._kubelet: Any = None  # a SimKubelet, only for a scenario that declares pods

    def opened(self, info: BackendInfo, attribution: AttributionConfig) -> AttributionConfig:
        log.warning("SIMULATED DATA: backend 'sim' (%s); every GPU and process "
                    'series carries simulated="true", every audit record '
                    '"simulated": true', info.detail)
        # A scenario tied to this host (`host:`) reports real processes: attribution
        # reads the host's /proc for them, so no fake /proc is written.
        if attribution.procfs_root == Path("/proc") and not self._backend.uses_host_processes:
            self._procfs = SimProcfs()
            attribution = attribution.model_copy(update={
                "procfs_root": self._procfs.root,
                "passwd_file": attribution.passwd_file or self._procfs.passwd,
            })
        if not attribution.kubelet.enabled:
            # A scenario that declares pods brings its own Kubernetes node: a kubelet
            # pod-resources API the real kubelet source reads.
            allocations = self._backend.scenario.pod_allocations()
            if allocations:
                # grpc costs ~150 ms to import: only scenarios with pods pay for it
                from exporter.sim.kubelet import SimKubelet  # noqa: PLC0415

                self._kubelet = SimKubelet(allocations)
                kubelet = attribution.kubelet.model_copy(update={
                    "enabled": True, "socket": self._kubelet.socket,
                    "refresh_seconds": max(self._interval_seconds, 1.0)})
                attribution = attribution.model_copy(update={"kubelet": kubelet})
        return attribution

    def clock(self) -> float:
        return self._backend.wall_time()

    def before_attribution(self, gpus: Sequence[GpuSample]) -> None:
        if self._procfs is not None:
            self._procfs.update(gpus)

    def close(self) -> None:
        if self._kubelet is not None:
            self._kubelet.stop()
            self._kubelet = None
        if self._procfs is not None:
            self._procfs.remove()
            self._procfs = None


def sim_backend(config: ExporterConfig) -> tuple[SimBackend, SimHarness]:
    """The simulator backend for `config` (ConfigError without a usable scenario) and
    the hooks it brings."""
    backend = create(config)
    return backend, SimHarness(backend, config.interval_seconds)
