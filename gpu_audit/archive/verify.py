"""Verify an archive directory: its seals, its parts' digests and every record a seal
cannot answer for (one path for `audit verify` and chargeback: the seal rules are
`SeriesSeals`, the records' gpu_audit.audit.verify.Verifier).

Per host and stream (a series of parts, in part-number order):
- part numbers follow each other (a part missing from the middle is `missing_part`);
- a sealed part: its seal reads (`bad_seal`) and names this part; the part's SHA-256 is
  the one sealed (`part_digest`: changed after sealing); the seal's `prev_seal` is the
  previous part's seal's digest, zeros for the series' first (`seal_chain`: a part
  removed, replaced or reordered); with the trail's key its MAC matches (`seal_mac`); a
  closed part without a seal is `unsealed`;
- a seal is *authentic* when its MAC matches under the key: what it says is the key
  holder's word. Without a key none is;
- `fast`: a part with an authentic seal is followed from its seal alone (first seq and
  prev_hash against the last seq and hash of the part before; the seal's record count
  against its seq range); every other part is read as below;
- otherwise every record is verified (hash, chain, `foreign` records), what the records
  say is compared with the seal (`seal_mismatch`), and the seal's rollup, what a bill
  adds up, with the one the records give (`seal_rollup`) unless the seal is authentic
  (`rollups`: then too);
- `witness`: the archive holds every chain head Prometheus kept (gpu_audit.audit.witness);
- a damaged part (a truncated `.gz`) is `damaged_part`, naming the file and its last
  good line; verification goes on with the next part.

Legacy parts (archives written before parts were named by host and stream) are read
record by record first, in their order. Other JSON Lines files in the directory follow,
in name order.

This module only reads; it never repairs a part or a seal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.archive.layout import Part, list_parts, parse_name
from gpu_audit.archive.reader import PartLines
from gpu_audit.archive.rollup import Rollup
from gpu_audit.archive.seal import (
    SEAL_FORMAT_V1,
    ZERO_DIGEST,
    BadSeal,
    Seal,
    file_sha256,
    load,
)
from gpu_audit.audit.canonical import ZERO_HASH
from gpu_audit.audit.verify import (
    MAX_LISTED,
    Problem,
    StreamSummary,
    Verifier,
    VerifyReport,
    jsonl_lines,
)
from gpu_audit.audit.witness import Finding, Head
from gpu_audit.audit.witness import check as check_witness

RecordHook = Callable[[Part, dict[str, Any]], None]


@dataclass(slots=True)
class PartResult:
    """One part as verification saw it (from its records, or from its seal in fast mode)."""

    part: Part
    seal: Seal | None
    sealed_ok: bool  # a seal that reads, names this part and matches its digest
    records: int = 0
    first_seq: int | None = None
    first_prev_hash: str | None = None
    last_seq: int | None = None
    last_hash: str | None = None
    read: bool = False  # its records were read
    damaged: bool = False


def group_series(parts: list[Part]) -> tuple[list[Part], dict[tuple[str, str, str], list[Part]]]:
    """(legacy parts, series -> its parts in number order)."""
    legacy: list[Part] = []
    series: dict[tuple[str, str, str], list[Part]] = {}
    for p in parts:
        if p.legacy:
            legacy.append(p)
        else:
            series.setdefault(p.series, []).append(p)
    return legacy, series


def check_seal(v: Verifier, p: Part, *, hash_part: bool = True) -> tuple[Seal | None, bool]:
    """(the part's seal or None, whether it is one that reads, names the part and matches
    its digest); problems are reported to `v`. `hash_part=False`: the part's size is
    checked, not its SHA-256 (a report that uses only key-proven seals' sums, never the
    part's bytes, and must not read a half year of parts to say so)."""
    if not p.seal_path.exists():
        return None, False
    name = p.path.name
    try:
        s = load(p.seal_path)
    except BadSeal as exc:
        v.problem("bad_seal", p.seal_path.name, str(exc))
        return None, False
    ok = True
    if (s.host, s.stream, s.part) != (p.host, p.stream, name):
        v.problem("bad_seal", s.path.name,
                  f"it seals {s.part} of stream {s.stream} of host {s.host}, not {name}")
        ok = False
    if not hash_part:
        size = p.path.stat().st_size
        if size != s.part_bytes:
            v.problem("part_digest", name, f"{size} bytes, its seal says {s.part_bytes} "
                      "bytes: the part was changed after it was sealed")
            ok = False
        return s, ok
    sha, size = file_sha256(p.path)
    if (sha, size) != (s.part_sha256, s.part_bytes):
        v.problem("part_digest", name,
                  f"SHA-256 {sha} ({size} bytes), its seal says {s.part_sha256} "
                  f"({s.part_bytes} bytes): the part was changed after it was sealed")
        ok = False
    return s, ok


@dataclass(frozen=True, slots=True)
class SealVerdict:
    """What one part's seal is worth.

    `ok`: the seal reads, names the part and the part's bytes are the ones it sealed.
    `authentic`: `ok`, and its MAC checks under the trail's key, so everything it says
    (record count, first and last seq and hash, the rollup) is the key holder's word and
    may be used without reading the part. Without a key no seal is authentic: its claims
    must be checked against the part's records."""

    seal: Seal | None
    ok: bool
    authentic: bool


class SeriesSeals:
    """The archive rules of one host's stream, part after part, in part-number order: one
    code for `audit verify` and the bill, so both find the same problems.

    - `missing_part`: a part number skipped;
    - `bad_seal`, `part_digest`: check_seal;
    - `seal_mac` (keyed trail): a seal whose MAC does not match, or a `gpu-audit.seal/2`
      seal without one (a seal written under the key always carries one);
    - `seal_chain`: a seal's `prev_seal` is not the digest of the seal before it;
    - `unsealed`: a closed part without a seal (every part but the newest of its series,
      and a compressed one even when newest: the live part is never compressed);
    - `seal_rollup`, `seal_mismatch` (`rollup`, `compare`): the seal against its records.

    `prev_seal` None: the seal before the first part checked is not known (a bill starts
    at the part before its period), so the first `prev_seal` is not checked."""

    def __init__(self, v: Verifier, key: bytes | None, host: str, stream: str, *,
                 prev_seal: str | None = ZERO_DIGEST, number: int | None = None,
                 hash_parts: bool = True) -> None:
        self.v, self.key = v, key
        self.hash_parts = hash_parts
        self.chain = f"{stream}@{host}"
        self.prev_seal: str | None = prev_seal
        self.prev_sealed_part: str | None = None
        self.number = number

    def check(self, p: Part, *, newest: bool) -> SealVerdict:
        v, chain = self.v, self.chain
        if self.number is not None and p.number != self.number:
            v.problem("missing_part", p.path.name,
                      f"part(s) {self.number}..{p.number - 1} of this stream are not in the "
                      "archive before it", stream=chain)
        self.number = p.number + 1
        s, ok = check_seal(v, p, hash_part=self.hash_parts)
        if s is None:
            if p.seal_path.exists():  # a seal that does not read: bad_seal said so
                self.prev_seal = None
            elif not newest or p.compressed:
                v.problem("unsealed", p.path.name, "a closed part without a seal (the sink "
                          "seals it when it closes it, or on its next start)", stream=chain)
                self.prev_seal = None
            return SealVerdict(None, False, False)
        if self.prev_seal is not None and s.prev_seal != self.prev_seal:
            why = (f"the seal of {self.prev_sealed_part}" if self.prev_sealed_part is not None
                   else "no seal (it is the first of its stream here)"
                   if self.prev_seal == ZERO_DIGEST else "the seal before it")
            v.problem("seal_chain", s.path.name,
                      f"its prev_seal is {s.prev_seal[:16]}..., which is not {why}: a "
                      "part before it was removed, replaced or reordered", stream=chain)
        self.prev_seal, self.prev_sealed_part = s.digest, p.path.name
        authentic = False
        if self.key is not None:
            if s.mac is not None:
                authentic = s.authentic(self.key)
                if not authentic:
                    v.problem("seal_mac", s.path.name, "its MAC does not match under the key: "
                              "the seal was changed after it was written (or the key is not "
                              "the trail's)", stream=chain)
            elif s.format != SEAL_FORMAT_V1:
                v.problem("seal_mac", s.path.name, "it carries no MAC, but the trail is "
                          "keyed: a seal written under the key always carries one",
                          stream=chain)
        return SealVerdict(s, ok, authentic and ok)

    def rollup(self, s: Seal, sums: Rollup) -> None:
        """The seal's sums against the ones its part's records give."""
        if sums.finish().to_json() != dict(s.rollup_json):
            self.v.problem("seal_rollup", s.path.name, "the sums its seal carries are not "
                           "those of the part's records", stream=self.chain)


def read_part(v: Verifier, p: Part, *, expect: tuple[str, str] | None, live: bool,
              on_record: RecordHook | None = None, rollup: Rollup | None = None,
              ) -> PartResult:
    """Feed every line of a part to the verifier (and, parsed, to `on_record` and
    `rollup`: the sums its seal must carry)."""
    out = PartResult(p, None, False, read=True)
    reader = PartLines(p.path, p.compressed)
    before = v.report_.records
    name = p.path.name
    first = True
    loads = orjson.loads
    parse = on_record is not None or rollup is not None
    radd = rollup.add if rollup is not None else None
    feed = v.feed_line
    for number, lines in reader.chunks():
        for i, raw in enumerate(lines):
            if not raw:
                continue
            where = (name, number + i)
            feed(raw, where, expect)
            if first:
                if v.last_seq is not None:
                    out.first_seq, out.first_prev_hash = v.last_seq, v.last_prev
                first = False
            if parse:
                try:
                    rec = loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(rec, dict):
                    continue
                if radd is not None:
                    radd(rec)
                if on_record is not None:
                    on_record(p, rec)
    if reader.torn is not None and reader.torn.strip() and not (live and not p.compressed):
        # a torn line in a closed part is damage; in the live part it is being written
        v.feed(reader.torn, (name, reader.lines + 1), expect)
    if reader.damage is not None:
        v.problem("damaged_part", name, reader.where_damaged())
        out.damaged = True
    out.records = v.report_.records - before
    if out.records and v.last_seq is not None:
        out.last_seq, out.last_hash = v.last_seq, v.last_hash
    return out


def compare_seal(v: Verifier, r: PartResult, s: Seal) -> None:
    """What a seal says of its part's records against what reading them gave."""
    said = (s.records, s.first_seq, s.first_prev_hash, s.last_seq, s.last_hash)
    got = (r.records, r.first_seq, r.first_prev_hash, r.last_seq, r.last_hash)
    if said != got and not r.damaged:
        v.problem("seal_mismatch", r.part.path.name,
                  f"its seal says {s.records} record(s), seq {s.first_seq}..{s.last_seq}; "
                  f"the part holds {r.records}, seq {r.first_seq}..{r.last_seq}")


def follow_seal(v: Verifier, p: Part, s: Seal, prev: tuple[int, str] | None,
                complete: bool) -> None:
    """Fast mode: check a sealed part's place in its chain from its seal alone."""
    name = p.path.name
    chain = f"{p.stream}@{p.host}"
    first, last = s.first_seq, s.last_seq
    if first is None or last is None:
        return
    restart_at_first = any(seq == first for seq, _lo, _hi in s.restarts)
    if prev is None:
        if complete and first != 1 and not restart_at_first:
            v.problem("gap", name, f"seq 1..{first - 1} ({first - 1} records) not in the "
                      "archive before this part", stream=chain, seq=1)
    elif first != prev[0] + 1:
        kind = "gap" if first > prev[0] + 1 else "reordered"
        v.problem(kind, name, f"this part starts at seq {first}; the part before it "
                  f"ended at seq {prev[0]}", stream=chain, seq=first)
    elif s.first_prev_hash != prev[1] and not (
            restart_at_first and s.first_prev_hash == ZERO_HASH):
        v.problem("chain_break", name, f"its first record's prev_hash is not the hash of "
                  f"seq {prev[0]} (the last of the part before it)", stream=chain, seq=first)
    if s.records != last - first + 1 or s.unreadable:
        v.problem("gap", name, f"its seal says {s.records} record(s) for seq {first}..{last}"
                  f" and {s.unreadable} unreadable line(s)", stream=chain, seq=first)


def add_witness(report: VerifyReport, findings: list[Finding]) -> None:
    """The witness's findings (gpu_audit.audit.witness.check) as problems of a report."""
    for f in findings:
        report.counts[f.kind] += 1
        if len(report.problems) < MAX_LISTED:
            report.problems.append(Problem(f.kind, f.where, f.stream, f.seq, None, f.detail))


def verify_archive(directory: Path, key: bytes | None, *, fast: bool = False,
                   rollups: bool = False, workers: int = 1,
                   witness: list[Head] | None = None) -> VerifyReport:
    """Verify the archive in `directory` (see the module docstring); with `witness` (the
    heads Prometheus kept, gpu_audit.audit.witness) also that it holds each of them.

    `workers` > 1 verifies the series (independent chains) in that many processes, as
    `zcat | sha256sum` uses two; the report is the same (problems listed series by
    series). An archive with legacy parts is verified in one process (its chains may go
    on in the series)."""
    v = Verifier(hmac_key=key, complete=True, source=str(directory))
    parts = list_parts(directory)
    legacy, series = group_series(parts)
    newest = parts[-1] if parts else None
    for p in legacy:
        read_part(v, p, expect=None, live=p is newest and not series)
    from_seals: dict[str, StreamSummary] = {}
    if workers > 1 and len(series) > 1 and not legacy:
        out = _parallel(directory, key, series, fast=fast, rollups=rollups,
                        workers=workers)
        if witness is not None:
            add_witness(out, check_witness(directory, witness))
        return out
    for (_prefix, host, stream), sparts in series.items():
        _verify_series(v, host, stream, sparts, fast=fast, rollups=rollups,
                       from_seals=from_seals)
    _verify_others(v, _other_files(directory))
    report = v.report()
    # fast mode: what the seals say of a stream (the verifier read only unsealed parts)
    report.streams.update(from_seals)
    if witness is not None:
        add_witness(report, check_witness(directory, witness))
    return report


def _verify_group(key: bytes | None, group: list[list[Part]], fast: bool,
                  rollups: bool) -> VerifyReport:
    """A worker's share: whole series, one after another."""
    v = Verifier(hmac_key=key, complete=True)
    from_seals: dict[str, StreamSummary] = {}
    for sparts in group:
        _verify_series(v, sparts[0].host, sparts[0].stream, sparts, fast=fast,
                       rollups=rollups, from_seals=from_seals)
    report = v.report()
    report.streams.update(from_seals)
    return report


def _parallel(directory: Path, key: bytes | None,
              series: dict[tuple[str, str, str], list[Part]], *, fast: bool, rollups: bool,
              workers: int) -> VerifyReport:
    import multiprocessing  # noqa: PLC0415 - only with workers
    from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

    n = min(workers, len(series))
    # about equal bytes per worker, whole series each, in series order within a worker
    groups: list[list[list[Part]]] = [[] for _ in range(n)]
    load = [0] * n
    for sparts in sorted(series.values(), key=lambda ps: -sum(p.path.stat().st_size
                                                              for p in ps)):
        w = load.index(min(load))
        groups[w].append(sparts)
        load[w] += sum(p.path.stat().st_size for p in sparts)
    for g in groups:
        g.sort(key=lambda ps: ps[0].order)
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded parent
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        reports = list(pool.map(_verify_group, [key] * n, groups, [fast] * n,
                                [rollups] * n))
    out = VerifyReport(source=str(directory))
    listed: list[tuple[tuple[object, ...], Problem]] = []
    for g, r in zip(groups, reports, strict=True):
        out.records += r.records
        out.counts.update(r.counts)
        out.streams.update(r.streams)
        listed += [(g[0][0].order, p) for p in r.problems]
    listed.sort(key=lambda t: t[0])
    out.problems = [p for _o, p in listed][:MAX_LISTED]
    others = _other_files(directory)
    if others:  # rare: JSON Lines files beside the parts, in this process
        v = Verifier(hmac_key=key, complete=True)
        _verify_others(v, others)
        r = v.report()
        out.records += r.records
        out.counts.update(r.counts)
        out.problems = (out.problems + r.problems)[:MAX_LISTED]
        out.streams.update(r.streams)
    return out


def _other_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir()
                  if p.name.endswith((".jsonl", ".jsonl.gz")) and not p.name.startswith(".")
                  and parse_name(p.name) is None)


