"""`gpu-audit run` on the simulator with the README's demo settings (time_scale 60,
interval 1 s): the story runs 60 times faster, the records do not. Each is dated on the
wall clock the run used and covers the wall time since the previous one, the energy
counter integrates the power draw over that wall time, and exporter_stop is the last
record (records were dated hours ahead, 60 scenario seconds were
capped to 3 per cycle, the counter ran 60 times ahead of the integrated power, and
exporter_stop was dated before the records it followed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from tests.polling import wait_for

pytestmark = pytest.mark.timeout(90)


def _records(archive: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for f in sorted(archive.glob("*.jsonl"))
            for line in f.read_bytes().splitlines() if line.strip()]


def test_demo_settings_date_records_on_the_wall_clock_and_bill_wall_time(
        tmp_path: Path) -> None:
    """Over ~5 s of wall time at time_scale 60: every record's time is within the run's
    wall-clock window, each GPU's gpu_seconds add up to the wall time sampled (not 3 x
    it, nor 60 x), its counter energy is its power x gpu_seconds within 5 %, and
    exporter_stop is dated after every other record."""
    cfg = tmp_path / "gpu-audit.yaml"
    cfg.write_text(
        "exporter: {backend: sim, scenario: busy, time_scale: 60, interval_seconds: 1}\n"
        "audit: {interval_seconds: 1}\n"
        f"spool: {{directory: {tmp_path / 'spool'}, min_free_bytes: 0}}\n"
        "shipper: {batch_max_wait_s: 0.1, sinks: [{type: archive, directory: "
        f"{tmp_path / 'archive'}}}]}}\n")
    log = tmp_path / "run.log"
    before = time.time()
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "run", "--config", str(cfg), "--listen",
             "127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=err,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        archive = tmp_path / "archive"
        wait_for(lambda: sum(1 for r in (_records(archive) if archive.exists() else [])
                             if r.get("kind") == "gpu") >= 4 * 6, timeout=40,
                 what="six cycles of gpu records in the archive")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]
    after = time.time()
    records = _records(tmp_path / "archive")
    times = [int(r["time_ns"]) / 1e9 for r in records]  # type: ignore[call-overload]
    assert before - 1 <= min(times) and max(times) <= after + 1, (before, after, max(times))
    assert records[-1]["event"] == "exporter_stop"
    assert times[-1] == max(times)

    gpus = [r for r in records if r.get("kind") == "gpu"]
    seconds: dict[str, float] = defaultdict(float)
    energy: dict[str, float] = defaultdict(float)
    power: dict[str, float] = defaultdict(float)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for r in gpus:
        uuid = r["gpu"]["uuid"]  # type: ignore[index]
        t = int(r["time_ns"]) / 1e9  # type: ignore[call-overload]
        first.setdefault(uuid, t)
        last[uuid] = t
        s = float(r["gpu_seconds"])  # type: ignore[arg-type]
        seconds[uuid] += s
        energy[uuid] += float(r.get("energy_joules", 0.0))  # type: ignore[arg-type]
        power[uuid] += float(r["values"]["power_usage_watts"]) * s  # type: ignore[index]
    assert len(seconds) == 4
    for uuid, s in seconds.items():
        # the wall time from the first record to the last, plus the first one's interval
        assert last[uuid] - first[uuid] - 0.05 <= s <= last[uuid] - first[uuid] + 1.5, uuid
        assert energy[uuid] == pytest.approx(power[uuid], rel=0.05), uuid
