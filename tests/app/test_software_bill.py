"""`gpu-audit chargeback bill --group-by software` on a crafted, hash-chained trail: the real
producer writes process_start records with the software the resolver found and the
processes' usage (per cycle, version 2, and interval, version 3); the breakdown groups
their GPU-hours by fingerprint or by one library's version, the groups add up to the
processes' total, and a second run writes byte-identical files."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chargeback.software import NO_RECORD, NOT_LOADED, SoftwareUsage, describe, group_label
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.model.attribution import Software
from gpu_audit.spool import SpoolConfig, SpoolWriter
from gpu_audit_app.cli import main
from tests.core.audit.factory import ALICE, BOB, snapshot
from tests.core.audit.factory import gpu as gpu_sample
from tests.core.audit.factory import proc as proc_sample

T0 = 1_796_000_020.0
E = 5.0
OLD = Software(loaded=("cudart", "torch"), libraries={"cudart": "11.7.99", "torch": "2.4.0"})
NEW = Software(loaded=("cudart", "nccl", "torch"),
               libraries={"cudart": "12.1.105", "torch": "2.6.0"}, image="lab/train:2")
SOFTWARE = {101: OLD, 102: NEW}  # pid 103 ran nothing the exporter recognised


def _trail(directory: Path, interval: float) -> Path:
    writer = SpoolWriter(SpoolConfig(directory=directory, min_free_bytes=0))
    p = AuditProducer(AuditConfig(interval_seconds=interval), writer, host="n1",
                      exporter_version="t", simulated=False)
    p.start()
    for k in range(36):  # 3 minutes; pid 102 only in the second half
        procs0 = [proc_sample(101, sm=0.5)] + ([proc_sample(102, sm=0.5)] if k >= 18 else [])
        gpus = [gpu_sample(0, util=0.6, energy=100.0 * k, power=100.0, processes=procs0),
                gpu_sample(1, util=0.3, energy=50.0 * k, power=50.0,
                           processes=[proc_sample(103, sm=0.3)])]
        snap = snapshot(T0 + E * k, gpus, {101: ALICE, 102: BOB, 103: ALICE}, interval=E)
        snap = replace(snap, processes={
            uuid: tuple(replace(ap, software=SOFTWARE.get(ap.process.identity.pid))
                        for ap in aps) for uuid, aps in snap.processes.items()})
        p.on_snapshot(snap)
    p.stop()
    writer.close()
    return directory


def _bill(trail: Path, out: Path, key: str) -> dict[str, Any]:
    start = datetime.fromtimestamp(T0 - 60, UTC).isoformat()
    end = datetime.fromtimestamp(T0 + 3600, UTC).isoformat()
    assert main(["chargeback", "bill", "--group-by", key, "--trail", str(trail), "--from", start,
                 "--to", end, "--out", str(out)]) == 0
    doc: dict[str, Any] = json.loads((out / "software.json").read_text())
    return doc


@pytest.mark.parametrize("interval", [E, 60.0])
def test_gpu_hours_by_software_and_by_one_library(tmp_path: Path, interval: float) -> None:
    trail = _trail(tmp_path / "spool", interval)
    doc = _bill(trail, tmp_path / "a", "software")
    groups = {g["software"]: g for g in doc["groups"]}
    assert set(groups) == {describe(OLD.record_part()), describe(NEW.record_part()), NO_RECORD}
    assert describe(NEW.record_part()) == \
        "image lab/train:2; cudart 12.1.105, nccl, torch 2.6.0"
    old, new = groups[describe(OLD.record_part())], groups[describe(NEW.record_part())]
    assert old["users"] == ["alice"] and new["users"] == ["bob"]
    # pid 101 ran twice as long as pid 102
    assert old["gpu_seconds"] == pytest.approx(2 * new["gpu_seconds"], rel=0.1)
    r = doc["reconciliation"]
    assert r["difference_gpu_seconds"] == pytest.approx(0, abs=1e-9)
    assert sum(g["gpu_seconds"] for g in doc["groups"]) == pytest.approx(
        r["process_gpu_seconds"])
    torch = {g["software"]: g["processes"] for g in
             _bill(trail, tmp_path / "b", "software:torch")["groups"]}
    assert torch == {"torch 2.4.0": 1, "torch 2.6.0": 1, NO_RECORD: 1}
    nccl = {g["software"] for g in _bill(trail, tmp_path / "c", "software:nccl")["groups"]}
    assert nccl == {NOT_LOADED, "nccl (version unknown)", NO_RECORD}


def test_the_breakdown_is_reproducible_and_bad_keys_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trail = _trail(tmp_path / "spool", 60.0)
    _bill(trail, tmp_path / "a", "software:cudart")
    _bill(trail, tmp_path / "b", "software:cudart")
    for name in ("software.json", "software.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(SystemExit) as exc:
        main(["chargeback", "bill", "--group-by", "software:Bad Name", "--trail", str(trail),
              "--month", "2026-11"])
    assert exc.value.code == 2
    assert "software:NAME" in capsys.readouterr().err


def test_hostile_software_objects_are_cut_to_the_allow_lists() -> None:
    u = SoftwareUsage()
    u.add({"kind": "event", "event": "process_start", "host": "n1",
           "process": {"pid": 1, "start_time_ticks": 5},
           "software": {"loaded": ["cudart", "X; rm -rf", 3], "image": "bad image\n",
                        "libraries": {"cudart": "12.4.127", "torch": "2.6.0; evil"}}})
    u.add({"kind": "process", "host": "n1", "time_ns": 1,
           "process": {"pid": 1, "start_time_ticks": 5}, "gpu_seconds": 10.0,
           "attribution": {"user": "alice"}})
    u.add({"kind": "process", "host": "n1", "time_ns": 2,
           "process": {"pid": 1, "start_time_ticks": 5}, "gpu_seconds": float("nan")})
    (g,) = u.groups("software")
    assert g.label == "cudart 12.4.127" and g.gpu_seconds == 10.0
    assert group_label(None, "software:torch") == NO_RECORD


def test_sink_names_the_archive_to_read_when_the_configuration_has_two(
        tmp_path: Path) -> None:
    """With two archive sinks configured, `--sink NAME` chooses the trail the software
    bill reads (as `audit verify --sink` and the owner bill choose); the same bill as from
    `--trail` of that directory."""
    trail = _trail(tmp_path / "nfs", 60.0)
    (tmp_path / "local").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"spool: {{directory: {tmp_path / 'spool'}}}\n"
        "shipper:\n  sinks:\n"
        f"    - {{type: archive, directory: {tmp_path / 'local'}}}\n"
        f"    - {{type: archive, name: offsite, directory: {trail}}}\n")
    start = datetime.fromtimestamp(T0 - 60, UTC).isoformat()
    end = datetime.fromtimestamp(T0 + 3600, UTC).isoformat()
    out = tmp_path / "by-sink"
    assert main(["chargeback", "bill", "--group-by", "software", "--config", str(cfg),
                 "--sink", "offsite", "--from", start, "--to", end, "--out", str(out)]) == 0
    by_trail = _bill(trail, tmp_path / "by-trail", "software")
    assert json.loads((out / "software.json").read_text())["groups"] == by_trail["groups"]
