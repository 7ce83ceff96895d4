"""The soak: the shipped `gpu-audit run` on the `large` scenario (8 GPUs x 64 processes),
SIGKILLed again and again, with the real influxd stopped for a while and the spool's
filesystem filled once, ends with every sink holding exactly the records produced.

Faults, all in one run of the real CLI against the real influxd 1.x and VictoriaMetrics:
- SIGKILL at random moments (seeded), at least 20 times;
- SIGKILL at archive boundaries chosen on purpose: a part being opened (rotation) and
  each step of a compression (.gz.tmp opened, renamed into place, plain part unlinked);
- influxd stopped while the exporter keeps producing, until the spool's small real
  filesystem (a tmpfs) is full and records are refused; then influxd comes back and, in
  the same process life, the spool drains and accepts records again (no restart);
- a final SIGTERM, which drains and exits 0.
Afterwards: the archive holds exactly the spool's records, once each, in order (the hash
chain verifies), and influxd and VictoriaMetrics hold one point per record; `audit
verify` passes on the archive and on influxd read back.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpu_audit.archive import read_records
from gpu_audit.spool import CursorStore, spool_stats
from gpu_audit_app.cli import main
from tests.netutil import free_port, http_get
from tests.polling import wait_for
from tests.realservers import Influxd, VictoriaMetrics, influxd_server, victoria_metrics_server
from tests.smallfs import small_filesystem

ROOT = Path(__file__).resolve().parents[2]
SINKS = ("archive", "influx", "vm")
RANDOM_KILLS = 20
# (label, n): SIGKILL before the nth such archive call of that process life
BOUNDARY_KILLS = [("open:part", 2), ("open:gz", 1), ("replace:gz", 1), ("unlink:part", 1),
                  ("open:part", 3), ("replace:gz", 2)]
SPOOL_DISK = 6 * 1024 * 1024


def _config(tmp: Path, spool: Path, port: int, influx: str, vm: str) -> Path:
    cfg = {
        "log_level": "info",
        "exporter": {"backend": "sim", "scenario": "large", "interval_seconds": 1.0,
                     "listen": f"127.0.0.1:{port}"},
        # the per-cycle trail: its volume is what fills the spool's filesystem here
        "audit": {"interval_seconds": 1.0},
        "spool": {"directory": str(spool), "segment_bytes": 256 * 1024,
                  "min_free_bytes": 0, "when_full": "refuse"},
        "shipper": {
            "batch_max_records": 1000,
            "batch_max_wait_s": 0.1,
            "poll_interval_s": 0.05,
            "backoff_base_s": 0.05,
            "backoff_cap_s": 0.5,
            "commit_interval_s": 0.5,  # a wide window for kills between send and commit
            "gc_interval_s": 0.5,
            "shutdown_grace_s": 60,
            "sinks": [
                {"type": "archive", "name": "archive", "directory": str(tmp / "archive"),
                 "max_file_bytes": 256 * 1024},
                {"type": "influxdb_v1", "name": "influx", "url": influx,
                 "database": "gpu_audit", "timeout_s": 5},
                {"type": "influxdb_v2", "name": "vm", "url": vm, "bucket": "gpu_audit",
                 "flavour": "victoriametrics", "timeout_s": 5},
            ],
        },
    }
    path = tmp / "gpu-audit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class _Runs:
    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config = config
        self.port = port
        self.log = log

    def start(self, *boundary: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.integration.soak_runner", str(self.config),
                 *boundary], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def metric(self, name: str) -> float | None:
        status, body = http_get(f"http://127.0.0.1:{self.port}/metrics")
        if status != 200:
            return None
        total = None
        for m in re.finditer(rb"^" + name.encode() + rb"(?:\{[^}]*\})? (\S+)$", body, re.M):
            total = (total or 0.0) + float(m.group(1))
        return total

    def ready(self, proc: subprocess.Popen[bytes]) -> bool:
        if proc.poll() is not None:
            return True  # died (a boundary kill during start-up recovery): also an end
        return http_get(f"http://127.0.0.1:{self.port}/readyz")[0] == 200


def _rfc3339(time_ns: int) -> str:
    return dt.datetime.fromtimestamp(time_ns / 1e9, tz=dt.UTC).isoformat()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def _fill_and_recover(runs: _Runs, influx: Influxd, spool: Path) -> None:
    """influxd down until the spool's filesystem is full and records are refused; then
    influxd back, and the same process drains the spool and accepts records again."""
    proc = runs.start()
    try:
        wait_for(lambda: runs.ready(proc), 60, "run ready")
        influx.stop()
        wait_for(lambda: (runs.metric("gpu_audit_spool_refused_records_total") or 0) > 0,
                 180, "the spool's filesystem to fill up and refuse records", step=0.5)
        st = os.statvfs(spool)
        assert st.f_bavail * st.f_frsize < 512 * 1024, "refused before the disk was full"
        influx.start()
        # no restart: space comes back once the backlog is shipped and collected (while
        # the backlog drains, a cycle may still be refused now and then)
        wait_for(lambda: runs.metric("gpu_audit_spool_full") == 0, 240,
                 "the spool to accept records again after influxd came back", step=0.5)
        seen: list[float | None] = []

        def settled() -> bool:
            seen.append(runs.metric("gpu_audit_spool_refused_records_total"))
            return len(seen) > 6 and len(set(seen[-6:])) == 1  # none refused for ~3 s

        wait_for(settled, 240, "records to stop being refused", step=0.5)
        before = spool_stats(spool)["next_offset"]
        wait_for(lambda: spool_stats(spool)["next_offset"] > before + 1000, 60,
                 "records written after the recovery")
        assert proc.poll() is None, "the run died while the disk was full"
    finally:
        _kill(proc)


def _influx_counts(influx: Influxd) -> Counter[str]:
    res = influx.query("SHOW MEASUREMENTS")
    names = [row[0] for row in res["results"][0]["series"][0]["values"]]
    counts: Counter[str] = Counter()
    for name in names:
        q = influx.query(f'SELECT count("seq") FROM "{name}"')
        counts[name] = q["results"][0]["series"][0]["values"][0][1]
    return counts


def _vm_counts(vm: VictoriaMetrics) -> Counter[str]:
    counts: Counter[str] = Counter()
    for series in vm.export('{__name__=~"gpu_audit_.+_seq"}'):
        name = series["metric"]["__name__"].removesuffix("_seq")
        counts[name] += len(series["values"])
    return counts


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_soak_kill9_sink_outage_and_full_disk_end_with_exactly_the_records_produced(
    tmp_path: Path,
) -> None:
    """26+ SIGKILLs of `gpu-audit run` (random moments, rotation, every compression step),
    influxd stopped until the spool's real filesystem is full and back, then SIGTERM:
    the archive holds exactly the spool's records in order and verifies, influxd and
    VictoriaMetrics hold one point per record, `audit verify` passes on the archive and
    on influxd read back."""
    rng = random.Random(20261201)
    port = free_port()
    with small_filesystem(tmp_path, SPOOL_DISK, "spoolfs") as spoolfs, \
            influxd_server(tmp_path) as influx, victoria_metrics_server(tmp_path) as vm:
        spool = spoolfs / "spool"
        config = _config(tmp_path, spool, port, influx.url, vm.url)
        runs = _Runs(config, port, tmp_path / "run.log")
        started = time.time_ns()
        kills = 0
        plan: list[tuple[str, int] | None] = [None] * RANDOM_KILLS + list(BOUNDARY_KILLS)
        rng.shuffle(plan)
        for i, boundary in enumerate(plan):
            if i == RANDOM_KILLS // 2:
                _fill_and_recover(runs, influx, spool)
                kills += 1
            if boundary is None:
                proc = runs.start()
                wait_for(lambda p=proc: runs.ready(p), 60, "run ready")  # type: ignore[misc]
                time.sleep(rng.uniform(0.2, 4.0))
                _kill(proc)
            else:
                proc = runs.start(boundary[0], str(boundary[1]))
                try:
                    rc = proc.wait(90)  # it kills itself at the boundary
                except subprocess.TimeoutExpired:
                    _kill(proc)
                    rc = proc.returncode
                assert rc == -signal.SIGKILL, f"boundary {boundary} never reached (rc {rc})"
            kills += 1

        final = runs.start()
        wait_for(lambda: runs.ready(final), 60, "final run ready")
        time.sleep(2)
        final.send_signal(signal.SIGTERM)
        assert final.wait(120) == 0, runs.log.read_text()[-4000:]
        ended = time.time_ns()
        assert kills >= 20

        produced = spool_stats(spool)["next_offset"]
        cursors = CursorStore(spool)
        assert {name: cursors.get(name) for name in SINKS} == dict.fromkeys(SINKS, produced)
        assert not list((spool / "quarantine").glob("*")), "the spool saw corruption"

        # the archive: exactly the spool's records, each once, in the order written
        archived = list(read_records(tmp_path / "archive", 0, 2**63 - 1))
        assert len(archived) == produced > 10_000
        assert len({r["id"] for r in archived}) == produced
        assert main(["audit", "verify", str(tmp_path / "archive")]) == 0

        # influxd and VictoriaMetrics: one point per record, per kind
        kinds = Counter(f"gpu_audit_{r['kind']}" for r in archived)
        assert _influx_counts(influx) == kinds
        assert _vm_counts(vm) == kinds
        assert main(["audit", "verify", "--config", str(config), "--sink", "influx",
                     "--from", _rfc3339(started - 60 * 10**9),
                     "--to", _rfc3339(ended + 60 * 10**9)]) == 0
