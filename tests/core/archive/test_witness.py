"""The chain head's witness, end to end with a real Prometheus: the producer's
`gpu_audit_audit_head` is scraped and kept; then the newest records are cut off the
archive (invisible to the archive alone: its live part just ends earlier), or replaced
and re-hashed. `audit verify --witness` and the bill find both; the intact archive
passes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from chargeback.model import Request
from chargeback.sources.archive import ArchiveRefused, read_archive
from gpu_audit.archive import list_parts
from gpu_audit.archive.verify import verify_archive
from gpu_audit.audit.canonical import seal as chain_seal
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.metrics import AuditCollector
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.audit.witness import WitnessUnavailable, hash_words, heads
from gpu_audit_app.cli import main
from tests.chargeback.archives import write_archive
from tests.core.audit.factory import ALICE, gpu, proc, snapshot
from tests.core.audit.fakes import MemorySpool
from tests.netutil import free_port, wait_for
from tests.promstack import prometheus

pytestmark = pytest.mark.timeout(120)

DAY = dt.datetime(2026, 11, 3, tzinfo=dt.UTC).timestamp()
HOST = "gpu-node-09"


@pytest.fixture(scope="module")
def witnessed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[bytes], str]]:
    """A node's trail and the URL of a Prometheus that scraped its head."""
    tmp = tmp_path_factory.mktemp("witness")
    spool = MemorySpool()
    clock = count(int(DAY - 601))
    p = AuditProducer(AuditConfig(interval_seconds=60.0), spool, host=HOST,
                      exporter_version="test", simulated=False,
                      clock=lambda: float(next(clock)))
    p.start()
    for k in range(60):  # ten minutes at 10 s
        p.on_snapshot(snapshot(DAY - 600 + 10 * k, [
            gpu(0, util=0.8, energy=800.0 * k, power=80.0, processes=[proc(101, sm=0.8)])],
            {101: ALICE}, interval=10.0))
    registry = CollectorRegistry()
    registry.register(AuditCollector(p))
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with prometheus(tmp, [f"127.0.0.1:{port}"]) as prom:
            _host, seq, _h = p.head()

            def scraped() -> bool:
                rows = prom.query('gpu_audit_audit_head{part="seq"}')
                return bool(rows) and int(float(rows[0]["value"][1])) == seq

            wait_for(scraped, 60, "Prometheus scraped the chain head")
            yield list(spool.payloads), prom.url
    finally:
        server.shutdown()
        thread.join(5)


def _req(url: str) -> Request:
    return Request(start=dt.datetime.fromtimestamp(DAY - 3600, dt.UTC),
                   end=dt.datetime.fromtimestamp(DAY + 3600, dt.UTC), source="archive",
                   config=None, prometheus_url=None, rates=None, directory=None,
                   idle_policy="none", out="out", witness=url)


def test_the_gauge_is_the_newest_record(witnessed: tuple[list[bytes], str]) -> None:
    trail, url = witnessed
    [head] = heads(url)
    last = orjson.loads(trail[-1])
    assert (head.host, head.stream, head.seq) == (HOST, "exporter", last["seq"])
    assert head.words == hash_words(last["hash"])
    assert last["hash"].startswith(head.prefix)


def test_an_intact_archive_holds_the_witnessed_head(
        witnessed: tuple[list[bytes], str], tmp_path: Path) -> None:
    trail, url = witnessed
    write_archive(tmp_path, trail)
    assert verify_archive(tmp_path, None, witness=heads(url)).ok
    assert main(["audit", "verify", "--witness", url, str(tmp_path)]) == 0
    bill = read_archive(_req(url), tmp_path)
    assert bill.verified is True


def _live(d: Path) -> Path:
    return list_parts(d)[-1].path


def test_a_cut_off_head_is_caught_only_with_the_witness(
        witnessed: tuple[list[bytes], str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    trail, url = witnessed
    write_archive(tmp_path, trail)
    live = _live(tmp_path)
    lines = live.read_bytes().split(b"\n")
    live.write_bytes(b"\n".join(lines[:-6]) + b"\n")  # the newest five records gone
    assert verify_archive(tmp_path, None).ok  # the archive alone cannot tell
    report = verify_archive(tmp_path, None, witness=heads(url))
    assert set(report.counts) == {"witness_missing"}
    assert main(["audit", "verify", "--witness", url, str(tmp_path)]) == 1
    assert "the newest records were cut off" in capsys.readouterr().out
    with pytest.raises(ArchiveRefused, match="witness_missing"):
        read_archive(_req(url), tmp_path)


def test_a_replaced_head_is_caught_with_the_witness(
        witnessed: tuple[list[bytes], str], tmp_path: Path) -> None:
    """The newest records edited and re-hashed (unkeyed: anyone can): the chain verifies,
    the witnessed hash does not match."""
    trail, url = witnessed
    forged = list(trail[:-3])
    prev = orjson.loads(forged[-1])["hash"]
    for raw in trail[-3:]:
        rec = orjson.loads(raw)
        rec["time_ns"] += 1
        forged.append(chain_seal(rec, rec["seq"], prev, None))
        prev = rec["hash"]
    write_archive(tmp_path, forged)
    assert verify_archive(tmp_path, None).ok
    assert set(verify_archive(tmp_path, None, witness=heads(url)).counts) == {
        "witness_mismatch"}
    with pytest.raises(ArchiveRefused, match="witness_mismatch"):
        read_archive(_req(url), tmp_path)


def test_no_witness_is_an_error_not_a_pass(tmp_path: Path) -> None:
    with pytest.raises(WitnessUnavailable, match="cannot query"):
        heads(f"http://127.0.0.1:{free_port()}")


def test_a_witness_for_what_is_not_an_archive_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "trail.jsonl"
    f.write_text("")
    assert main(["audit", "verify", "--witness", "http://127.0.0.1:9", str(f)]) == 2
    assert "--witness checks an archive directory" in capsys.readouterr().err
