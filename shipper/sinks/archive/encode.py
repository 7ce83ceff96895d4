"""What the archive sink writes for a record: one JSON Lines line, the exact spooled
bytes plus "\\n", so `audit verify` re-checks the hash chain on the archive itself; the
host and stream whose chain it belongs to (they name its part); and the UTC day the line
belongs to, from the record's own time. Pure; no I/O.

A record that cannot be one line of its day is refused here with the reason (a dead
letter), never written half or changed.
"""

from __future__ import annotations

import datetime as dt

from gpu_audit.archive import day_of
from gpu_audit.errors import GpuAuditError
from shipper.sinks.base import SinkRecord


class NotArchivable(GpuAuditError, ValueError):
    """This record cannot be an archive line; the message is the dead-letter reason."""


def archive_line(rec: SinkRecord) -> tuple[str, str, dt.date, bytes]:
    """(the record's host, stream, UTC day, its line), or NotArchivable."""
    time_ns = rec.doc.get("time_ns")
    if not isinstance(time_ns, int) or isinstance(time_ns, bool):
        raise NotArchivable("record has no time_ns")
    host, stream = rec.doc.get("host"), rec.doc.get("stream")
    if not isinstance(host, str) or not host or not isinstance(stream, str) or not stream:
        raise NotArchivable("record has no host or stream (its chain; they name its part)")
    if b"\n" in rec.raw or b"\r" in rec.raw:
        raise NotArchivable("raw record spans lines; JSON Lines needs one")
    return host, stream, day_of(time_ns), rec.raw + b"\n"
