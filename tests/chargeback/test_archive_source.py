"""The archive source: a real archive (real producer, real archive sink) adds up to the
bill the scenario below gives by hand; a tampered archive is refused, or let through
marked unverified.

The scenario, 10 s cycles from DAY - 30 s to DAY + 30 s (six measured intervals, two
before midnight and four after), one node:
- GPU 0: util 1.0, alice (pid 101, SM 0.5), bob (102, SM 0.25) and an unowned process
  (103, SM 0.25); its counter moves 1000 J per interval, power 110 W (1100 J by power);
- GPU 1: free (no process), util 0, 500 J per interval, 50 W;
- GPU 2: down throughout;
- GPU 3: two processes of alice (301, 302, SM 0.01 each), util 0.02 (idle-held),
  200 J per interval, 20 W;
- GPU 4: only an unowned process (401), util 0.5, 300 J per interval, 30 W.
A second, simulated node (its own stream) runs mallory on one GPU at the same time.
"""

from __future__ import annotations

import datetime as dt
import gzip
from dataclasses import astuple, replace
from pathlib import Path

import orjson
import pytest

from chargeback.model import UNATTRIBUTED, Request, SourceData
from chargeback.sources.archive import ArchiveRefused, read_archive
from gpu_audit.model.attribution import Attribution
from gpu_audit.model.samples import GpuSample
from gpu_audit.model.snapshot import Snapshot
from tests.chargeback.archives import produce, rewrite_part, write_archive
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(60)

DAY = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
DAY_S = DAY.timestamp()
MODEL = "NVIDIA H100 80GB HBM3"
ALICE_O = ("alice", "vision")
BOB_O = ("bob", "nlp")
MALLORY = Attribution(user="mallory", project="nlp", sources={"user": "environ"})
N = 6  # measured intervals
E = 10.0  # seconds each


def _gpus(k: int) -> list[GpuSample]:
    return [
        gpu(0, util=1.0, energy=1000.0 * k, power=110.0,
            processes=[proc(101, sm=0.5), proc(102, sm=0.25), proc(103, sm=0.25)]),
        gpu(1, util=0.0, energy=500.0 * k, power=50.0),
        gpu(2, up=False),
        gpu(3, util=0.02, energy=200.0 * k, power=20.0,
            processes=[proc(301, sm=0.01), proc(302, sm=0.01)]),
        gpu(4, util=0.5, energy=300.0 * k, power=30.0, processes=[proc(401, sm=0.5)]),
    ]


def _snaps() -> list[Snapshot]:
    owners = {101: ALICE, 102: BOB, 301: ALICE, 302: ALICE}
    return [snapshot(DAY_S - 30 + 10 * k, _gpus(k), owners, interval=E) for k in range(N + 1)]


def _sim_snaps() -> list[Snapshot]:
    return [snapshot(DAY_S - 30 + 10 * k,
                     [gpu(0, util=0.9, energy=700.0 * k, processes=[proc(501, sm=0.9)])],
                     {501: MALLORY}, interval=E, simulated=True)
            for k in range(N + 1)]


def _runs(interval_s: float | None = None) -> tuple[list[bytes], list[bytes]]:
    """The real node's and the simulated node's records (per cycle, or with audit
    interval `interval_s`)."""
    real = produce(_snaps(), host="gpu-node-07", start_s=DAY_S - 40, stop_s=DAY_S + 40,
                   interval_s=interval_s)
    sim = produce(_sim_snaps(), host="sim-node", stream="sim", simulated=True,
                  start_s=DAY_S - 40, stop_s=DAY_S + 40, interval_s=interval_s)
    return real, sim


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    d = tmp_path / "archive"
    d.mkdir()
    write_archive(d, *_runs())
    return d


def _req(**kw: object) -> Request:
    base: dict[str, object] = {
        "start": DAY - dt.timedelta(hours=1), "end": DAY + dt.timedelta(hours=1),
        "source": "archive", "config": None, "prometheus_url": None, "rates": None,
        "directory": None, "idle_policy": "none", "out": "out"}
    base.update(kw)
    return Request(**base)  # type: ignore[arg-type]


NODE = "gpu-audit_gpu-node-07_exporter_"  # the real node's parts (host, stream)


