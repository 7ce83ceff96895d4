"""`gpu-audit run` and `gpu-audit exporter`: the exporter's process, with the shipper in it
for `run`.

The exporter knows no shipper: it drives a `Companion` at fixed points of its start and
stop (exporter/app.py has the order and why). `EmbeddedShipper` is that companion: the
sinks' secrets are resolved before the backend opens, the shipper's locks are taken
after the spool's, it ships what the exporter's writer has made durable, and at stop it
drains the exporter_stop record before releasing its locks. `gpu-audit exporter` with a
shipper enabled elsewhere gets the split-mode spool GC instead.

The backend is chosen here too (`open_backend`): a hardware backend from
exporter.backends, or the simulator with its harness (exporter/sim/harness.py) when the
configuration names it; the exporter itself never chooses the simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.registry import Collector

from exporter.app import ExporterApp, run_exporter
from exporter.audit_spool import SpoolGcPlan
from exporter.backends import BackendHooks, GpuBackend, create_backend
from exporter.config import ExporterConfig
from gpu_audit.spool import SpoolWriter
from gpu_audit_app.config import Config, config_seal_key


class EmbeddedShipper:
    """The shipper as the exporter's companion in one process (`gpu-audit run`)."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._sinks: list[Any] | None = None
        self.shipper: Any = None  # shipper.engine.Shipper once opened

    def prepare(self) -> None:
        # Imported here: `gpu-audit exporter` and check-config never pay for the sinks.
        from shipper.sinks.registry import create_sink  # noqa: PLC0415

        cfg = self._config
        # resolves every secret now; a sink only connects when it is started
        self._sinks = [create_sink(c, spool_dir=Path(cfg.spool.directory),
                                   seal_key=config_seal_key(cfg))
                       for c in cfg.shipper.sinks]

    def open(self, writer: SpoolWriter | None) -> Collector:
        from shipper.engine import Shipper  # noqa: PLC0415

        cfg = self._config
        self.shipper = Shipper(cfg.shipper, cfg.spool, writer=writer, sinks=self._sinks)
        collector: Collector = self.shipper.collector()
        return collector

    def start(self) -> None:
        self.shipper.start()

    def stop(self) -> None:
        if self.shipper is None:
            return
        if self.shipper.started:
            self.shipper.drain()  # the exporter_stop record included
        self.shipper.stop()  # releases its locks even when it never started

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.shipper.stats()
        return stats


def open_backend(config: ExporterConfig) -> tuple[GpuBackend, BackendHooks | None]:
    """The backend `exporter.backend` names and the hooks it brings: the simulator only
    when asked for by name, never as a fallback."""
    if config.backend == "sim":
        # Imported here: a hardware exporter never loads the simulator.
        from exporter.sim.harness import sim_backend  # noqa: PLC0415

        return sim_backend(config)
    return create_backend(config), None


def exporter_app(config: Config, *, with_shipper: bool) -> ExporterApp:
    """The exporter process `gpu-audit run` (with_shipper) or `gpu-audit exporter` runs."""
    if not config.shipper.enabled:
        return ExporterApp(config, backends=open_backend)
    if with_shipper:
        return ExporterApp(config, backends=open_backend, companion=EmbeddedShipper(config))
    plan = SpoolGcPlan(tuple(config.shipper.sink_names()), config.shipper.gc_interval_s)
    return ExporterApp(config, backends=open_backend, spool_gc=plan)


def run(config: Config, *, with_shipper: bool) -> int:
    """Run until SIGTERM/SIGINT; the process exit code."""
    return run_exporter(exporter_app(config, with_shipper=with_shipper))
