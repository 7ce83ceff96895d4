"""`gpu-audit chargeback simulate SCENARIO`: the simulator backend, the real resolver,
producer and archive sink in virtual time, then the archive billed, SIMULATED said in
the output, the report, the notes and the manifest, and the manifest replayed.

Two days of the shipped `busy` scenario (4x H100, 60 s cycles, 300 s usage records). By
hand, from the story (exporter/sim/scenarios/busy.yaml): alice's DDP job holds all 4 GPUs throughout
(4 x 48 = 192 GPU-h used); bob's notebook shares GPU 3 and the inference pod
(uid 1000, search-ranking: named `uid:1000` on every host, as `gpu-audit run
--simulate` names it) GPU 2 all the time (48 h used, half charged each); carol's
eval script runs from 600 s to 4,200 s on GPU 1 (1 h, half charged). So alice is
charged 192 - 24 - 24 - 0.5 = 143.5 GPU-h, and nothing is idle.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import orjson
import pytest

from chargeback.replay import replay
from chargeback.values import CSV_NAME, HTML_NAME, MANIFEST_NAME
from gpu_audit_app.chargeback.main import readers
from gpu_audit_app.cli import main

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"
PERIOD = ["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-03T00:00:00Z"]


def _args(out: Path, *extra: str) -> list[str]:
    return ["chargeback", "simulate", "busy", *PERIOD, "--rates",
            str(EXAMPLES / "rates.yaml"), "--directory", str(EXAMPLES / "directory.yaml"),
            "--out", str(out), *extra]


def test_simulated_bill_is_the_story_said_simulated_and_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bill"
    assert main(_args(out)) == 0
    printed = capsys.readouterr().out
    assert "SIMULATED: playing scenario 'busy'" in printed
    assert "SIMULATED: 2881 cycles of 4 simulated GPU(s)" in printed  # 48 h / 60 s + 1
    rows = {(r["kind"], r["user"]): r for r in csv.DictReader(io.StringIO(
        (out / CSV_NAME).read_text()))}
    want = {("owner", "alice"): (192, 143.5), ("owner", "bob"): (48, 24),
            ("owner", "uid:1000"): (48, 24), ("owner", "carol"): (1, 0.5),
            ("unattributed", ""): (0, 0), ("idle", ""): (0, 0)}
    assert set(rows) == set(want)
    for key, (used, charged) in want.items():
        assert float(rows[key]["used_gpu_hours"]) == pytest.approx(used, abs=1e-6), key
        assert float(rows[key]["charged_gpu_hours"]) == pytest.approx(charged, abs=1e-6), key
    assert {r["source"] for r in rows.values()} == {"archive"}
    # the audit records carry no allocation: "not known" (empty), never a copy of used
    assert {r["allocated_gpu_hours"] for r in rows.values()} == {""}
    # the archive is a real, hash-chained trail of simulated records only
    archive = out / "sim-archive"
    records = [orjson.loads(line) for p in sorted(archive.glob("gpu-audit_*.jsonl*"))
               for line in _lines(p)]
    # (usage records say it as `sim`, events as `simulated`: the record formats)
    assert records and all(r.get("simulated", r.get("sim")) is True for r in records)
    # what `gpu-audit run` writes: interval usage records (schema 3), not the per-cycle
    # trail, in day parts the sink sealed when it closed them
    usage = [r for r in records if r["kind"] != "event"]
    assert usage and {(r["schema"], r["kind"]) for r in usage} == {
        ("gpu-audit.record/3", "usage")}
    assert {r["dt"] for r in usage if r.get("n") == 5} == {300.0}
    closed = [p for p in archive.glob("gpu-audit_*.jsonl.gz")]
    assert closed and all(
        p.with_name(p.name.replace(".jsonl.gz", ".seal.json")).exists() for p in closed)
    # said everywhere
    html = (out / HTML_NAME).read_text()
    assert 'id="simulated-banner">SIMULATED' in html
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["request"]["include_simulated"] is True
    assert manifest["request"]["source"] == "archive"
    assert manifest["source"]["verified"] is True  # the chain verified as it was read
    assert any(n.startswith("SIMULATED: ") for n in manifest["source"]["notes"])
    capsys.readouterr()
    say = io.StringIO()
    again = replay(out / MANIFEST_NAME, tmp_path / "again", readers=readers(), say=say)
    assert again == 0, say.getvalue()


def _lines(path: Path) -> list[bytes]:
    import gzip

    data = path.read_bytes()
    data = gzip.decompress(data) if path.name.endswith(".gz") else data
    return [line for line in data.split(b"\n") if line]


def test_simulate_refuses_another_source_and_a_used_archive(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # `simulate` has no --source: only its archive
        main(_args(tmp_path / "a", "--source", "prometheus"))
    assert exc.value.code == 2
    assert "unrecognized arguments: --source prometheus" in capsys.readouterr().err
    used = tmp_path / "used"
    used.mkdir()
    (used / "gpu-audit-2026-11-01.jsonl").write_text("{}\n")
    assert main(_args(tmp_path / "b", "--sim-archive", str(used))) == 1
    assert "is not empty" in capsys.readouterr().err


def test_sim_nodes_bills_copies_of_the_node(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Two copies of busy's node for one day: twice the GPUs (2 x 4 x 24 = 192 GPU-h),
    each its own host and chain; carol's hour on each node; alice charged 192 - 2 x 12
    (bob) - 2 x 12 (uid:1000) - 2 x 0.5 (carol) = 143."""
    out = tmp_path / "bill"
    args = _args(out, "--sim-nodes", "2")
    args[args.index("2026-11-03T00:00:00Z")] = "2026-11-02T00:00:00Z"
    assert main(args) == 0
    assert "of 8 simulated GPU(s)" in capsys.readouterr().out
    rows = {r["user"]: r for r in csv.DictReader(io.StringIO((out / CSV_NAME).read_text()))}
    assert float(rows["alice"]["used_gpu_hours"]) == pytest.approx(192)
    assert float(rows["alice"]["charged_gpu_hours"]) == pytest.approx(143)
    assert float(rows["carol"]["used_gpu_hours"]) == pytest.approx(2)
    hosts = {orjson.loads(line)["host"]
             for p in (out / "sim-archive").glob("gpu-audit_*.jsonl*") for line in _lines(p)}
    assert hosts == {"sim-node-01", "sim-node-02"}


