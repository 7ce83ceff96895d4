"""The crash test: SIGKILL the shipper at random moments while a producer writes, with a
sink going down and coming back; every sink ends with exactly the produced records.

Sinks: the local archive, the in-process Elasticsearch bulk server, the real InfluxDB 1.x
(v1 write API) and the real VictoriaMetrics (the v2 write API). The shipper runs as its
own process (`gpu-audit shipper --config ...`), reading a spool the
producer process writes. The run ends with a SIGTERM, which must exit 0 with every cursor committed.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpu_audit.audit.verify import verify_readback
from gpu_audit.spool import CursorStore
from tests.realservers import influxd_server, victoria_metrics_server
from tests.shipper.helpers import ROOT, archive_docs, subprocess_env, wait_for_signal_handler
from tests.shipper.sinks.servers.search import SearchServer

N = 6000
KILLS = 22
SINKS = ("archive", "es", "influx", "vm")


def _config(tmp: Path, es: str, influx: str, vm: str) -> Path:
    cfg = {
        "log_level": "warning",
        "spool": {"directory": str(tmp / "spool"), "min_free_bytes": 0},
        "shipper": {
            "batch_max_records": 400,
            "batch_max_wait_s": 0.05,
            "poll_interval_s": 0.02,
            "backoff_base_s": 0.05,
            "backoff_cap_s": 0.5,
            "commit_interval_s": 0.5,  # a wide window for kills between send and commit
            "shutdown_grace_s": 10,
            "sinks": [
                {"type": "archive", "name": "archive", "directory": str(tmp / "archive")},
                {"type": "elasticsearch", "name": "es", "hosts": [es],
                 "number_of_replicas": 0, "timeout_s": 5},
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


def _shipper(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "shipper", "--config", str(config)],
            cwd=ROOT, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT,
        )




@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """22 SIGKILLs of the shipper during production, InfluxDB stopped and restarted in
    between: afterwards the archive, the bulk server, InfluxDB and VictoriaMetrics each
    hold exactly N records (N distinct ids, N points), the hash chain verifies on the
    archive, and a final SIGTERM exits 0 with every cursor at N."""
    rng = random.Random(20261130)
    with influxd_server(tmp_path) as influx, victoria_metrics_server(tmp_path) as vm, \
            SearchServer("elasticsearch") as es:
        config = _config(tmp_path, es.url, influx.url, vm.url)
        log = tmp_path / "shipper.log"
        producer = subprocess.Popen(
            [sys.executable, "-m", "tests.shipper.producer", str(tmp_path / "spool"), str(N),
             "--batch", "40", "--pause", "0.15"],
            cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
        )
        kills = 0
        for i in range(KILLS):
            if i == 7:
                influx.stop()  # the sink goes down while shippers keep being killed
            if i == 14:
                influx.start()
            proc = _shipper(config, log)
            time.sleep(rng.uniform(0.4, 2.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
        out, _ = producer.communicate(timeout=120)
        assert producer.returncode == 0
        assert int(out) == N

        final = _shipper(config, log)
        wait_for_signal_handler(final.pid)
        cursors = CursorStore(tmp_path / "spool")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if all(cursors.get(name) >= N for name in SINKS):
                break
            time.sleep(0.2)
        final.send_signal(signal.SIGTERM)
        assert final.wait(30) == 0, log.read_text()[-3000:]
        assert {name: cursors.get(name) for name in SINKS} == dict.fromkeys(SINKS, N)
        assert kills >= 20

        # the archive: exactly N lines, N distinct ids, and the hash chain verifies
        archived = list(archive_docs(tmp_path / "archive"))
        ids = Counter(d["id"] for d in archived)
        assert len(archived) == N and len(ids) == N
        report = verify_readback(archived, hmac_key=None, source="archive")
        assert report.ok, report.render()

        # the bulk server stored each id once (re-sends answered 409)
        assert len(es.docs) == N
        assert es.conflicts > 0, "no batch was ever re-sent: the kills did not test replay"
        assert set(es.stored_ids()) == set(ids)

        # InfluxDB: N points, N distinct record ids
        res = influx.query("SELECT count(seq) FROM gpu_audit_process")
        assert res["results"][0]["series"][0]["values"][0][1] == N
        res = influx.query("SELECT count(distinct(record_id)) FROM gpu_audit_process")
        assert res["results"][0]["series"][0]["values"][0][1] == N

        # VictoriaMetrics: one sample per record in the seq metric, N distinct seqs
        series = vm.export('{__name__="gpu_audit_process_seq"}')
        values = [v for s in series for v in s["values"]]
        assert len(values) == N, f"{len(values)} samples in {len(series)} series"
        assert sorted(int(v) for v in values) == list(range(1, N + 1))

        # nothing was dead-lettered or dropped along the way
        assert not list((tmp_path / "spool" / "deadletter").glob("*.jsonl"))
