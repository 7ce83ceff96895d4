"""Wiring of one exporter process: backend -> sampler -> (renderer, audit producer) ->
HTTP endpoint, optionally with the shipper in the same process (`gpu-audit run`).

Start-up order matters, because a failed start must leave no audit record behind:
configuration, web-config, the sinks' secrets and the audit HMAC key first (exit 2), then
the backend (a missing driver ends here with a hint, never a fallback to the simulator),
then the locks (the spool's single writer, the shipper's cursors, archive and dead-letter
directories: another live gpu-audit there is a refusal naming its pid, exit 1), then the
listening socket (a port in use, exit 1). Only then is exporter_start written and do
sampling, serving and shipping begin.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from exporter.appstatus import runtime_status, summary_line
from exporter.attribution.fakeproc import write_fake_proc
from exporter.attribution.resolver import Resolver
from exporter.backends import BackendUnavailable, create_backend
from exporter.config import parse_listen
from exporter.http import MetricsServer
from exporter.model import GpuSample
from exporter.render import RenderOptions
from exporter.sampler import Sampler, SnapshotListener
from exporter.serving import LatestState
from exporter.snapshot import Snapshot
from exporter.watch import GpuWatch, SummaryLog
from exporter.webconfig import WebConfig, load_web_config
from gpu_audit import __version__
from gpu_audit import selfmetrics as selfm
from gpu_audit.audit.metrics import AuditCollector
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.config import Config
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, LockHeld
from gpu_audit.invocation import command
from gpu_audit.spool import SpoolError, SpoolLocked, SpoolReader, SpoolWriteError, SpoolWriter

log = logging.getLogger("gpu_audit.exporter")

NO_GPU_HINT = (
    "To try gpu-audit on a machine without a GPU, run the simulator explicitly:\n"
    "  {command}\n"
    "(shipped scenarios: busy, idle, leak, hot, xid, mig, large; every GPU and process "
    'series made from simulated data carries simulated="true").'
)


class ListenError(Exception):
    """The endpoint's socket could not be bound (port in use, address not local, ...)."""

    def __init__(self, listen: str, cause: OSError) -> None:
        self.listen = listen
        self.cause = cause
        super().__init__(f"cannot listen on {listen}: {cause.strerror or cause}")


class ReopeningSpool:
    """The spool writer, opened at start-up and re-opened after failures.

    A spool another live process writes is a refusal at start-up (`open_at_start` raises
    SpoolLocked): two writers would duplicate the trail. Any other spool that cannot be
    opened (permission, read-only or full disk) must not stop the exporter: commits fail
    with SpoolWriteError, the audit producer counts the records it could not write,
    /metrics keeps serving, and every cycle tries to open the spool again.
    """

    def __init__(self, config: Config) -> None:
        self._config = config.spool
        self._writer: SpoolWriter | None = None
        self._lock = threading.Lock()
        self.last_error = ""

    def open_at_start(self) -> None:
        """Open the writer (taking the spool's lock) before anything is written.

        Raises SpoolLocked when another live process writes this spool; any other
        failure is left to the producer to count, and the spool is re-opened lazily.
        """
        # the producer logs and counts the failure at its first record
        with self._lock, contextlib.suppress(SpoolWriteError):
            self._get(refuse_locked=True)

    def _get(self, *, refuse_locked: bool = False) -> SpoolWriter:
        if self._writer is None:
            try:
                self._writer = SpoolWriter(self._config)
                if self.last_error:
                    log.info("spool %s is writable again", self._config.directory)
                self.last_error = ""
            except SpoolWriteError:
                raise
            except OSError as exc:
                self.last_error = str(exc)
                raise SpoolWriteError.from_oserror(exc, self._config.directory, "open") from None
            except SpoolError as exc:  # SpoolLocked and friends: same outcome, other reason
                if refuse_locked and isinstance(exc, SpoolLocked):
                    raise
                self.last_error = str(exc)
                raise SpoolWriteError("unavailable", self._config.directory, str(exc)) from None
        return self._writer

    @property
    def writer(self) -> SpoolWriter | None:
        return self._writer

    def commit(self, payloads: Sequence[bytes]) -> int:
        with self._lock:
            return self._get().commit(payloads)

    def last_payload(self) -> bytes | None:
        with self._lock:
            try:
                return self._get().last_payload()
            except SpoolWriteError:
                return None

    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None


