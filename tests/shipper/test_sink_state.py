"""A sink's up/down state as the metrics and the log show it: a sink that is down when the
shipper starts looks exactly as unhealthy as one that goes down later, and each state
change is logged once each way, never once per retry."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.engine import Shipper
from shipper.sinks.base import Outcome, SinkError
from tests.polling import wait_for
from tests.shipper.conftest import produce
from tests.shipper.memsinks import MemorySink

# record(seq) carries time_ns = 1_700_000_000 s + seq ms; a fixed clock makes lag exact
NOW = 1_700_000_100.0


class StartFailingSink(MemorySink):
    """A sink whose backend cannot even be reached when it is started (the InfluxDB
    sink's database check, the search sinks' template PUT, ...)."""

    def __init__(self, name: str, *, start_error: SinkError | None) -> None:
        super().__init__(name)
        self.start_error = start_error
        self.start_attempts = 0

    def start(self) -> None:
        with self.lock:
            self.start_attempts += 1
            error = self.start_error
        if error is not None:
            raise error
        super().start()


@contextmanager
def running(cfg: ShipperConfig, spool: SpoolConfig, writer: SpoolWriter,
            sinks: list[Any]) -> Iterator[Shipper]:
    shipper = Shipper(cfg, spool, writer=writer, sinks=sinks, clock=lambda: NOW)
    shipper.start()
    try:
        yield shipper
    finally:
        shipper.stop(5)


def value(shipper: Shipper, name: str, labels: dict[str, str]) -> float | None:
    reg = CollectorRegistry()
    reg.register(shipper.collector())
    return reg.get_sample_value(name, labels)


def test_sink_down_at_start_shows_the_real_lag_and_a_down_state(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """With a backlog and a sink that cannot be started, lag_seconds is the age of the
    oldest undelivered record (not 0), lag_records the backlog, sink_up 0 and retried
    grows with every failed attempt; once the sink comes back everything is delivered,
    sink_up is 1 and the lag 0."""
    produce(writer, 0, 1631)
    sink = StartFailingSink("influx", start_error=SinkError(Outcome.RETRY, "connection refused"))
    labels = {"sink": "influx"}
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: sink.start_attempts >= 3, what="three start attempts")
        assert value(shipper, "gpu_audit_shipper_cursor_lag_seconds", labels) == pytest.approx(
            100.0)
        assert value(shipper, "gpu_audit_shipper_cursor_lag_records", labels) == 1631
        assert value(shipper, "gpu_audit_shipper_sink_up", labels) == 0
        wait_for(lambda: (value(shipper, "gpu_audit_shipper_records_retried_total",
                                  labels) or 0) > 0, what="retries counted")
        assert shipper.stats()["sinks"]["influx"]["state"] == "down"
        with sink.lock:
            sink.start_error = None
        wait_for(lambda: sink.count() == 1631, what="backlog delivered")
        wait_for(lambda: value(shipper, "gpu_audit_shipper_cursor_lag_seconds", labels) == 0,
                   what="lag back to 0")
        assert value(shipper, "gpu_audit_shipper_sink_up", labels) == 1
        assert shipper.stats()["sinks"]["influx"]["state"] == "up"


def test_sink_held_at_start_raises_the_blocked_alert_with_the_real_lag(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """An auth failure at start (HOLD) sets sink_blocked{reason} 1 and the lag is the age
    of the oldest record the sink has not got."""
    produce(writer, 0, 10)
    sink = StartFailingSink("es", start_error=SinkError(Outcome.HOLD, "401 unauthorized"))
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: sink.start_attempts >= 2, what="two start attempts")
        blocked = {"sink": "es", "reason": "401 unauthorized"}
        assert value(shipper, "gpu_audit_shipper_sink_blocked", blocked) == 1
        assert value(shipper, "gpu_audit_shipper_cursor_lag_seconds",
                     {"sink": "es"}) == pytest.approx(100.0)
        assert value(shipper, "gpu_audit_shipper_sink_up", {"sink": "es"}) == 0


def test_lag_follows_the_oldest_undelivered_record_while_the_sink_is_down(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter
) -> None:
    """After some records were delivered and the sink went down, lag_seconds is the age
    of the first record it has not got (record 500), not of anything else."""
    produce(writer, 0, 500)
    sink = MemorySink("a")
    labels = {"sink": "a"}
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: sink.count() == 500, what="first 500 delivered")
        with sink.lock:
            sink.down = True
        produce(writer, 500, 300)
        wait_for(lambda: len(sink.sends) > 8, what="retries")
        # record 500 is 1_700_000_000.5 s; the clock says 1_700_000_100
        assert value(shipper, "gpu_audit_shipper_cursor_lag_seconds", labels) == pytest.approx(
            99.5)
        assert value(shipper, "gpu_audit_shipper_sink_up", labels) == 0
        with sink.lock:
            sink.down = False
        wait_for(lambda: sink.count() == 800, what="all delivered")


def _state_lines(caplog: pytest.LogCaptureFixture, sink: str) -> tuple[list[str], list[str]]:
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("shipper")]
    down = [m for m in lines if m.startswith(f"sink {sink}: down")]
    up = [m for m in lines if m.startswith(f"sink {sink}: up again")]
    return down, up


def test_each_state_change_is_logged_once_each_way(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Down at start, back, down mid-stream, back: exactly one 'down' line (with the
    reason) per outage and one 'up again' line (how long it was down, how far behind) per
    recovery, however many retries happened in between."""
    caplog.set_level(logging.DEBUG, logger="shipper")
    produce(writer, 0, 200)
    sink = StartFailingSink("influx", start_error=SinkError(Outcome.RETRY, "connection refused"))
    with running(fast_config, spool_config, writer, [sink]):
        wait_for(lambda: sink.start_attempts >= 5, what="five failed starts")
        down, up = _state_lines(caplog, "influx")
        assert len(down) == 1 and "connection refused" in down[0]
        assert up == []
        with sink.lock:
            sink.start_error = None
        wait_for(lambda: sink.count() == 200, what="delivered")
        down, up = _state_lines(caplog, "influx")
        assert len(down) == 1 and len(up) == 1
        assert "200 records" in up[0] and "down for" in up[0]

        with sink.lock:
            sink.down = True
        produce(writer, 200, 50)
        wait_for(lambda: len(sink.sends) > 10, what="retries mid-stream")
        with sink.lock:
            sink.down = False
        wait_for(lambda: sink.count() == 250, what="delivered again")
    down, up = _state_lines(caplog, "influx")
    assert len(down) == 2 and len(up) == 2, (down, up)
    assert "50 records" in up[1]


class CrashingStartSink(MemorySink):
    """A sink whose start raises something that is not a SinkError (a bug, an OSError)."""

    def start(self) -> None:
        raise OSError(5, "Input/output error")


def test_an_unexpected_start_error_is_a_retry_not_a_dead_worker(
    fast_config: ShipperConfig, spool_config: SpoolConfig, writer: SpoolWriter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A start that raises OSError keeps the worker alive and retrying: the sink is down
    with the error in its reason, its records are counted as retried, nothing is lost."""
    produce(writer, 0, 5)
    sink = CrashingStartSink("odd")
    with running(fast_config, spool_config, writer, [sink]) as shipper:
        wait_for(lambda: (value(shipper, "gpu_audit_shipper_records_retried_total",
                                  {"sink": "odd"}) or 0) >= 10, what="retries")
        assert shipper.stats()["sinks"]["odd"]["state"] == "down"
        assert value(shipper, "gpu_audit_shipper_cursor_lag_records", {"sink": "odd"}) == 5
    down, _ = _state_lines(caplog, "odd")
    assert len(down) == 1 and "start failed: OSError" in down[0]