def test_bad_rates_and_directory_are_refused_before_a_month_is_simulated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every problem of both files at once, exit 2, and no archive written first."""
    rates = tmp_path / "rates.yaml"
    rates.write_text("currency: 12\ngpu_hour: {default: -3}\nbogus: 1\n")
    directory = tmp_path / "directory.yaml"
    directory.write_text("users: [not, a, mapping]\n")
    out = tmp_path / "bill"
    code = main(["chargeback", "simulate", "busy", *PERIOD, "--rates", str(rates),
                 "--directory", str(directory), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "currency" in err and "gpu_hour" in err and "bogus" in err and "users" in err
    assert "rates.yaml" in err and "directory.yaml" in err
    assert not out.exists()


def test_sim_nodes_archive_verifies_each_node_from_its_own_first_seq(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--sim-nodes 16` wrote node k's stream starting at seq k (each
    producer resumed after the previous node's exporter_start in the shared spool);
    `audit verify` found 15 gaps while the bill said verified. Each node's chain now
    starts at seq 1, and `audit verify` passes on the archive."""
    out = tmp_path / "bill"
    args = _args(out, "--sim-nodes", "16")
    args[args.index("2026-11-03T00:00:00Z")] = "2026-11-01T06:00:00Z"
    assert main(args) == 0
    capsys.readouterr()
    archive = out / "sim-archive"
    assert main(["audit", "verify", str(archive)]) == 0, capsys.readouterr().out
    report = capsys.readouterr().out
    assert "16 stream(s): OK" in report
    firsts = {}
    for p in sorted(archive.glob("gpu-audit_*.jsonl*")):
        for line in _lines(p):
            rec = orjson.loads(line)
            firsts.setdefault(rec["host"], rec["seq"])
    assert len(firsts) == 16 and set(firsts.values()) == {1}
