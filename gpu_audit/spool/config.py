"""Configuration of the durable spool between producers and the shipper, and the places
derived from the spool directory when the configuration names none (the shipper's
dead-letter files, the default archive): defined once here, so the engine,
check-config and the docs cannot disagree about them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpu_audit.config_section import Section


class SpoolConfig(Section):
    directory: Path = Field(Path("/var/lib/gpu-audit/spool"), description="Spool directory.")
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096, description="Segment roll size.")
    max_bytes: int = Field(2 * 1024**3, ge=4096, description="Largest the spool may grow.")
    min_free_bytes: int = Field(
        512 * 1024 * 1024, ge=0, description="Stop accepting records below this free space."
    )
    fsync_window_ms: float = Field(
        50.0, ge=0, description="Group-commit window: records are acked after one fsync."
    )
    statvfs_interval_s: float = Field(
        1.0, gt=0, description="Free-space checks (statvfs) are cached for this long."
    )
    recovery_scan: Literal["tail", "full"] = Field(
        "tail",
        description="On open, CRC-check the last segment only (tail) or every segment (full). "
        "Corruption in older segments is always caught by readers and `spool verify`.",
    )
    when_full: Literal["refuse", "drop_oldest"] = Field(
        "refuse",
        description="refuse: new records are refused (counted by reason, alerted) until "
        "space returns, and nothing stored is touched; drop_oldest: the oldest whole "
        "segments are deleted, shipped or not, to make room (each eviction counted and "
        "logged, and seen by every sink as a counted gap).",
    )


def default_deadletter_dir(spool_dir: Path) -> Path:
    """`deadletter` inside the spool directory (shipper.deadletter_dir unset)."""
    return Path(spool_dir) / "deadletter"


def default_archive_dir(spool_dir: Path) -> Path:
    """`archive` beside the spool directory (same disk, outside the spool's own files),
    for an archive sink whose `directory` is unset."""
    return Path(spool_dir).parent / "archive"