def _verify_others(v: Verifier, others: list[Path]) -> None:
    for f in others:
        damage: list[str] = []
        for n, line_raw in jsonl_lines(f, damage):
            v.feed_line(line_raw, (f.name, n))
        for d in damage:
            v.problem("damaged_part", f.name, d)


def _verify_series(v: Verifier, host: str, stream: str, sparts: list[Part], *, fast: bool,
                   rollups: bool, from_seals: dict[str, StreamSummary]) -> None:
    """One series. Every part's seal is checked (SeriesSeals); a part whose seal is
    authentic is, with `fast`, followed from its seal alone; every other part is read
    record by record and its seal compared with its records, the rollup too unless the
    seal is authentic (what a bill adds up): without a key that is the only proof a
    seal's sums are the records'. `rollups`: authentic seals' sums recomputed too."""
    expect = (host, stream)
    chain = f"{stream}@{host}"
    number = sparts[0].number
    prev: tuple[int, str] | None = v.chain_end(host, stream)
    fast_summary: StreamSummary | None = None
    if number != 0 and prev is None:
        v.problem("missing_part", sparts[0].path.name,
                  f"parts 0..{number - 1} of stream {stream} of host {host} are not in the "
                  "archive", stream=chain)
    seals = SeriesSeals(v, v.hmac_key, host, stream, number=number)
    for i, p in enumerate(sparts):
        live = i == len(sparts) - 1
        verdict = seals.check(p, newest=live)
        s = verdict.seal
        if fast and s is not None and verdict.authentic:
            follow_seal(v, p, s, prev, complete=True)
            v.report_.records += s.records
            if s.last_seq is not None and s.last_hash is not None:
                prev = (s.last_seq, s.last_hash)
                if fast_summary is None:
                    fast_summary = StreamSummary(s.first_seq or 0, s.last_seq, 0)
                fast_summary.last_seq = s.last_seq
                fast_summary.records += s.records
            continue
        if prev is not None and v.chain_end(host, stream) != prev:
            v.continue_chain(host, stream, prev[0], prev[1], p.path.name)
        # an authentic seal's sums are the key holder's word; any other seal's are
        # recomputed from the records (the one costly check: every record parsed)
        sums = Rollup() if s is not None and (not verdict.authentic or rollups) else None
        r = read_part(v, p, expect=expect, live=live, rollup=sums)
        if s is not None:
            compare_seal(v, r, s)
            if sums is not None and not r.damaged:
                seals.rollup(s, sums)
        end = v.chain_end(host, stream)
        if end is not None:
            prev = end
        if fast_summary is not None and r.records:
            fast_summary.last_seq = max(fast_summary.last_seq, r.last_seq or 0)
            fast_summary.records += r.records
    v.forget(host, stream)  # its duplicate-id window: one stream's at a time in memory
    if fast_summary is not None:
        from_seals[chain] = fast_summary
