"""The main job end to end: `gpu-audit run` (exporter + shipper in one process) and the
split deployment (`gpu-audit exporter` + `gpu-audit shipper`) deliver every audit record
to the archive, and the archived trail verifies."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from gpu_audit.spool import CursorStore, spool_stats
from gpu_audit_app.cli import main
from tests.netutil import bound_port, http_get
from tests.polling import wait_for


def _config(tmp: Path, segment_bytes: int = 64 * 1024 * 1024) -> Path:
    cfg = tmp / "gpu-audit.yaml"
    cfg.write_text(
        "exporter:\n  backend: sim\n  scenario: busy\n  time_scale: 60\n"
        "  interval_seconds: 0.2\n"
        # the per-cycle trail: a record set every cycle, which the volumes below count on
        "audit:\n  interval_seconds: 0.2\n"
        f"spool:\n  directory: {tmp / 'spool'}\n  segment_bytes: {segment_bytes}\n"
        "  min_free_bytes: 0\n"
        "shipper:\n  batch_max_wait_s: 0.1\n  gc_interval_s: 0.5\n"
        f"  sinks:\n    - type: archive\n      directory: {tmp / 'archive'}\n"
    )
    return cfg


def _start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "gpu_audit_app", *args],
                                stdout=subprocess.DEVNULL, stderr=err,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log.read_text(errors="replace")[-3000:]


def _metric(body: bytes, name: str) -> float:
    """The sum of a family's samples in an exposition (0 when absent)."""
    return sum(s.value for f in text_string_to_metric_families(body.decode())
               for s in f.samples if s.name == name)


def _delivered_all(spool: Path) -> bool:
    """Every sink's committed cursor has reached the end of the spool."""
    cursors = CursorStore(spool)
    end = spool_stats(spool)["next_offset"]
    names = cursors.names()
    return bool(names) and all(cursors.get(n) >= end for n in names)


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
    log = tmp_path / "run.log"
    proc = _start(log, "run", "--config", str(_config(tmp_path)), "--listen", "127.0.0.1:0")
    port = bound_port(log, proc)
    url = f"http://127.0.0.1:{port}/metrics"

    def delivered_plenty() -> bool:
        status, body = http_get(url)
        return (status == 200 and _metric(body, "gpu_audit_records_written_total") > 50
                and _metric(body, "gpu_audit_shipper_records_delivered_total") > 0)

    wait_for(delivered_plenty, 60, "more than 50 records written and some delivered")
    _stop(proc, log)
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
    exporter_log, shipper_log = tmp_path / "exporter.log", tmp_path / "shipper.log"
    exporter = _start(exporter_log, "exporter", "--config", str(cfg), "--listen", "127.0.0.1:0")
    port = bound_port(exporter_log, exporter)
    wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 30, "readyz")
    shipper = _start(shipper_log, "shipper", "--config", str(cfg))
    try:
        wait_for(lambda: spool_stats(tmp_path / "spool")["first_offset"] > 0, 40,
                 "a shipped segment deleted by the exporter")
    finally:
        _stop(exporter, exporter_log)
        try:  # the shipper delivers the exporter's last records before it is stopped
            wait_for(lambda: _delivered_all(tmp_path / "spool"), 60,
                     "the shipper's cursor at the end of the spool")
        finally:
            _stop(shipper, shipper_log)
    records = _archived(tmp_path / "archive")
    assert len(records) == spool_stats(tmp_path / "spool")["next_offset"]
    assert len({r["id"] for r in records}) == len(records)
    assert main(["audit", "verify", str(tmp_path / "archive")]) == 0
