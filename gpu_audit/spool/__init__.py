"""The durable spool: a segmented, checksummed, fsync'd log between producers and shipper.

Producers append audit records through `SpoolWriter`; the shipper reads them with
`SpoolReader` and keeps one committed position per sink in a `CursorStore`; the writer
deletes the segments below `gc_floor` of the configured sinks' cursors. The byte
format is the public contract described in docs/SPOOL.md.
"""

from gpu_audit.spool.config import SpoolConfig
from gpu_audit.spool.cursors import CursorStore, gc_floor
from gpu_audit.spool.errors import (
    CursorError,
    SpoolError,
    SpoolFull,
    SpoolLocked,
    SpoolWriteError,
)
from gpu_audit.spool.fsck import (
    SpoolReport,
    render_stats,
    spool_dir_problem,
    spool_stats,
    verify_spool,
)
from gpu_audit.spool.reader import ReadResult, SpoolReader
from gpu_audit.spool.writer import SpoolCounters, SpoolWriter

__all__ = [
    "CursorError",
    "CursorStore",
    "ReadResult",
    "SpoolConfig",
    "SpoolCounters",
    "SpoolError",
    "SpoolFull",
    "SpoolLocked",
    "SpoolReader",
    "SpoolReport",
    "SpoolWriteError",
    "SpoolWriter",
    "gc_floor",
    "render_stats",
    "spool_dir_problem",
    "spool_stats",
    "verify_spool",
]
