"""Wiring of one exporter process: backend -> sampler -> (renderer, audit producer) ->
HTTP endpoint. The exporter alone; the app layer (gpu_audit_app.run) adds the shipper
as a `Companion` for `gpu-audit run`, so this module never imports another component.

Start-up order matters, because a failed start must leave no audit record behind:
configuration, web-config, the companion's secrets (the sinks') and the audit HMAC key
first (exit 2), then the backend (a missing driver ends here with a hint, never a
fallback to the simulator), then the locks (the spool's single writer, then the
companion's: the shipper's cursors, archive and dead-letter directories; another live
gpu-audit there is a refusal naming its pid, exit 1), then the listening socket (a port
in use, exit 1). Only then is exporter_start written and do sampling, serving and the
companion begin.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.audit_spool import ReopeningSpool, SplitModeGc, SpoolGcPlan
from exporter.backends import BackendHooks, BackendUnavailable, GpuBackend
from exporter.config import ExporterConfig
from exporter.endpoint import exporter_server
from exporter.exposition.render import RenderOptions
from exporter.inventory import Inventory, default_directory, open_inventory, source_of
from exporter.runstatus import runtime_status, summary_line
from exporter.sampler import Sampler, SnapshotListener
from exporter.watch import GpuWatch, SummaryLog
from gpu_audit import __version__
from gpu_audit import selfmetrics as selfm
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.metrics import AuditCollector
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, GpuAuditError, LockHeld
from gpu_audit.http.config import parse_listen
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from gpu_audit.http.webconfig import WebConfig, load_web_config
from gpu_audit.invocation import command
from gpu_audit.spool import (
    SpoolReader,
    SpoolWriter,
)
from gpu_audit.spool.config import SpoolConfig

log = logging.getLogger("gpu_audit.exporter")
# a restarted exporter dates its first record at least this long after the previous
# life's last one: a cycle's points spread over 1 s in VictoriaMetrics (docs/SHIPPER.md)
RESTART_GAP_SECONDS = 1.0

NO_GPU_HINT = (
    "To try gpu-audit on a machine without a GPU, run the simulator explicitly:\n"
    "  {command}\n"
    "(shipped scenarios: busy, idle, leak, hot, xid, mig, large; every GPU and process "
    'series made from simulated data carries simulated="true").'
)


BackendFactory = Callable[[ExporterConfig], tuple[GpuBackend, BackendHooks | None]]
"""The backend the configuration names, not yet open, and the hooks it brings (None for
the hardware backends). The app layer supplies it (gpu_audit_app.run.open_backend): this
module never chooses the simulator."""


class ExporterSettings(Protocol):
    """The configuration sections the exporter reads (the app layer's root configuration
    has them all; read-only, as the frozen models are)."""

    @property
    def host(self) -> str: ...

    @property
    def exporter(self) -> ExporterConfig: ...

    @property
    def attribution(self) -> AttributionConfig: ...

    @property
    def audit(self) -> AuditConfig: ...

    @property
    def spool(self) -> SpoolConfig: ...


class Companion(Protocol):
    """What the app layer runs inside the exporter's process (the shipper, for `gpu-audit
    run`), driven at fixed points of the exporter's start and stop so the start-up order
    above holds for it too."""

    def prepare(self) -> None:
        """Resolve secrets and settings (ConfigError); open nothing."""

    def open(self, writer: SpoolWriter | None) -> Collector:
        """Take its locks (LockHeld, OSError) to read the spool `writer` writes; returns
        its metrics for the live registry."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Finish (drain what was written, once started) and release its locks; safe
        when `open` was never called."""

    def stats(self) -> dict[str, Any]:
        """Its state for /status and the summary line (after `open`)."""


class ListenError(GpuAuditError):
    """The endpoint's socket could not be bound (port in use, address not local, ...)."""

    def __init__(self, listen: str, cause: OSError) -> None:
        self.listen = listen
        self.cause = cause
        super().__init__(f"cannot listen on {listen}: {cause.strerror or cause}")


class SamplerCollector(Collector):
    """Cumulative counters of the sampling loop and attribution, for the live registry."""

    def __init__(self, sampler: Sampler, resolver: Resolver) -> None:
        self._sampler = sampler
        self._resolver = resolver

    def collect(self) -> Iterator[Metric]:
        s = self._sampler.stats
        yield selfm.SAMPLE_CYCLES.counter(value=s.cycles)
        yield selfm.SAMPLE_FAILED_CYCLES.counter(value=s.failed_cycles)
        yield selfm.SAMPLE_CPU_SECONDS.counter(value=s.cpu_seconds)
        yield selfm.SNAPSHOT_LISTENER_ERRORS.counter(value=s.listener_errors)
        attr = selfm.ATTRIBUTION_EVENTS.counter()
        for kind, n in sorted(self._resolver.stats().items()):
            attr.add_metric([kind], n)
        yield attr


class ExporterApp:
    """One exporter process. `start()` raises ConfigError, BackendUnavailable, LockHeld,
    ListenError or OSError, and when it does no audit record has been written.

    `backends` makes the backend (and its hooks) once the configuration checks passed;
    `companion` runs beside it in this process (the app layer's shipper); `spool_gc`
    makes it delete shipped segments itself when a shipper runs in another process.
    """

    def __init__(self, config: ExporterSettings, *, backends: BackendFactory,
                 companion: Companion | None = None,
                 spool_gc: SpoolGcPlan | None = None) -> None:
        self.config = config
        self.backends = backends
        self.companion = companion
        self.spool_gc = spool_gc
        self.server: MetricsServer | None = None
        self.sampler: Sampler | None = None
        self.producer: AuditProducer | None = None
        self.spool: ReopeningSpool | None = None
        self._companion_open = False
        self._resolver: Resolver | None = None
        self._backend: GpuBackend | None = None
        self._hooks: BackendHooks | None = None
        self._inventory: Inventory | None = None

    def start(self) -> None:
        cfg = self.config
        ex = cfg.exporter
        # 1. everything a configuration error can stop (exit 2): nothing is opened yet
        host, port = parse_listen(ex.listen)
        web = load_web_config(ex.web_config_file) if ex.web_config_file else WebConfig()
        if self.companion is not None:
            self.companion.prepare()

        # 2. the backend (exit 1 with a hint when there is no GPU)
        backend, hooks = self.backends(ex)
        self._hooks = hooks
        info = backend.open()
        self._backend = backend
        attribution = cfg.attribution
        if hooks is not None:
            attribution = hooks.opened(info, attribution)
        resolver = Resolver(attribution)
        self._resolver = resolver

        stale = ex.stale_after_seconds or max(3 * ex.interval_seconds, 2.0)
        state = LatestState(stale)
        registry = CollectorRegistry(auto_describe=True)

        # 3. the locks: the spool's single writer, then the companion's (the shipper's)
        listeners: list[SnapshotListener] = []
        if cfg.audit.enabled or self.companion is not None:
            self.spool = ReopeningSpool(cfg.spool)
            self.spool.open_at_start()
            reader = SpoolReader(cfg.spool.directory) if cfg.spool.directory.is_dir() else None
            self.producer = AuditProducer(cfg.audit, self.spool, host=cfg.host,
                                          exporter_version=__version__,
                                          simulated=info.simulated, reader=reader,
                                          restart_gap_seconds=RESTART_GAP_SECONDS)
            listeners.append(self.producer.on_snapshot)
            registry.register(AuditCollector(self.producer))
            if self.spool_gc is not None and self.companion is None:
                listeners.append(SplitModeGc(cfg.spool.directory, self.spool_gc, self.spool))
        # After the producer: state changes and the periodic summary are logged once the
        # cycle's records are written (the summary counts them).
        listeners.append(GpuWatch())
        listeners.append(SummaryLog(ex.log_summary_interval_seconds,
                                    lambda: summary_line(self.runtime_status())))
        if self.companion is not None:
            writer = self.spool.writer if self.spool else None
            registry.register(self.companion.open(writer))
            self._companion_open = True
        # the GPU inventory (one exporter per inventory directory, like the spool)
        self._inventory = open_inventory(
            ex.inventory_directory or default_directory(cfg.spool.directory),
            source_of(info))

        # 4. the listening socket
        try:
            self.server = exporter_server(host, port, state, web, registry, limits=ex.http,
                                          extra_status=self.runtime_status)
        except OSError as exc:
            raise ListenError(ex.listen, exc) from exc

        # Nothing can refuse the start any more: the first record may be written.
        if self.producer is not None:
            self.producer.start()
        self.sampler = Sampler(
            backend, info, resolver,
            host=cfg.host,
            interval_seconds=ex.interval_seconds,
            slow_interval_seconds=ex.slow_interval_seconds,
            render_options=RenderOptions(
                dcgm_compat=ex.compat.dcgm_exporter,
                dcgm_host_label=ex.compat.host_label,
                dcgm_promtool_clean=ex.compat.promtool_clean,
                pid_label=ex.process_pid_label,
                max_process_series_per_gpu=ex.max_process_series_per_gpu,
            ),
            listeners=listeners,
            publish=state.publish,
            scenario_clock=hooks.clock if hooks is not None else None,
            before_attribution=hooks.before_attribution if hooks is not None else None,
            before_render=self._inventory.annotate,
            mig_weights=ex.mig_weights,
        )
        registry.register(SamplerCollector(self.sampler, resolver))
        self.server.start()
        state.set_backend(True)
        log.info("serving %s://%s:%d/metrics (backend %s)",
                 "https" if self.server.tls else "http", host, self.server.port, info.name)
        self.sampler.start()
        if self.companion is not None:
            self.companion.start()

    def runtime_status(self) -> dict[str, Any]:
        """The sampler, audit, spool and shipper sections of /status and the summary."""
        spool = self.spool
        return runtime_status(
            sampler=self.sampler, producer=self.producer,
            spool_dir=self.config.spool.directory if spool is not None else None,
            writer=spool.writer if spool is not None else None,
            shipper=self.companion if self._companion_open else None,
            spool_error=spool.last_error if spool is not None else "")

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self._inventory is not None:
            self._inventory.close()
        if self.producer is not None:
            self.producer.stop()
        if self.companion is not None:
            self.companion.stop()  # drains the exporter_stop record; releases its locks
        if self.server is not None:
            self.server.stop()
        if self.spool is not None:
            self.spool.close()
        if self._backend is not None:
            self._backend.close()
        if self._resolver is not None:
            self._resolver.close()
        if self._hooks is not None:
            self._hooks.close()


def run_exporter(app: ExporterApp) -> int:
    """Run `app` until SIGTERM/SIGINT. Returns the process exit code."""
    config = app.config
    done = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        app.start()
    except BackendUnavailable as exc:
        app.stop()
        print(f"gpu-audit: cannot start the {config.exporter.backend} backend: {exc}",
              file=sys.stderr)
        if config.exporter.backend != "sim":
            sim = command("run --backend sim --scenario busy")
            print(NO_GPU_HINT.format(command=sim), file=sys.stderr)
        return EXIT_FAILURE
    except (ListenError, LockHeld) as exc:
        app.stop()
        print(f"gpu-audit: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        app.stop()
        if exc.filename is not None:  # a file (spool, archive) in the way
            print(f"gpu-audit: cannot start: {exc.filename}: {exc.strerror or exc}",
                  file=sys.stderr)
        else:
            print(f"gpu-audit: cannot start: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except BaseException:
        app.stop()
        raise
    # Everything built at start-up lives as long as the process: moving it out of the
    # collector's view makes each cycle's garbage collections scan only cycle garbage.
    gc.freeze()
    done.wait()
    app.stop()
    return EXIT_OK
