"""Configuration of audit record production."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpu_audit.model_base import Section


class AuditConfig(Section):
    enabled: bool = Field(True, description="Write audit records to the spool.")
    stream: str = Field("exporter", description="Name of this producer's hash-chained stream.")
    hmac_key_file: Path | None = Field(
        None, description="Key the hash chain with HMAC-SHA256 using the secret in this file."
    )
