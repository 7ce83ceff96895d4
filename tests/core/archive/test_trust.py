"""What "verified" means on an archive, attacked: forgeries of seals and records built
here, each caught by `audit verify` and refused by the bill (the same problem, found by
the same code: gpu_audit.archive.verify.SeriesSeals), keyed and unkeyed.

- a seal's rollup edited (charge moved from one owner to another), with and without the
  later seals' `prev_seal` recomputed: unkeyed, full verification and the bill recompute
  the sums from the records (`seal_rollup`); keyed, the seal's MAC fails (`seal_mac`),
  `--fast` included;
- a middle seal removed (`unsealed`), the newest sealed part's seal stripped and its
  records edited and re-hashed to the end (`unsealed`: a compressed part is closed);
- format 1 seals (written before the MAC) still verify and bill.
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import shutil
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chargeback.model import Request
from chargeback.sources.archive import ArchiveRefused, read_archive
from gpu_audit.archive import list_parts
from gpu_audit.archive.verify import verify_archive
from gpu_audit.audit.canonical import seal as chain_seal
from gpu_audit.model.snapshot import Snapshot
from gpu_audit_app.cli import main
from tests.chargeback.archives import produce, write_archive
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(120)

DAY = dt.datetime(2026, 11, 3, tzinfo=dt.UTC).timestamp()
E = 5.0
KEY = b"trail-key"
HOST = "gpu-node-01"


def _snaps(n: int, start: float) -> list[Snapshot]:
    owners = {101: ALICE, 102: BOB}
    return [snapshot(start + E * k, [
        gpu(0, util=0.9, energy=900.0 * k, power=180.0,
            processes=[proc(101, sm=0.6), proc(102, sm=0.3)])], owners, interval=E)
        for k in range(n)]


def _build(d: Path, key: bool, tmp: Path) -> None:
    keyfile = None
    if key:
        keyfile = tmp / "key"
        keyfile.write_bytes(KEY + b"\n")
    start = DAY - 1800
    n = 720  # an hour at 5 s, 60 s usage records
    trail = produce(_snaps(n, start), host=HOST, start_s=start - 1, stop_s=start + n * E,
                    interval_s=60.0, key_file=keyfile)
    write_archive(d, trail, max_file_bytes=8_192, seal_key=KEY if key else None)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    out = {}
    for key in (False, True):
        d = tmp_path_factory.mktemp("keyed" if key else "plain")
        _build(d / "a", key, d)
        out[key] = d / "a"
    return out


def _copy(pristine: dict[bool, Path], key: bool, tmp_path: Path) -> Path:
    d = tmp_path / "a"
    shutil.copytree(pristine[key], d)
    return d


def _k(key: bool) -> bytes | None:
    return KEY if key else None


def _req(**kw: object) -> Request:
    base: dict[str, object] = {
        "start": dt.datetime.fromtimestamp(DAY - 7200, dt.UTC),
        "end": dt.datetime.fromtimestamp(DAY + 7200, dt.UTC),
        "source": "archive", "config": None, "prometheus_url": None, "rates": None,
        "directory": None, "idle_policy": "none", "out": "out"}
    base.update(kw)
    return Request(**base)  # type: ignore[arg-type]


def _seals(d: Path) -> list[Path]:
    return [p.seal_path for p in list_parts(d) if p.seal_path.exists()]


def _rechain_seals(seals: list[Path], start: int) -> None:
    """Recompute `prev_seal` of every seal after `start` (what a forger without the key
    can do: the seal chain is then whole again)."""
    for i in range(start + 1, len(seals)):
        doc = orjson.loads(seals[i].read_bytes())
        doc["prev_seal"] = hashlib.sha256(seals[i - 1].read_bytes()).hexdigest()
        seals[i].write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n")


def _move_charge(seal_path: Path) -> None:
    """Move one holder's charged seconds to another in a seal's rollup (the victim pays
    less, the other more: the fleet total unchanged)."""
    doc = orjson.loads(seal_path.read_bytes())
    holders = doc["rollup"]["holders"]
    assert len(holders) >= 2, holders
    moved = holders[0][-5] * 0.25
    holders[0][-5] -= moved
    holders[1][-5] += moved
    seal_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n")


def _verdicts(d: Path, key: bool) -> tuple[set[str], set[str], str]:
    """(verify's problem kinds, --fast's, the bill's refusal text or "")."""
    full = set(verify_archive(d, _k(key)).counts)
    fast = set(verify_archive(d, _k(key), fast=True).counts)
    try:
        read_archive(_req(), d, key=_k(key))
        refusal = ""
    except ArchiveRefused as exc:
        refusal = str(exc)
    return full, fast, refusal


@pytest.mark.parametrize("key", [False, True], ids=["unkeyed", "keyed"])
def test_the_pristine_archive_verifies_and_bills(pristine: dict[bool, Path],
                                                 key: bool) -> None:
    d = pristine[key]
    assert len(_seals(d)) >= 4
    assert verify_archive(d, _k(key)).ok
    assert verify_archive(d, _k(key), fast=True).ok
    assert read_archive(_req(), d, key=_k(key)).verified is True


@pytest.mark.parametrize("key", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("which", ["newest", "middle"])
@pytest.mark.parametrize("rechain", [False, True], ids=["as-is", "prev_seal-recomputed"])
def test_a_forged_seal_rollup_is_caught_by_verify_and_the_bill(
        pristine: dict[bool, Path], tmp_path: Path, key: bool, which: str,
        rechain: bool) -> None:
    d = _copy(pristine, key, tmp_path)
    seals = _seals(d)
    at = len(seals) - 1 if which == "newest" else len(seals) // 2
    _move_charge(seals[at])
    if rechain:
        _rechain_seals(seals, at)
    full, fast, refusal = _verdicts(d, key)
    want = "seal_mac" if key else "seal_rollup"
    assert want in full
    assert want in refusal
    if key:  # only a key proves a seal without reading its part
        assert "seal_mac" in fast
    else:  # --fast reads every part of an unkeyed trail: no seal is authentic
        assert "seal_rollup" in fast
    with pytest.raises(ArchiveRefused):
        read_archive(_req(), d, key=_k(key))
    billed = read_archive(_req(allow_unverified=True), d, key=_k(key))
    assert billed.verified is False


def test_a_keyed_seal_forged_without_the_key_is_refused_even_by_a_keyless_reader(
        pristine: dict[bool, Path], tmp_path: Path) -> None:
    """Without the key a reader cannot check a MAC, so it trusts no seal: it reads the
    records, and the forged sums show as `seal_rollup` (the records' chain fails too:
    they are keyed)."""
    d = _copy(pristine, True, tmp_path)
    seals = _seals(d)
    _move_charge(seals[1])
    assert "seal_rollup" in verify_archive(d, None).counts


@pytest.mark.parametrize("key", [False, True], ids=["unkeyed", "keyed"])
def test_a_removed_middle_seal_is_unsealed_for_verify_and_the_bill(
        pristine: dict[bool, Path], tmp_path: Path, key: bool) -> None:
    d = _copy(pristine, key, tmp_path)
    seals = _seals(d)
    seals[len(seals) // 2].unlink()
    full, fast, refusal = _verdicts(d, key)
    assert "unsealed" in full and "unsealed" in fast
    assert "unsealed" in refusal


def _rehash_from(d: Path, part_index: int) -> None:
    """Edit the first usage record of part `part_index` (more charge for its holder) and
    re-hash every record from there to the end of the stream (unkeyed chain), rewriting
    the parts in place (their compression kept)."""
    parts = list_parts(d)
    prev: str | None = None
    edited = False
    for p in parts[part_index:]:
        raw = p.path.read_bytes()
        gz = p.compressed
        lines = (gzip.decompress(raw) if gz else raw).split(b"\n")
        out = []
        for line in lines:
            if not line:
                out.append(line)
                continue
            rec = orjson.loads(line)
            if prev is None:
                prev = rec["prev_hash"]
            if not edited and rec.get("kind") == "usage" and "c" in rec:
                rec["c"] = rec["c"] * 2
                edited = True
            out.append(chain_seal(rec, rec["seq"], prev, None))
            prev = rec["hash"]
        data = b"\n".join(out)
        p.path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    assert edited


def test_a_stripped_seal_and_rehashed_records_are_not_billed_as_verified(
        pristine: dict[bool, Path], tmp_path: Path) -> None:
    """The newest sealed part's seal stripped, a record in it edited and every record
    after it re-hashed (unkeyed: anyone can): the part is compressed, so it was closed,
    and a closed part without a seal is `unsealed` for verify and the bill alike."""
    d = _copy(pristine, False, tmp_path)
    parts = list_parts(d)
    newest_sealed = max(i for i, p in enumerate(parts) if p.seal_path.exists())
    parts[newest_sealed].seal_path.unlink()
    _rehash_from(d, newest_sealed)
    full, fast, refusal = _verdicts(d, False)
    assert full == {"unsealed"} and fast == {"unsealed"}
    assert "unsealed" in refusal


def test_format_1_seals_still_verify_and_bill(pristine: dict[bool, Path],
                                              tmp_path: Path) -> None:
    """Archives sealed before the MAC (gpu-audit.seal/1) stay readable: keyed, their seals
    are simply not authentic, so their parts are read and their sums recomputed."""
    d = _copy(pristine, True, tmp_path)
    seals = _seals(d)
    for s in seals:
        doc = orjson.loads(s.read_bytes())
        doc.pop("mac")
        doc["format"] = "gpu-audit.seal/1"
        s.write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n")
    _rechain_seals(seals, 0)
    assert verify_archive(d, KEY).ok
    bill = read_archive(_req(), d, key=KEY)
    assert bill.verified is True
    assert not any("(sealed: its rollup)" in q for q in bill.queries)
    # a keyed seal/2 without its MAC is a forgery (the sink always writes one under a key)
    doc = orjson.loads(seals[0].read_bytes())
    doc["format"] = "gpu-audit.seal/2"
    seals[0].write_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS) + b"\n")
    _rechain_seals(seals, 0)
    assert "seal_mac" in verify_archive(d, KEY).counts


def test_keyed_bill_uses_authentic_seals_and_fast_verify_counts_them(
        pristine: dict[bool, Path], capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """Keyed: the bill takes the sums of seals whose MAC checks without reading their
    parts; `audit verify --fast` counts their records (an all-sealed archive is not
    "no audit records")."""
    d = pristine[True]
    bill = read_archive(_req(), d, key=KEY)
    assert any("(sealed: its rollup)" in q for q in bill.queries)
    keyfile = tmp_path / "k"
    keyfile.write_bytes(KEY + b"\n")
    sealed = tmp_path / "sealed"
    shutil.copytree(d, sealed)
    for p in list_parts(sealed):  # keep only the sealed parts
        if not p.seal_path.exists():
            p.path.unlink()
    assert main(["audit", "verify", "--fast", "--hmac-key-file", str(keyfile),
                 str(sealed)]) == 0
    out = capsys.readouterr().out
    n = sum(orjson.loads(s.read_bytes())["records"] for s in _seals(sealed))
    assert f": {n} records in 1 stream(s): OK" in out
    # unkeyed: no seal is authentic, so --fast reads the sealed parts: the same count
    plain = tmp_path / "plain"
    shutil.copytree(pristine[False], plain)
    for p in list_parts(plain):
        if not p.seal_path.exists():
            p.path.unlink()
    assert main(["audit", "verify", "--fast", str(plain)]) == 0
    n = sum(orjson.loads(s.read_bytes())["records"] for s in _seals(plain))
    assert f": {n} records in 1 stream(s): OK" in capsys.readouterr().out


def _mutate(d: Path, target: str, op: str, at: float, other: str) -> None:
    path = d / target
    data = path.read_bytes()
    if op == "delete":
        path.unlink()
    elif op == "truncate":
        path.write_bytes(data[:int(len(data) * at)])
    elif op == "flip":
        i = min(len(data) - 1, int(len(data) * at))
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:])
    elif op == "replace":  # another file's bytes under this name
        path.write_bytes((d / other).read_bytes())
    elif op == "rollup" and target.endswith(".seal.json"):
        _move_charge(path)
    elif op == "rollup":
        path.write_bytes(data + data[-200:])  # appended bytes


