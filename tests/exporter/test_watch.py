"""A process you can watch: each change of state is logged once (and its recovery), a
summary line comes every interval, and a failing cycle does not repeat its traceback."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import pytest

from exporter.exposition.render import RenderOptions
from exporter.sampler import Sampler
from exporter.sim.backend import SimBackend
from exporter.sim.scenario import load_scenario
from exporter.watch import GpuWatch, SummaryLog
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample
from gpu_audit.model.snapshot import Snapshot
from tests.exporter.helpers import NoAttribution
from tests.exporter.sim.conftest import FakeClock


def watch_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpu_audit.watch"]


def test_xid_scenario_logs_each_xid_and_the_lost_gpu_exactly_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Playing the `xid` scenario for 40 minutes, one cycle every 10 s: one WARNING per
    XID event (13, 31, 13, 48, 79) naming its GPU, one WARNING when GPU 1 is lost, and
    nothing else although GPU 1 stays lost for 60 more cycles."""
    clock = FakeClock(1_700_000_000.0)
    backend = SimBackend(load_scenario("xid"), clock=clock)
    info = backend.open()
    sampler = Sampler(backend, info, NoAttribution(), host="h", interval_seconds=10,
                      slow_interval_seconds=60, render_options=RenderOptions(),
                      scenario_clock=backend.scenario_time, listeners=[GpuWatch()])
    with caplog.at_level(logging.INFO, logger="gpu_audit.watch"):
        for _ in range(241):
            sampler.run_cycle()
            clock.advance(10)
    lines = watch_lines(caplog)
    uuid1 = next(g.uuid for g in sampler.latest().snapshot.gpus  # type: ignore[union-attr]
                 if g.info.index == 1)
    xids = [line for line in lines if ": XID " in line]
    assert [line.split("XID ")[1] for line in xids] == ["13", "31", "13", "48", "79"]
    assert [line.split(" (")[0] for line in xids] == ["GPU 1", "GPU 3", "GPU 1", "GPU 2",
                                                      "GPU 1"]
    lost = [line for line in lines if "not answering" in line]
    assert lost == [f"GPU 1 ({uuid1}) is not answering: gpu_lost; its series report gpu_up 0 "
                    "and the other GPUs carry on"]
    assert len(lines) == 6


class FlakyBackend:
    """One GPU whose `up` follows a script, one entry per cycle."""

    name = "flaky"

    def __init__(self, script: Sequence[str | None]) -> None:
        self.script = list(script)

    def open(self) -> BackendInfo:
        return BackendInfo(name="flaky")

    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        error = self.script.pop(0)
        if error == "raise":
            raise RuntimeError("driver hiccup")
        return (GpuSample(GpuInfo(uuid="GPU-a", index=0), up=error is None, error=error),)

    def error_counts(self) -> Mapping[str, int]:
        return {}

    def close(self) -> None:
        pass


def test_a_gpu_lost_and_back_logs_one_line_each_way(caplog: pytest.LogCaptureFixture) -> None:
    """down (timeout) for three cycles, then up: one WARNING, one INFO; a GPU already down
    at the first cycle is reported too; a change of error kind is a new line."""
    script = [None, "timeout", "timeout", "timeout", None, None, "gpu_lost", "gpu_lost",
              "timeout"]
    backend = FlakyBackend(script)
    sampler = Sampler(backend, backend.open(), NoAttribution(), host="h", interval_seconds=5,
                      slow_interval_seconds=60, render_options=RenderOptions(),
                      listeners=[GpuWatch()])
    with caplog.at_level(logging.INFO, logger="gpu_audit.watch"):
        for _ in script:
            sampler.run_cycle()
    records = [(r.levelname, r.getMessage()) for r in caplog.records
               if r.name == "gpu_audit.watch"]
    assert [(level, msg.split(":")[0].split(" is ")[1] if " is " in msg else msg)
            for level, msg in records] == [
        ("WARNING", "not answering"), ("INFO", "answering again (it was down"),
        ("WARNING", "not answering"), ("WARNING", "not answering")]
    assert "timeout (was gpu_lost)" in records[-1][1]


def test_summary_line_every_interval_and_never_when_off(
        caplog: pytest.LogCaptureFixture) -> None:
    """With a 300 s interval the summary is logged at 300 s and 600 s of (fake) time, not
    in between; with 0 it is never logged."""
    now = [0.0]
    on = SummaryLog(300, lambda: "running: fine", clock=lambda: now[0])
    off = SummaryLog(0, lambda: "never", clock=lambda: now[0])
    snap = Snapshot(timestamp=0.0, host="h", backend=BackendInfo(name="x"), gpus=())
    with caplog.at_level(logging.INFO, logger="gpu_audit.watch"):
        for t in range(0, 700, 5):
            now[0] = float(t)
            on(snap)
            off(snap)
    assert watch_lines(caplog) == ["running: fine", "running: fine"]


def test_a_failing_cycle_logs_its_traceback_once_then_its_recovery(
        caplog: pytest.LogCaptureFixture) -> None:
    """Three failed cycles in a row give one ERROR with the traceback (the rest at
    debug), and the next good cycle one INFO saying sampling works again."""
    backend = FlakyBackend([None, "raise", "raise", "raise"] + [None] * 1000)
    sampler = Sampler(backend, backend.open(), NoAttribution(), host="h",
                      interval_seconds=0.01, slow_interval_seconds=1,
                      render_options=RenderOptions())
    with caplog.at_level(logging.INFO, logger="gpu_audit.sampler"):
        sampler.start()
        try:
            end = time.monotonic() + 10
            while sampler.stats.cycles < 10 and time.monotonic() < end:
                time.sleep(0.01)
        finally:
            sampler.stop()
    records = [r for r in caplog.records if r.name == "gpu_audit.sampler"]
    assert [r.levelname for r in records] == ["ERROR", "INFO"]
    assert records[0].exc_info is not None
    assert records[1].getMessage() == "sampling works again after 3 failed cycles"
