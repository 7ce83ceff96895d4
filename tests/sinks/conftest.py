"""Fixtures for the sink tests: real InfluxDB 1.x and VictoriaMetrics on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sinks.realservers import ServerUnavailable, influxd_server, victoria_metrics_server


@pytest.fixture
def influxd(tmp_path: Path) -> Iterator[tuple[str, str]]:
    try:
        with influxd_server(tmp_path) as server:
            yield server
    except ServerUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def victoria_metrics(tmp_path: Path) -> Iterator[str]:
    try:
        with victoria_metrics_server(tmp_path) as url:
            yield url
    except ServerUnavailable as exc:
        pytest.skip(str(exc))
