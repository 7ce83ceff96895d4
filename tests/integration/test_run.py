"""The main job end to end: `gpu-audit run` (exporter + shipper in one process) and the
split deployment (`gpu-audit exporter` + `gpu-audit shipper`) deliver every audit record
to the archive, and the archived trail verifies."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from gpu_audit.spool import spool_stats
from gpu_audit_app.cli import main
from tests.netutil import free_port, http_get, wait_for


def _config(tmp: Path, segment_bytes: int = 64 * 1024 * 1024) -> Path:
    cfg = tmp / "gpu-audit.yaml"
    cfg.write_text(
        "exporter:\n  backend: sim\n  scenario: busy\n  time_scale: 60\n"
        "  interval_seconds: 0.2\n"
        f"spool:\n  directory: {tmp / 'spool'}\n  segment_bytes: {segment_bytes}\n"
        "  min_free_bytes: 0\n"
        "shipper:\n  batch_max_wait_s: 0.1\n  gc_interval_s: 0.5\n"
        f"  sinks:\n    - type: archive\n      directory: {tmp / 'archive'}\n"
    )
    return cfg


def _start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpu_audit_app", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.stderr.read().decode() if proc.stderr else ""


def _archived(archive: Path) -> list[dict[str, object]]:
    out = []
    for f in sorted(archive.iterdir()):
        if f.name.endswith(".jsonl"):
            data = f.read_bytes()
        elif f.name.endswith(".jsonl.gz"):
            data = gzip.decompress(f.read_bytes())
        else:
            continue
        out += [orjson.loads(line) for line in data.splitlines() if line.strip()]
    return out


def test_run_delivers_every_record_to_the_archive_and_the_trail_verifies(tmp_path: Path) -> None:
    """After SIGTERM, the archive holds exactly the records the spool received, from
    exporter_start to exporter_stop, and `audit verify` on the archive passes."""
    port = free_port()
    proc = _start("run", "--config", str(_config(tmp_path)), "--listen", f"127.0.0.1:{port}")
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "readyz")
    time.sleep(3)
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    assert b"gpu_audit_shipper_records_delivered_total" in body
    _stop(proc)
    records = _archived(tmp_path / "archive")
    produced = spool_stats(tmp_path / "spool")["next_offset"]
    assert len(records) == produced > 50
    assert len({r["id"] for r in records}) == len(records)
    events = [r.get("event") for r in records]
    assert events[0] == "exporter_start" and events[-1] == "exporter_stop"
    assert main(["audit", "verify", str(tmp_path / "archive")]) == 0


def test_split_exporter_and_shipper_deliver_everything_and_collect_segments(
    tmp_path: Path,
) -> None:
    """With the shipper in its own process, everything still arrives exactly once, and
    the exporter (the spool's writer) deletes segments the shipper has passed."""
    cfg = _config(tmp_path, segment_bytes=64 * 1024)
    port = free_port()
    exporter = _start("exporter", "--config", str(cfg), "--listen", f"127.0.0.1:{port}")
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "readyz")
    shipper = _start("shipper", "--config", str(cfg))
    try:
        wait_for(lambda: spool_stats(tmp_path / "spool")["first_offset"] > 0, 40,
                 "a shipped segment deleted by the exporter")
    finally:
        _stop(exporter)
        time.sleep(1.5)  # let the shipper drain the exporter's last records
        _stop(shipper)
    records = _archived(tmp_path / "archive")
    assert len(records) == spool_stats(tmp_path / "spool")["next_offset"]
    assert len({r["id"] for r in records}) == len(records)
    assert main(["audit", "verify", str(tmp_path / "archive")]) == 0
