"""`gpu-audit audit verify` and `gpu-audit spool verify|stats` on a trail made by the real
pipeline (simulator -> attribution -> audit producer -> spool)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.sim.backend import SimBackend
from exporter.sim.fakeproc import write_fake_proc
from exporter.sim.scenario import load_scenario
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.model.snapshot import Snapshot
from gpu_audit.spool import SpoolConfig, SpoolReader, SpoolWriter
from gpu_audit_app.cli import main


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    clock = [1_790_000_000.0]
    backend = SimBackend(load_scenario("xid"), clock=lambda: clock[0])
    info = backend.open()
    proc = tmp_path / "proc"
    proc.mkdir()
    resolver = Resolver(AttributionConfig(procfs_root=proc))
    spool = tmp_path / "spool"
    writer = SpoolWriter(SpoolConfig(directory=spool, min_free_bytes=0))
    producer = AuditProducer(AuditConfig(interval_seconds=300.0), writer, host="node1",
                             exporter_version="t",
                             simulated=True)
    producer.start()
    for i in range(12):
        clock[0] += 300.0  # 5-minute steps walk through the scenario's XIDs and lost GPU
        gpus = tuple(backend.sample(clock[0], slow=i % 4 == 0))
        write_fake_proc(proc, (p for g in gpus for p in g.processes), prune=True)
        producer.on_snapshot(Snapshot(timestamp=clock[0], host="node1", backend=info,
                                      gpus=gpus, processes=resolver.attribute(gpus),
                                      interval_seconds=300.0,
                                      elapsed_seconds=300.0 if i else 0.0, cycle=i))
    producer.stop()
    writer.close()
    return spool


def _export_jsonl(spool: Path, out: Path) -> list[bytes]:
    lines = [payload for _, payload in SpoolReader(spool).read(0, 100_000, 1 << 30).entries]
    out.write_bytes(b"".join(line + b"\n" for line in lines))
    return lines


def test_a_clean_trail_verifies_from_the_spool_and_from_jsonl(
    spool_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trail the pipeline wrote verifies as a spool dir and as an exported JSONL file,
    and it contains XID and GPU-lost events."""
    assert main(["audit", "verify", str(spool_dir)]) == 0
    lines = _export_jsonl(spool_dir, tmp_path / "trail.jsonl")
    events = {orjson.loads(line).get("event") for line in lines}
    assert {"xid", "gpu_lost", "exporter_start", "exporter_stop"} <= events
    assert main(["audit", "verify", str(tmp_path / "trail.jsonl")]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["edit", "delete", "duplicate", "swap"])
def test_verify_names_the_line_of_each_kind_of_damage(
    spool_dir: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited, deleted, duplicated or reordered record makes verify exit 1 and say
    which line and what kind of problem."""
    lines = _export_jsonl(spool_dir, tmp_path / "t.jsonl")
    i = len(lines) // 2
    if damage == "edit":
        rec = json.loads(lines[i])
        rec["gpu_seconds"] = (rec.get("gpu_seconds") or 0) + 3600
        lines[i] = json.dumps(rec).encode()
        expect = "modified"
    elif damage == "delete":
        del lines[i]
        expect = "gap"
    elif damage == "duplicate":
        lines.insert(i, lines[i])
        expect = "duplicate"
    else:
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
        expect = "reordered"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"".join(line + b"\n" for line in lines))
    capsys.readouterr()
    assert main(["audit", "verify", str(bad)]) == 1
    out = capsys.readouterr().out
    assert expect in out
    assert f"line {i + 1}" in out or f"line {i + 2}" in out


def test_spool_verify_and_stats(spool_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """spool verify passes on a healthy spool and fails naming the file after a flipped
    byte; spool stats --json reports the records."""
    assert main(["spool", "stats", str(spool_dir), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["records"] > 100
    assert main(["spool", "verify", str(spool_dir)]) == 0
    seg = next(spool_dir.glob("*.seg"))
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    seg.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["spool", "verify", str(spool_dir)]) == 1
    assert seg.name in capsys.readouterr().out


def test_verify_reads_back_from_a_configured_sink(
    spool_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`audit verify --sink NAME --from --to` reads the records back from the sink (here
    the archive, after a real shipper delivered them) and verifies them; a sink that
    cannot give records back (Fluentd) is a clear usage error, not a crash."""
    from gpu_audit_app.config import load_settings
    from shipper.engine import Shipper

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"spool: {{directory: {spool_dir}, min_free_bytes: 0}}\n"
        "shipper:\n  sinks:\n"
        f"    - {{type: archive, name: arch, directory: {tmp_path / 'archive'}}}\n"
        "    - {type: fluentd, name: fl, host: 127.0.0.1, port: 9}\n"
    )
    config = load_settings(cfg)
    archive_only = config.shipper.model_copy(update={"sinks": config.shipper.sinks[:1]})
    shipper = Shipper(archive_only, config.spool)
    shipper.start()
    assert shipper.drain(30)
    shipper.stop()
    capsys.readouterr()
    argv = ["audit", "verify", "--config", str(cfg), "--from", "2020-01-01T00:00:00Z",
            "--to", "2100-01-01T00:00:00Z"]
    assert main([*argv, "--sink", "arch"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main([*argv, "--sink", "fl"]) == 2
    assert "cannot give records back" in capsys.readouterr().err
    assert main([*argv, "--sink", "nope"]) == 2


def test_the_default_archive_sink_is_named_archive(
    spool_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no sinks configured the default archive sink exists, and its name is its type
    (the name `spool stats` shows for its cursor): `audit verify --sink archive` reads it."""
    from gpu_audit_app.config import load_settings
    from shipper.engine import Shipper

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"spool: {{directory: {spool_dir}, min_free_bytes: 0}}\n")
    config = load_settings(cfg, environ={})
    shipper = Shipper(config.shipper, config.spool)
    shipper.start()
    assert shipper.drain(30)
    shipper.stop()
    assert main(["spool", "stats", str(spool_dir), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["cursors"]) == ["archive"]
    assert main(["audit", "verify", "--config", str(cfg), "--sink", "archive",
                 "--from", "2020-01-01T00:00:00Z", "--to", "2100-01-01T00:00:00Z"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["audit", "verify", "--config", str(cfg), "--sink", "nope",
                 "--from", "2020-01-01T00:00:00Z", "--to", "2100-01-01T00:00:00Z"]) == 2
    assert "configured: archive" in capsys.readouterr().err


def test_verify_json_is_the_report_as_data(
    spool_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`audit verify --json` prints one JSON document (ok, records, streams, problems with
    where each is, counts by kind) and keeps the exit code: 0 intact, 1 damaged."""
    assert main(["audit", "verify", "--json", str(spool_dir)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["problems"] == [] and doc["counts"] == {}
    assert doc["records"] > 0
    assert sum(s["records"] for s in doc["streams"].values()) == doc["records"]

    lines = _export_jsonl(spool_dir, tmp_path / "t.jsonl")
    del lines[len(lines) // 2]
    (tmp_path / "t.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    assert main(["audit", "verify", "--json", str(tmp_path / "t.jsonl")]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["counts"]["gap"] >= 1
    gap = next(p for p in doc["problems"] if p["kind"] == "gap")
    assert gap["where"].startswith("line ") and gap["stream"] and gap["detail"]
