"""Shared helpers for the spool tests: a config factory and a read-everything helper."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_audit.spool import SpoolConfig, SpoolReader


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., SpoolConfig]:
    def make(**overrides: Any) -> SpoolConfig:
        fields: dict[str, Any] = {
            "directory": tmp_path / "spool",
            "segment_bytes": 64 * 1024,
            "min_free_bytes": 0,
            "fsync_window_ms": 0,
        }
        fields.update(overrides)
        return SpoolConfig(**fields)

    return make


def read_all(directory: Path, start: int = 0) -> tuple[list[tuple[int, bytes]], list[int]]:
    """Every readable record from `start` on, and every offset a read skipped to."""
    entries: list[tuple[int, bytes]] = []
    skips: list[int] = []
    with SpoolReader(directory) as reader:
        offset = start
        while True:
            result = reader.read(offset, max_records=97)
            if result.skipped_to is not None:
                skips.append(result.skipped_to)
            entries.extend(result.entries)
            if result.next_offset == offset and not result.entries:
                return entries, skips
            offset = result.next_offset
