"""Configuration of the local archive sink (the default sink; no optional library)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpu_audit.spool.config import default_archive_dir
from shipper.sinks.build import OPTIONAL_NAME_PATTERN, SINK_NAME_PATTERN, SinkSection


class ArchiveSinkConfig(SinkSection):
    type: Literal["archive"]
    name: str = Field(default="", pattern=OPTIONAL_NAME_PATTERN,
                      description="Sink name (cursor name).")
    directory: Path | None = Field(
        default=None, description="Archive directory; default 'archive' beside the spool dir."
    )
    prefix: str = Field(
        default="gpu-audit", pattern=SINK_NAME_PATTERN,
        description="Files are <prefix>-YYYY-MM-DD[.N].jsonl[.gz] (the record's UTC day).",
    )
    max_file_bytes: int = Field(
        default=256 * 1024 * 1024, ge=4096, description="Rotate above this."
    )
    compress: bool = Field(default=True, description="gzip closed files to .jsonl.gz.")
    fsync: bool = Field(default=True, description="fsync lines and state before acknowledging.")

    def directory_for(self, spool_dir: Path) -> Path:
        """Where this sink writes: its directory, or 'archive' beside the spool."""
        return self.directory or default_archive_dir(spool_dir)

    def sink_arguments(self, spool_dir: Path) -> dict[str, object]:
        return {"directory": self.directory_for(spool_dir)}
