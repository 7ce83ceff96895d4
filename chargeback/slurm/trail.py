"""Reading audit records for the Slurm reports and bill: from a node's archive (the day
parts a time window touches) and its spool (what the shipper has not archived yet), or
from several trails at once, every record's hash chain checked as it is read.

A directory is a spool when it holds spool segments (gpu_audit.spool), else an archive
(gpu_audit.archive). The same record read from a spool and from the archive it was
shipped to is counted once (by stream, host and seq).

This module only reads; it never writes, deletes or "repairs" a trail, and never loads a
whole trail into memory (records are yielded as they are read).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.archive import list_parts, read_lines
from gpu_audit.archive.layout import day_of
from gpu_audit.audit.verify import Verifier
from gpu_audit.spool import SpoolReader
from gpu_audit.spool.format import SEGMENT_SUFFIX


def is_spool(directory: Path) -> bool:
    try:
        return any(p.suffix == SEGMENT_SUFFIX for p in directory.iterdir())
    except OSError:
        return False


def spool_records(directory: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(record, where) for every record still in a spool, in spool order."""
    with SpoolReader(directory) as reader:
        offset = 0
        while True:
            got = reader.read(offset, 4096)
            for off, raw in got.entries:
                try:
                    rec = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    yield rec, f"{directory} offset {off}"
            if got.next_offset == offset:
                return
            offset = got.next_offset


def archive_records(directory: Path, start_ns: int | None = None,
                    end_ns: int | None = None) -> Iterator[tuple[dict[str, Any], str]]:
    """(record, where) for the archive's records, only from the day parts a window
    touches when one is given; the newest part's unfinished last line is skipped."""
    parts = list_parts(directory)
    if start_ns is not None and end_ns is not None:
        # a day more at the end: older archives put a record at midnight sharp in the
        # next day's part
        first = day_of(start_ns)
        last = day_of(max(start_ns, end_ns)) + dt.timedelta(days=1)
        parts = [p for p in parts if first <= p.day <= last]
    for line in read_lines(directory, parts=parts):
        if not line.complete:
            continue
        try:
            rec = orjson.loads(line.raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            yield rec, line.where


@dataclass
class Trails:
    """Several trails read as one: each directory's records in order, duplicates (a
    record in both a spool and its archive) once, every chain verified."""

    directories: list[Path]
    key: bytes | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    problems: list[str] = field(default_factory=list)
    records: int = 0
    inputs: dict[str, str] = field(default_factory=dict)  # directory -> "spool"/"archive"

    def __iter__(self) -> Iterator[dict[str, Any]]:
        seen: set[tuple[str, str, int]] = set()
        for directory in self.directories:
            kind = "spool" if is_spool(directory) else "archive"
            self.inputs[str(directory)] = kind
            if kind == "archive" and not list_parts(directory):
                self.problems.append(f"{directory}: neither a spool nor an archive with parts")
                continue
            verifier = Verifier(hmac_key=self.key, complete=False)
            source: Iterable[tuple[dict[str, Any], str]] = (
                spool_records(directory) if kind == "spool"
                else archive_records(directory, self.start_ns, self.end_ns))
            for rec, where in source:
                verifier.feed(rec, where)
                mark = _chain_mark(rec)
                if mark is not None:
                    if mark in seen:
                        continue
                    seen.add(mark)
                self.records += 1
                yield rec
            self.problems += [f"{directory}: {p.render()}" for p in verifier.report().problems]


def _chain_mark(rec: Mapping[str, Any]) -> tuple[str, str, int] | None:
    stream, host, seq = rec.get("stream"), rec.get("host"), rec.get("seq")
    if isinstance(stream, str) and isinstance(host, str) and isinstance(seq, int):
        return stream, host, seq
    return None