def test_archive_sums_match_the_hand_computed_bill(archive: Path) -> None:
    """The bill's sums from a sealed part's rollup and the open part's records equal the
    scenario's by hand; each host's stream is its own series of parts."""
    d = read_archive(_req(), archive)
    assert d.verified is True and d.verification_problems == []
    assert sorted(p.name for p in archive.iterdir() if not p.name.startswith(".")) == [
        NODE + "2026-11-02.jsonl.gz", NODE + "2026-11-02.seal.json", NODE + "2026-11-03.1.jsonl",
        "gpu-audit_sim-node_sim_2026-11-02.jsonl.gz", "gpu-audit_sim-node_sim_2026-11-02.seal.json",
        "gpu-audit_sim-node_sim_2026-11-03.1.jsonl"]
    alice, bob, un = (d.usage[o, MODEL] for o in (ALICE_O, BOB_O, UNATTRIBUTED))
    # used: GPU 0 and GPU 3 for six intervals (two processes on GPU 3 count once)
    assert alice.used_gpu_seconds == 2 * N * E
    # charged: half of GPU 0 (shared with bob), all of GPU 3
    assert alice.charged_gpu_seconds == N * E / 2 + N * E
    assert alice.busy_gpu_seconds == pytest.approx(0.5 * N * E + 2 * 0.01 * N * E)
    assert alice.idle_held_gpu_seconds == N * E  # GPU 3 at 2 %
    assert alice.energy_joules == N * (500 + 200)  # SM-weighted half of GPU 0 + all of GPU 3
    assert alice.power_energy_joules == pytest.approx(N * (550 + 200))
    # no allocation in the records: not known (0, written empty), never a copy of used
    assert alice.allocated_gpu_seconds == 0 and d.allocation_known is False
    assert (bob.used_gpu_seconds, bob.charged_gpu_seconds) == (N * E, N * E / 2)
    assert bob.busy_gpu_seconds == pytest.approx(0.25 * N * E)
    assert bob.energy_joules == N * 250
    # unattributed: GPU 4 held only by an unowned process; GPU 0's unowned share of
    # busy time and energy
    assert (un.used_gpu_seconds, un.charged_gpu_seconds) == (N * E, N * E)
    assert un.busy_gpu_seconds == pytest.approx(0.25 * N * E + 0.5 * N * E)
    assert un.energy_joules == N * (250 + 300)
    f = d.fleet[MODEL]
    assert f.gpu_seconds == 4 * N * E  # GPUs 0, 1, 3, 4 up
    assert f.down_gpu_seconds == N * E  # GPU 2
    assert f.held_gpu_seconds == 3 * N * E  # all but the free GPU 1
    assert f.idle_held_gpu_seconds == N * E
    assert f.energy_joules == N * (1000 + 500 + 200 + 300)
    assert f.power_energy_joules == pytest.approx(N * (1100 + 500 + 200 + 300))
    # reconciliation: owners' charged + unattributed + idle (the free GPU 1) = fleet
    charged = sum(u.charged_gpu_seconds for u in d.usage.values())
    assert charged + N * E == f.gpu_seconds
    assert ("mallory", "nlp") not in {o for o, _ in d.usage}


def test_days_split_at_utc_midnight(archive: Path) -> None:
    """A record at T accounts for (T - 10 s, T]: the one at midnight sharp closes the day
    before (though the archive files it under the new day), and a period that starts at
    midnight leaves it out."""
    d = read_archive(_req(), archive)
    assert sorted(d.days) == ["2026-11-02", "2026-11-03"]
    before, after = d.days["2026-11-02"], d.days["2026-11-03"]
    # intervals ending -20, -10 and 0 s; then 10, 20, 30 s
    assert before[0][ALICE_O].charged_gpu_seconds == 3 * 1.5 * E
    assert after[0][ALICE_O].charged_gpu_seconds == 3 * 1.5 * E
    assert (before[1].gpu_seconds, after[1].gpu_seconds) == (3 * 4 * E, 3 * 4 * E)
    only_after = read_archive(_req(start=DAY), archive)
    assert only_after.usage[ALICE_O, MODEL].charged_gpu_seconds == 3 * 1.5 * E
    until_midnight = read_archive(_req(end=DAY), archive)
    assert until_midnight.usage[ALICE_O, MODEL].charged_gpu_seconds == 3 * 1.5 * E


