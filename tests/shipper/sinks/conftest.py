"""Fixtures for the sink tests: real InfluxDB 1.x and VictoriaMetrics on loopback (the
same servers the shipper's crash test uses, from tests/realservers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.realservers import influxd_server, victoria_metrics_server


@pytest.fixture
def influxd(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with influxd_server(tmp_path) as server:
        yield server.url, server.database


@pytest.fixture
def victoria_metrics(tmp_path: Path) -> Iterator[str]:
    with victoria_metrics_server(tmp_path) as server:
        yield server.url
