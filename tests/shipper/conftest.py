"""Fixtures for shipper engine tests: a real spool in a temp dir and fast engine settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from tests.shipper.memsinks import record


@pytest.fixture
def spool_config(tmp_path: Path) -> SpoolConfig:
    return SpoolConfig(
        directory=tmp_path / "spool",
        segment_bytes=64 * 1024,
        max_bytes=256 * 1024 * 1024,
        min_free_bytes=0,
        fsync_window_ms=1,
    )


@pytest.fixture
def fast_config() -> ShipperConfig:
    return ShipperConfig(
        sinks=[],
        batch_max_records=100,
        batch_max_wait_s=0.01,
        poll_interval_s=0.01,
        backoff_base_s=0.01,
        backoff_cap_s=0.05,
        commit_interval_s=0,
        gc_interval_s=0.05,
        shutdown_grace_s=5,
    )


@pytest.fixture
def writer(spool_config: SpoolConfig) -> Iterator[SpoolWriter]:
    w = SpoolWriter(spool_config)
    yield w
    w.close()


def produce(writer: SpoolWriter, start: int, count: int, size: int = 0) -> None:
    """Commit records seq start..start+count-1 (durable when this returns)."""
    writer.commit([record(i, size=size) for i in range(start, start + count)])