def test_simulated_records_are_counted_and_excluded_unless_asked(archive: Path) -> None:
    """Simulated usage records are left out and counted; --include-simulated bills them."""
    _, sim = _runs()
    usage = sum(1 for raw in sim if orjson.loads(raw)["kind"] in ("gpu", "process",
                                                                   "unattributed"))
    d = read_archive(_req(), archive)
    assert d.simulated_excluded == usage > 0
    assert d.simulated_included is False
    with_sim = read_archive(_req(include_simulated=True), archive)
    assert with_sim.simulated_excluded == 0 and with_sim.simulated_included
    mallory = with_sim.usage[("mallory", "nlp"), MODEL]
    assert mallory.used_gpu_seconds == N * E and mallory.energy_joules == N * 700
    assert with_sim.fleet[MODEL].gpu_seconds == 5 * N * E


def test_inputs_and_queries_name_every_part_with_its_sha256(archive: Path) -> None:
    """The manifest's inputs: every part used with its SHA-256 and every seal with its
    digest; its queries say which parts were billed from their seal and which read."""
    import hashlib

    d = read_archive(_req(), archive)
    files = sorted(p for p in archive.iterdir() if p.name.startswith("gpu-audit_"))
    for p in files:
        assert d.inputs[p.name] == hashlib.sha256(p.read_bytes()).hexdigest()
    # unkeyed: no seal proves its sums by itself, so every part is read
    assert d.queries == [
        f"archive part {NODE}2026-11-02.jsonl.gz (records)",
        f"archive part {NODE}2026-11-03.1.jsonl (records)",
        "archive part gpu-audit_sim-node_sim_2026-11-02.jsonl.gz (records)",
        "archive part gpu-audit_sim-node_sim_2026-11-03.1.jsonl (records)"]


def _flip_gpu_seconds(lines: list[bytes]) -> list[bytes]:
    for i, line in enumerate(lines):
        if b'"kind":"process"' in line and b'"gpu_seconds":10.0' in line:
            lines[i] = line.replace(b'"gpu_seconds":10.0', b'"gpu_seconds":90.0', 1)
            return lines
    raise AssertionError("no process record to tamper with")


def _delete_a_usage_line(lines: list[bytes]) -> list[bytes]:
    i = next(i for i, line in enumerate(lines) if b'"kind":"unattributed"' in line)
    return lines[:i] + lines[i + 1:]


@pytest.mark.parametrize(
    ("edit", "kind"), [(_flip_gpu_seconds, "modified"), (_delete_a_usage_line, "gap")])
def test_a_tampered_archive_is_refused_naming_the_problem(
    archive: Path, edit: object, kind: str
) -> None:
    """A sealed part changed: its digest no longer matches, so it is read record by record
    and the edit (or the gap) is named with its line."""
    part = archive / (NODE + "2026-11-02.jsonl.gz")
    rewrite_part(part, edit)
    with pytest.raises(ArchiveRefused) as exc:
        read_archive(_req(), archive)
    msg = str(exc.value)
    assert "hash chain does not verify" in msg and "--allow-unverified" in msg
    assert "part_digest" in msg
    assert f": {kind}:" in msg and f"{NODE}2026-11-02.jsonl.gz line" in msg


def test_allow_unverified_bills_a_tampered_archive_marked_unverified(archive: Path) -> None:
    rewrite_part(archive / (NODE + "2026-11-03.1.jsonl"), _flip_gpu_seconds)
    d = read_archive(_req(allow_unverified=True), archive)
    assert d.verified is False
    assert any(": modified:" in p for p in d.verification_problems)
    # the tampered record is what is billed: alice's first interval after midnight
    # became 90 s of use on GPU 0
    assert d.usage[ALICE_O, MODEL].used_gpu_seconds == 2 * N * E + 80


def test_a_wrong_hmac_key_refuses_every_record(tmp_path: Path) -> None:
    keyfile = tmp_path / "k"
    keyfile.write_bytes(b"right-key\n")
    d = tmp_path / "a"
    d.mkdir()
    write_archive(d, produce(_snaps(), host="n", start_s=DAY_S - 40, stop_s=DAY_S + 40,
                             key_file=keyfile), seal_key=b"right-key")
    assert read_archive(_req(), d, key=b"right-key").verified is True
    with pytest.raises(ArchiveRefused, match="modified"):
        read_archive(_req(), d, key=b"wrong-key")