@given(key=st.booleans(), index=st.integers(0, 10_000), other=st.integers(0, 10_000),
       op=st.sampled_from(["delete", "truncate", "flip", "replace", "rollup"]),
       at=st.floats(0.0, 0.999))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_single_file_change_fails_both_or_neither(
        pristine: dict[bool, Path], tmp_path_factory: pytest.TempPathFactory, *, key: bool,
        index: int, other: int, op: str, at: float) -> None:
    """One rule set: whatever one file of the archive becomes, `audit verify` and a bill
    of a period covering the whole archive agree on whether the trail verifies."""
    d = tmp_path_factory.mktemp("prop") / "a"
    shutil.copytree(pristine[key], d)
    files = sorted(p.name for p in d.iterdir() if p.name.startswith("gpu-audit_"))
    _mutate(d, files[index % len(files)], op, at, files[other % len(files)])
    verified = verify_archive(d, _k(key)).ok
    try:
        read_archive(_req(), d, key=_k(key))
        billed = True
    except ArchiveRefused:
        billed = False
    assert verified == billed, (files[index % len(files)], op, at)


def test_trusting_unkeyed_seals_is_fast_and_says_unverified(
        pristine: dict[bool, Path], tmp_path: Path) -> None:
    """--trust-unkeyed-seals: an unkeyed trail billed from its seals unread (the fast path
    a keyless site may choose), marked unverified with the reason, never "verified"; a
    forged rollup is then billed as forged, and the bill says it could not tell."""
    d = pristine[False]
    honest = read_archive(_req(trust_unkeyed_seals=True), d)
    assert any("(sealed: its rollup)" in q for q in honest.queries)
    assert honest.verified is False
    assert any("--trust-unkeyed-seals" in p for p in honest.verification_problems)
    forged = _copy(pristine, False, tmp_path)
    seals = _seals(forged)
    _move_charge(seals[1])
    _rechain_seals(seals, 1)
    bill = read_archive(_req(trust_unkeyed_seals=True), forged)
    assert bill.verified is False
    assert bill.usage != honest.usage  # what it could not check, it billed as written
