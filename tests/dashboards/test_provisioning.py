"""The Grafana provisioning files are valid and match the dashboards and the shipper:
a default Prometheus datasource, audit-trail datasources on the shipper's index pattern,
time field and InfluxDB database, and a file provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import dashboards

PROV = Path(dashboards.__file__).resolve().parent / "provisioning"


def _load(rel: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((PROV / rel).read_text())
    assert data["apiVersion"] == 1
    return data


def test_prometheus_is_the_default_datasource() -> None:
    """One Prometheus, default, of the type the dashboards' datasource variable lists."""
    (ds,) = _load("datasources/prometheus.yaml")["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True and ds["uid"]


def test_audit_trail_datasources_follow_the_shipper_defaults() -> None:
    """Elasticsearch/OpenSearch on gpu-audit-* with time field `time`; InfluxDB on the
    gpu_audit database; uids unique."""
    sources = {d["type"]: d for d in _load("datasources/audit-trail.yaml")["datasources"]}
    assert sources["elasticsearch"]["jsonData"]["index"] == "gpu-audit-*"
    assert sources["elasticsearch"]["jsonData"]["timeField"] == "time"
    assert sources["grafana-opensearch-datasource"]["jsonData"]["database"] == "gpu-audit-*"
    assert sources["influxdb"]["jsonData"]["dbName"] == "gpu_audit"
    assert len({d["uid"] for d in sources.values()}) == 3


def test_dashboard_provider_loads_a_directory_into_a_folder() -> None:
    """A file provider with a folder uid and a path, UI edits not saved."""
    (provider,) = _load("dashboards/gpu-audit.yaml")["providers"]
    assert provider["type"] == "file" and provider["folderUid"] == "gpu-audit"
    assert provider["options"]["path"].startswith("/") and provider["allowUiUpdates"] is False
