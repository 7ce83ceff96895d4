"""Configuration of audit record production."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpu_audit.config_section import Section


class AuditConfig(Section):
    enabled: bool = Field(True, description="Write audit records to the spool.")
    stream: str = Field(
        "exporter",
        min_length=1,
        max_length=128,
        description="Name of this producer's hash-chained stream.",
    )
    interval_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="How much time one usage record accounts for: the samples of this "
        "interval are added up into one record per GPU and holder (schema 3). A multiple "
        "of exporter.interval_seconds; left unset, 60 s rounded to the nearest multiple of "
        "it (the sampling interval itself when longer), said once in the log. Equal to it "
        "writes the per-cycle trail (schema 2, "
        "one gpu/process/unattributed record per sample). Events (process start/end, XID, "
        "GPU lost/recovered, exporter start/stop) are written when they happen.",
    )
    hmac_key_file: Path | None = Field(
        None, description="Key the hash chain with HMAC-SHA256 using the secret in this file."
    )
    max_elapsed_intervals: float = Field(
        3.0,
        gt=0,
        description="Cap on the time one record accounts for, in sample intervals, so a "
        "long pause (suspend, stopped exporter) never bills hours to one sample.",
    )
    state_directory: Path | None = Field(
        None,
        description="Where the producer keeps a small per-stream checkpoint (last seq, hash "
        "and spool offset) so the chain resumes after a restart even when the spool's last "
        "record belongs to another stream or its segments were already shipped and deleted. "
        "Unset: resume from the spool alone.",
    )
