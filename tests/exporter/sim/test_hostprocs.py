"""The simulator tied to this host: a real process holding a simulated GPU's device file
open is a process on that GPU (attributed from the real /proc), and live events written
to a file take a GPU down, report an XID and bring it back."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.sim.backend import SimBackend
from exporter.sim.scenario import parse_scenario
from gpu_audit.errors import ConfigError
from tests.exporter.sim.conftest import FakeClock

HOLD = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
print("open", flush=True)
time.sleep(60)
"""


def _scenario(devices: list[Path], events: Path | None = None, extra: str = "") -> str:
    lines = [f"    - {d}" for d in devices]
    ev = f"  events_file: {events}\n" if events else ""
    return (f"name: host\ngpus:\n  - count: {len(devices)}\n    model: NVIDIA A100\n"
            f"host:\n  devices:\n" + "\n".join(lines) + "\n  memory: 2GiB\n  util: 0.5\n"
            + ev + extra)


@pytest.fixture
def devices(tmp_path: Path) -> list[Path]:
    out = []
    for i in range(2):
        dev = tmp_path / f"nvidia{i}"
        dev.write_bytes(b"")
        out.append(dev)
    return out


@pytest.fixture
def holder(devices: list[Path]) -> Iterator[subprocess.Popen[str]]:
    """A real process holding GPU 1's device open, declaring its own load."""
    env = {**os.environ, "GPU_AUDIT_SIM_UTIL": "0.25", "GPU_AUDIT_SIM_MEMORY": "3GiB",
           "JOB_ID": "train-host-9", "PROJECT_NAME": "vision"}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(devices[1])], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    yield proc
    proc.kill()
    proc.wait(10)


def _open(text: str) -> SimBackend:
    backend = SimBackend(parse_scenario(text, "test.yaml"), clock=FakeClock())
    backend.open()
    return backend


def test_a_process_holding_a_device_file_runs_on_that_gpu(
    devices: list[Path], holder: subprocess.Popen[str]
) -> None:
    """The holder is reported on GPU 1 only, with the memory and utilisation its own
    environment declares, and the GPU's totals include it; it is gone once it exits."""
    backend = _open(_scenario(devices))
    assert backend.uses_host_processes
    gpus = backend.sample(0, False)
    assert gpus[0].processes == ()
    (p,) = gpus[1].processes
    assert p.pid == holder.pid
    assert (p.used_memory_bytes, p.sm_util_ratio) == (3 * 1024**3, 0.25)
    assert gpus[1].values["memory_used"] == {(): 3 * 1024**3}
    assert gpus[1].values["utilization_gpu"] == {(): 0.25}
    holder.kill()
    holder.wait(10)
    assert backend.sample(0, False)[1].processes == ()


def test_host_processes_are_attributed_from_the_real_proc(
    devices: list[Path], holder: subprocess.Popen[str]
) -> None:
    """With the host's /proc (not a fake one), the resolver reads the holder's own
    environment: its job and project come from environ."""
    backend = _open(_scenario(devices))
    gpus = backend.sample(0, False)
    resolver = Resolver(AttributionConfig(sources=("environ", "owner")))
    try:
        a = resolver.attribute(gpus)[gpus[1].info.uuid][0].attribution
    finally:
        resolver.close()
    assert (a.job, a.project) == ("train-host-9", "vision")
    assert a.sources["job"] == "environ"


def test_live_events_take_a_gpu_down_report_an_xid_and_recover(
    tmp_path: Path, devices: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Each complete line is applied once when read; a half-written line waits for its
    newline; a bad line is reported with its line number and skipped."""
    events = tmp_path / "events.jsonl"
    clock = FakeClock()
    backend = SimBackend(parse_scenario(_scenario(devices, events), "t.yaml"), clock=clock)
    backend.open()
    assert all(g.up for g in backend.sample(0, False))
    events.write_text('{"gpu": 0, "kind": "xid", "xid": 79}\n{"gpu": 0, "kind": "lo')
    clock.advance(1)
    g0 = backend.sample(0, False)[0]
    assert g0.up and [x.xid for x in g0.new_xids] == [79] and g0.xid_totals == {79: 1}
    with events.open("a") as fh:
        fh.write('st"}\n{"gpu": 9, "kind": "lost"}\nnot json\n')
    clock.advance(1)
    with caplog.at_level(logging.WARNING, logger="gpu_audit.sim"):
        g0, g1 = backend.sample(0, False)
    assert not g0.up and g0.error == "gpu_lost" and g0.xid_totals == {79: 1}
    assert g1.up and g0.new_xids == ()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "GPU 9" in messages and "line 4: not JSON" in messages
    clock.advance(1)
    assert not backend.sample(0, False)[0].up  # lost stays lost
    with events.open("a") as fh:
        fh.write('{"gpu": 0, "kind": "recovered"}\n')
    clock.advance(1)
    assert backend.sample(0, False)[0].up


@pytest.mark.parametrize(("extra", "gpus", "message"), [
    ("processes:\n  - {name: p, pid: 5, gpu: 0, memory: 1GiB}\n", 2, "cannot also declare"),
    ("", 3, "2 device path(s) for 3 GPU(s)"),
])
def test_bad_host_sections_are_reported(
    devices: list[Path], extra: str, gpus: int, message: str
) -> None:
    """A host scenario must name one device per GPU and declare no simulated processes."""
    text = _scenario(devices, extra=extra).replace(f"count: {len(devices)}", f"count: {gpus}")
    with pytest.raises(ConfigError) as err:
        parse_scenario(text, "bad.yaml")
    assert message in str(err.value)

