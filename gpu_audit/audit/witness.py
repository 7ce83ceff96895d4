"""The chain head's witness: how far each stream's hash chain had reached, kept by a
system other than the archive, and the check of an archive against it.

The producer publishes its head as the gauge `gpu_audit_audit_head{host, stream, part}`
(gpu_audit.audit.metrics): `part="seq"` is the seq of the newest record it wrote, and
`part="hash0"`, `"hash1"` the first 96 bits of that record's hash as two 48-bit
integers (a float64 holds them exactly). Prometheus scrapes and keeps it, so after the
records are archived it still knows a seq and hash the archive must hold.

`audit verify --witness URL` and the archive bill ask Prometheus's HTTP API for the head
as it was at a time (`heads`), and check the archive against every head (`check`):
- the archive holds a record of that host and stream with that seq
  (`witness_missing`: the newest records were cut off, or not archived yet);
- its hash starts with the witnessed 96 bits (`witness_mismatch`: the records from there
  on were replaced).

What it proves: the archive was not cut back before the witnessed head, and the chain up
to it is the one that was live (96 bits of a hash cannot be matched by rewriting). What
it does not: records after the newest scrape the witness kept (up to a scrape interval
plus the time asked about), a stream Prometheus never scraped, or a head Prometheus
itself lost (retention, a wiped TSDB); and an attacker who controls Prometheus too.

This module never writes: it reads Prometheus and the archive.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from gpu_audit.errors import GpuAuditError

HEAD_METRIC = "gpu_audit_audit_head"
HASH_PARTS = ("hash0", "hash1")  # 48 bits each: the first 24 hex digits of the hash
_WORD_HEX = 12


def hash_words(h: str) -> tuple[int, int]:
    """The published words of a record's hash."""
    return int(h[0:_WORD_HEX], 16), int(h[_WORD_HEX:2 * _WORD_HEX], 16)


@dataclass(frozen=True, slots=True)
class Head:
    """A stream's head as the witness kept it."""

    host: str
    stream: str
    seq: int
    words: tuple[int, int]
    at: float  # Unix seconds of the sample

    @property
    def prefix(self) -> str:
        return "".join(f"{w:0{_WORD_HEX}x}" for w in self.words)

    @property
    def name(self) -> str:
        return f"{self.stream}@{self.host}"


class WitnessUnavailable(GpuAuditError):
    """Prometheus could not be asked, or holds no head (the message says which)."""


def heads(url: str, at: float | None = None, *, timeout: float = 30.0) -> list[Head]:
    """Every stream's head Prometheus at `url` holds at time `at` (None: now): the newest
    sample within its lookback (5 minutes by default)."""
    params = {"query": HEAD_METRIC}
    if at is not None:
        params["time"] = f"{at:.3f}"
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as resp:  # noqa: S310 - the operator's URL
            body = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise WitnessUnavailable(f"witness {url}: cannot query {HEAD_METRIC}: {exc}") from None
    if body.get("status") != "success":
        raise WitnessUnavailable(f"witness {url}: {body.get('error', body)}")
    parts: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for row in body["data"]["result"]:
        labels = row.get("metric", {})
        host, stream, part = labels.get("host"), labels.get("stream"), labels.get("part")
        if not (host and stream and part):
            continue
        t, value = row["value"]
        parts.setdefault((host, stream), {})[part] = (float(t), float(value))
    out: list[Head] = []
    for (host, stream), p in sorted(parts.items()):
        if "seq" not in p or any(k not in p for k in HASH_PARTS):
            continue
        seq = int(p["seq"][1])
        if seq <= 0:
            continue  # nothing written yet
        out.append(Head(host, stream, seq, (int(p["hash0"][1]), int(p["hash1"][1])),
                        p["seq"][0]))
    if not out:
        raise WitnessUnavailable(f"witness {url}: no {HEAD_METRIC} sample"
                                 + (f" at {at:.0f}" if at is not None else "")
                                 + " (is Prometheus scraping the exporters?)")
    return out


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # witness_missing | witness_mismatch
    where: str
    stream: str
    seq: int
    detail: str


def find_hash(lines: Iterable[bytes], seq: int) -> str | None:
    """The hash of the record `seq` among a part's lines (None: not there)."""
    needle = f'"seq":{seq},'.encode()
    needle_end = f'"seq":{seq}}}'.encode()
    for raw in lines:
        if needle not in raw and needle_end not in raw:
            continue
        try:
            rec = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("seq") == seq and isinstance(rec.get("hash"), str):
            return str(rec["hash"])
    return None


def check(directory: Path, witnessed: list[Head]) -> list[Finding]:
    """The archive in `directory` against the witnessed heads."""
    # here, not at the top: the producer's metrics import this module, and the archive
    # modules import gpu_audit.audit
    from gpu_audit.archive.layout import list_parts  # noqa: PLC0415
    from gpu_audit.archive.reader import PartLines  # noqa: PLC0415
    from gpu_audit.archive.seal import BadSeal, load  # noqa: PLC0415

    parts = [p for p in list_parts(directory) if not p.legacy]
    out: list[Finding] = []
    for h in witnessed:
        mine = [p for p in parts if (p.host, p.stream) == (h.host, h.stream)]
        found: str | None = None
        where = str(directory)
        # newest first: the witnessed head is near the end; a seal's range says which
        # part can hold it (a wrong one only costs a read: the record itself decides)
        for p in reversed(mine):
            if p.seal_path.exists():
                try:
                    s = load(p.seal_path)
                except BadSeal:
                    s = None
                if (s is not None and s.first_seq is not None and s.last_seq is not None
                        and not s.first_seq <= h.seq <= s.last_seq):
                    continue
            reader = PartLines(p.path, p.compressed)
            found = find_hash((ln for _n, lines in reader.chunks() for ln in lines), h.seq)
            if found is not None:
                where = p.path.name
                break
        when = _when(h.at)
        if found is None:
            out.append(Finding(
                "witness_missing", where, h.name, h.seq,
                f"the witness saw seq {h.seq} (hash {h.prefix}...) at {when}; the archive "
                "holds no such record: the newest records were cut off (or not archived "
                "yet)"))
        elif not found.startswith(h.prefix):
            out.append(Finding(
                "witness_mismatch", where, h.name, h.seq,
                f"the witness saw seq {h.seq} with hash {h.prefix}... at {when}; the "
                f"archive's has {found[:24]}...: the records up to it were replaced"))
    return out


def _when(t: float) -> str:
    return dt.datetime.fromtimestamp(int(t), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
