"""Real audit archives for the chargeback tests and the archive benchmark: snapshots ->
the real AuditProducer (hash-chained records) -> the real archive sink (day parts,
closed parts gzipped), exactly as `gpu-audit run` leaves them on disk."""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Sequence
from pathlib import Path

import orjson

from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.model.snapshot import Snapshot
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import SinkRecord
from tests.core.audit.fakes import MemorySpool


class ArchiveWriter:
    """The archive sink fed as the shipper would: every spooled payload, in order."""

    def __init__(self, directory: Path, *, max_file_bytes: int = 256 * 1024 * 1024,
                 seal_key: bytes | None = None) -> None:
        cfg = ArchiveSinkConfig.model_validate(
            {"type": "archive", "directory": directory, "fsync": False,
             "max_file_bytes": max_file_bytes})
        self.sink = ArchiveSink(cfg, "archive", directory,
                                **({"seal_key": seal_key} if seal_key is not None else {}))
        self.sink.start()
        self.offset = 0

    def write(self, payloads: Sequence[bytes]) -> None:
        batch = []
        for raw in payloads:
            self.offset += 1
            doc = orjson.loads(raw)
            batch.append(SinkRecord(offset=self.offset, record_id=doc["id"], doc=doc, raw=raw))
        if batch:
            self.sink.send(batch)

    def close(self) -> None:
        self.sink.close()


def produce(
    snaps: Iterable[Snapshot],
    *,
    host: str,
    stream: str = "exporter",
    simulated: bool = False,
    start_s: float,
    stop_s: float,
    key_file: Path | None = None,
    interval_s: float | None = None,
) -> list[bytes]:
    """The stored bytes of one exporter run: exporter_start at `start_s`, a cycle per
    snapshot, exporter_stop at `stop_s`. `interval_s`: audit.interval_seconds (default:
    the snapshots' own interval, the per-cycle trail)."""
    snaps = list(snaps)
    spool = MemorySpool()
    clock = iter([start_s, stop_s])
    interval = interval_s if interval_s is not None else (
        snaps[0].interval_seconds if snaps else 60.0)
    p = AuditProducer(AuditConfig(stream=stream, hmac_key_file=key_file,
                                  interval_seconds=interval), spool, host=host,
                      exporter_version="test", simulated=simulated, clock=lambda: next(clock))
    p.start()
    for s in snaps:
        p.on_snapshot(s)
    p.stop()
    return list(spool.payloads)


def write_archive(directory: Path, *runs: Sequence[bytes],
                  max_file_bytes: int = 256 * 1024 * 1024,
                  seal_key: bytes | None = None) -> None:
    """Archive the runs' records, ordered by time as one shipper would deliver them
    from one spool (each run's own order kept). `seal_key`: the trail's HMAC key (the
    seals carry a MAC under it, as `gpu-audit run` writes them with audit.hmac_key_file)."""
    merged = sorted(
        ((orjson.loads(raw)["time_ns"], i, j, raw)
         for i, run in enumerate(runs) for j, raw in enumerate(run)),
        key=lambda t: (t[0], t[1], t[2]))
    w = ArchiveWriter(directory, max_file_bytes=max_file_bytes, seal_key=seal_key)
    w.write([raw for *_, raw in merged])
    w.close()


def rewrite_part(path: Path, edit: object) -> None:
    """Apply `edit(lines) -> lines` to an archive part, keeping its compression."""
    assert callable(edit)
    data = path.read_bytes()
    gz = path.name.endswith(".gz")
    lines = (gzip.decompress(data) if gz else data).split(b"\n")
    out = b"\n".join(edit(lines))
    path.write_bytes(gzip.compress(out) if gz else out)
