"""The exporter process's running state for `/status` and the periodic summary log line.

`runtime_status` gathers what the parts of one process report about themselves: the
sampling loop, the audit producer, the spool (size, free space, whether records are
refused, records held), and, when the app layer runs the shipper in this process (the
exporter's companion), each sink's position, lag and hold. `summary_line` turns that
into one log line. The shipper is read through its own `stats()` dict (passed in, never
imported), so the HTTP module only ever sees a plain dict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from exporter.sampler import Sampler


class _Producer(Protocol):
    def stats(self) -> Mapping[str, int]: ...

    def failed_by_reason(self) -> Mapping[str, int]: ...


class _Writer(Protocol):
    @property
    def next_offset(self) -> int: ...


class _Shipper(Protocol):
    def stats(self) -> dict[str, Any]: ...


def _free_bytes(directory: Path) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _spool_files(directory: Path) -> tuple[int, int]:
    size = segments = 0
    for seg in directory.glob("*.seg"):
        try:
            size += seg.stat().st_size
        except FileNotFoundError:
            continue  # deleted by GC between the listing and the stat
        segments += 1
    return size, segments


def runtime_status(*, sampler: Sampler | None, producer: _Producer | None,
                   spool_dir: Path | None, writer: _Writer | None,
                   shipper: _Shipper | None, spool_error: str = "") -> dict[str, Any]:
    """`sampler`, `audit`, `spool` and `shipper` sections (those that run here)."""
    out: dict[str, Any] = {}
    if sampler is not None:
        out["sampler"] = dict(sampler.counters())
    if producer is not None:
        stats = producer.stats()
        out["audit"] = {"records_written": stats["records_written"],
                        "records_failed": dict(producer.failed_by_reason()),
                        "last_seq": stats["last_seq"]}
    if spool_dir is not None:
        shipper_stats = shipper.stats() if shipper is not None else None
        spool: dict[str, Any] = {"directory": str(spool_dir)}
        if shipper_stats is not None:
            s = shipper_stats["spool"]
            spool.update(bytes=s["bytes"], segments=s["segments"], records=s["produced"],
                         refusing=s["full_reason"], gc_freed_bytes=s["gc_freed_bytes"])
        else:
            size, segments = _spool_files(spool_dir)
            spool.update(bytes=size, segments=segments,
                         records=writer.next_offset if writer is not None else None,
                         refusing=None)
        writable = bool(producer.stats()["spool_writable"]) if producer is not None else None
        if writable is False and not spool["refusing"]:
            failed = producer.failed_by_reason() if producer is not None else {}
            spool["refusing"] = spool_error or ", ".join(sorted(failed)) or "unavailable"
        spool["writable"] = writable
        spool["free_bytes"] = _free_bytes(spool_dir)
        out["spool"] = spool
        if shipper_stats is not None:
            out["shipper"] = {"sinks": shipper_stats["sinks"]}
    return out


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def summary_line(status: Mapping[str, Any]) -> str:
    """One line: cycles, records, spool state and every sink's lag."""
    parts: list[str] = []
    sampler = status.get("sampler")
    if sampler is not None:
        parts.append(f"{sampler['cycles']:.0f} cycles ({sampler['failed_cycles']:.0f} failed)")
    audit = status.get("audit")
    if audit is not None:
        failed = sum(audit["records_failed"].values())
        parts.append(f"{audit['records_written']} records written ({failed} not written)")
    spool = status.get("spool")
    if spool is not None:
        state = "writable" if spool["writable"] is not False else \
            f"REFUSING records ({spool['refusing']})"
        parts.append(f"spool {_size(spool['bytes'])} in {spool['segments']} segments, "
                     f"{_size(spool['free_bytes'])} free, {state}")
    sinks = status.get("shipper", {}).get("sinks", {})
    if sinks:
        lags = []
        for name, s in sorted(sinks.items()):
            text = f"{name} lag {s['lag_records']} records/{s['lag_seconds']:.0f}s"
            if s.get("blocked"):
                text += f" (held: {s['blocked']})"
            lags.append(text)
        parts.append("sinks: " + ", ".join(lags))
    return "running: " + "; ".join(parts)