class SplitModeGc:
    """Spool garbage collection when the shipper runs in another process.

    Only the writer may delete segments, and in `gpu-audit exporter` + `gpu-audit shipper`
    the exporter is the writer: after a cycle, at most every `gc_interval_s`, it deletes
    the segments every configured sink's committed cursor has passed. A sink without a
    cursor yet pins the whole spool, so nothing it has not seen is ever deleted.
    """

    def __init__(self, config: Config, spool: ReopeningSpool) -> None:
        from gpu_audit.spool import CursorStore
        from shipper.engine import gc_floor

        self._floor = gc_floor
        self._cursors = CursorStore(config.spool.directory)
        self._names = config.shipper.sink_names()
        self._interval = config.shipper.gc_interval_s
        self._spool = spool
        self._last = 0.0

    def __call__(self, _snap: Snapshot) -> None:
        now = time.monotonic()
        writer = self._spool.writer
        if writer is None or now - self._last < self._interval:
            return
        self._last = now
        writer.gc(self._floor(self._cursors, self._names))


class SimProcfs:
    """A fake /proc mirroring the simulated processes, so attribution runs for real on
    simulated data (the demo shows users, projects and jobs). Lives in a temp dir that is
    removed at exit; used only with `--backend sim` and the default procfs root."""

    def __init__(self) -> None:
        self._base = Path(tempfile.mkdtemp(prefix="gpu-audit-simproc-"))
        self.root = self._base / "proc"
        self.root.mkdir()
        # An empty user database: simulated uids must not borrow this host's user names,
        # so the owner source answers "uid:<n>" unless the scenario's environ says more.
        self.passwd = self._base / "passwd"
        self.passwd.write_text("")

    def update(self, gpus: Sequence[GpuSample]) -> None:
        write_fake_proc(self.root, (p for g in gpus for p in g.processes), prune=True)

    def remove(self) -> None:
        shutil.rmtree(self._base, ignore_errors=True)


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
    ListenError or OSError, and when it does no audit record has been written."""

    def __init__(self, config: Config, *, with_shipper: bool) -> None:
        self.config = config
        self.with_shipper = with_shipper and config.shipper.enabled
        self.server: MetricsServer | None = None
        self.sampler: Sampler | None = None
        self.producer: AuditProducer | None = None
        self.spool: ReopeningSpool | None = None
        self.shipper: Any = None
        self._simproc: SimProcfs | None = None
        self._resolver: Resolver | None = None
        self._backend: Any = None

    def start(self) -> None:
        cfg = self.config
        ex = cfg.exporter
        # 1. everything a configuration error can stop (exit 2): nothing is opened yet
        host, port = parse_listen(ex.listen)
        web = load_web_config(ex.web_config_file) if ex.web_config_file else WebConfig()
        sinks = None
        if self.with_shipper:
            from shipper.sinks.registry import create_sink

            # resolves every secret now; a sink only connects when it is started
            sinks = [create_sink(c, spool_dir=Path(cfg.spool.directory))
                     for c in cfg.shipper.sinks]

        # 2. the backend (exit 1 with a hint when there is no GPU)
        backend = create_backend(ex)
        info = backend.open()
        self._backend = backend
        if info.simulated:
            log.warning("SIMULATED DATA: backend 'sim' (%s); every GPU and process "
                        'series carries simulated="true", every audit record '
                        '"simulated": true', info.detail)

        attribution = cfg.attribution
        before = None
        if info.simulated and attribution.procfs_root == Path("/proc"):
            self._simproc = SimProcfs()
            attribution = attribution.model_copy(update={
                "procfs_root": self._simproc.root,
                "passwd_file": attribution.passwd_file or self._simproc.passwd,
            })
            before = self._simproc.update
        resolver = Resolver(attribution)
        self._resolver = resolver

        stale = ex.stale_after_seconds or max(3 * ex.interval_seconds, 2.0)
        state = LatestState(stale)
        registry = CollectorRegistry(auto_describe=True)

        # 3. the locks: the spool's single writer, then the shipper's directories
        listeners: list[SnapshotListener] = []
        if cfg.audit.enabled or self.with_shipper:
            self.spool = ReopeningSpool(cfg)
            self.spool.open_at_start()
            reader = SpoolReader(cfg.spool.directory) if cfg.spool.directory.is_dir() else None
            self.producer = AuditProducer(cfg.audit, self.spool, host=cfg.host,
                                          exporter_version=__version__,
                                          simulated=info.simulated, reader=reader)
            listeners.append(self.producer.on_snapshot)
            registry.register(AuditCollector(self.producer))
            if not self.with_shipper and cfg.shipper.enabled:
                listeners.append(SplitModeGc(cfg, self.spool))
        # After the producer: state changes and the periodic summary are logged once the
        # cycle's records are written (the summary counts them).
        listeners.append(GpuWatch())
        listeners.append(SummaryLog(ex.log_summary_interval_seconds,
                                    lambda: summary_line(self.runtime_status())))
        if self.with_shipper:
            from shipper.engine import Shipper

            writer = self.spool.writer if self.spool else None
            self.shipper = Shipper(cfg.shipper, cfg.spool, writer=writer, sinks=sinks)
            registry.register(self.shipper.collector())

        # 4. the listening socket
        try:
            self.server = MetricsServer(host, port, state, web, registry, limits=ex.http,
                                        extra_status=self.runtime_status)
        except OSError as exc:
            raise ListenError(ex.listen, exc) from exc

        # Nothing can refuse the start any more: the first record may be written.
        if self.producer is not None:
            self.producer.start()
        scenario_clock = getattr(backend, "scenario_time", None) if info.simulated else None
        self.sampler = Sampler(
            backend, info, resolver,
            host=cfg.host,
            interval_seconds=ex.interval_seconds,
            slow_interval_seconds=ex.slow_interval_seconds,
            render_options=RenderOptions(
                dcgm_compat=ex.compat.dcgm_exporter,
                dcgm_exact=ex.compat.dcgm_exact,
                pid_label=ex.process_pid_label,
                max_process_series_per_gpu=ex.max_process_series_per_gpu,
            ),
            listeners=listeners,
            publish=state.publish,
            scenario_clock=scenario_clock,
            before_attribution=before,
        )
        registry.register(SamplerCollector(self.sampler, resolver))
        self.server.start()
        state.set_backend(True)
        log.info("serving %s://%s:%d/metrics (backend %s)",
                 "https" if self.server.tls else "http", host, self.server.port, info.name)
        self.sampler.start()
        if self.shipper is not None:
            self.shipper.start()

    def runtime_status(self) -> dict[str, Any]:
        """The sampler, audit, spool and shipper sections of /status and the summary."""
        spool = self.spool
        return runtime_status(
            sampler=self.sampler, producer=self.producer,
            spool_dir=self.config.spool.directory if spool is not None else None,
            writer=spool.writer if spool is not None else None,
            shipper=self.shipper, spool_error=spool.last_error if spool is not None else "")

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self.producer is not None:
            self.producer.stop()
        if self.shipper is not None:
            if self.shipper.started:
                self.shipper.drain()  # the exporter_stop record included
            self.shipper.stop()  # releases its locks even when it never started
        if self.server is not None:
            self.server.stop()
        if self.spool is not None:
            self.spool.close()
        if self._backend is not None:
            self._backend.close()
        if self._resolver is not None:
            self._resolver.close()
        if self._simproc is not None:
            self._simproc.remove()


def run_exporter(config: Config, *, with_shipper: bool) -> int:
    """Run until SIGTERM/SIGINT. Returns the process exit code."""
    app = ExporterApp(config, with_shipper=with_shipper)
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