def test_no_part_or_no_usage_in_the_period_is_an_error_not_an_empty_bill(
    archive: Path, tmp_path: Path
) -> None:
    with pytest.raises(ArchiveRefused, match="no archive part"):
        read_archive(_req(start=DAY + dt.timedelta(days=5),
                          end=DAY + dt.timedelta(days=6)), archive)
    with pytest.raises(ArchiveRefused, match="not a directory"):
        read_archive(_req(), tmp_path / "missing")
    sim_only = tmp_path / "sim"
    sim_only.mkdir()
    write_archive(sim_only, _runs()[1])
    with pytest.raises(ArchiveRefused, match="all simulated"):
        read_archive(_req(), sim_only)


def test_a_mig_instance_gpu_record_adds_no_fleet_energy(tmp_path: Path) -> None:
    """A producer that wrote a MIG instance as a GPU of its own (uuid MIG-...) beside its
    parent: the parent's energy is counted once; the instance's processes still bill."""
    def snaps() -> list[Snapshot]:
        out = []
        for k in range(N + 1):
            parent = gpu(0, util=0.5, energy=1000.0 * k, power=100.0)
            inst = gpu(1, util=0.5, energy=1000.0 * k, power=100.0,
                       processes=[proc(101, sm=0.5, gi=1)])
            inst = replace(inst, info=replace(inst.info, uuid="MIG-11111111-2222"))
            out.append(snapshot(DAY_S - 30 + 10 * k, [parent, inst], {101: ALICE}, interval=E))
        return out
    d = tmp_path / "a"
    d.mkdir()
    write_archive(d, produce(snaps(), host="n", start_s=DAY_S - 40, stop_s=DAY_S + 40))
    data = read_archive(_req(), d)
    assert data.fleet[MODEL].energy_joules == N * 1000
    assert data.fleet[MODEL].gpu_seconds == N * E
    assert data.usage[ALICE_O, MODEL].used_gpu_seconds == N * E
    assert any("MIG instances" in n for n in data.notes)


def test_a_torn_last_line_of_the_newest_part_is_left_out(archive: Path) -> None:
    newest = archive / (NODE + "2026-11-03.1.jsonl")
    with newest.open("ab") as fh:
        fh.write(b'{"kind":"gpu","half a rec')
    assert read_archive(_req(), archive).verified is True
    older = archive / (NODE + "2026-11-02.jsonl.gz")
    data = gzip.decompress(older.read_bytes())
    older.write_bytes(gzip.compress(data + b'{"torn'))
    with pytest.raises(ArchiveRefused, match="invalid_json"):
        read_archive(_req(), archive)


def test_sealed_rollups_bill_what_the_records_bill(tmp_path: Path) -> None:
    """Billing a sealed part from its rollup (keyed: its MAC proves it) gives the sums
    that reading its records gives (--verify-records reads them and checks the seal's
    sums)."""
    keyfile = tmp_path / "k"
    keyfile.write_bytes(b"k3y\n")
    archive = tmp_path / "a"
    real = produce(_snaps(), host="gpu-node-07", start_s=DAY_S - 40, stop_s=DAY_S + 40,
                   key_file=keyfile)
    write_archive(archive, real, seal_key=b"k3y")
    fast = read_archive(_req(), archive, key=b"k3y")
    slow = read_archive(_req(verify_records=True), archive, key=b"k3y")
    assert slow.verified is True

    def flat(d: SourceData) -> dict[object, object]:
        out: dict[object, object] = {k: astuple(u) for k, u in d.usage.items()}
        out.update({m: astuple(f) for m, f in d.fleet.items()})
        for day, (owners, f) in d.days.items():
            out[day] = astuple(f)
            out.update({(day, o): astuple(u) for o, u in owners.items()})
        return out

    a, b = flat(fast), flat(slow)
    assert a.keys() == b.keys()
    for k in a:
        assert b[k] == pytest.approx(a[k], rel=1e-12), k
    assert any("(sealed: its rollup)" in q for q in fast.queries)
    assert not any("(sealed: its rollup)" in q for q in slow.queries)


def test_a_line_deleted_from_the_open_part_is_a_gap(archive: Path) -> None:
    """The first line of the open part: the chain from the sealed part before it shows
    the record missing; without --allow-gaps no bill."""
    rewrite_part(archive / (NODE + "2026-11-03.1.jsonl"), lambda lines: lines[1:])
    with pytest.raises(ArchiveRefused, match=r": gap: seq \d+ missing"):
        read_archive(_req(), archive)
    d = read_archive(_req(allow_gaps=True), archive)
    assert d.completeness is not None and d.completeness.allowed and d.completeness.gaps
