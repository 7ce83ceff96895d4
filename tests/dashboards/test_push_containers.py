"""`gpu-audit dashboards push` and the provisioning files against a real Grafana and a
real Kibana (+ Elasticsearch) in containers (testcontainers). They need a Docker engine
and skip, saying so, where none answers; here the recorded contracts in test_push.py
stand in for them."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboards import build, kibana
from gpu_audit_app.cli import main
from tests.netutil import http_get
from tests.polling import wait_for
from tests.shipper.sinks.test_containers import _docker_reason

_REASON = _docker_reason()
pytestmark = [pytest.mark.docker, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

GRAFANA_IMAGE = "grafana/grafana:11.3.0"
ES_IMAGE = "docker.elastic.co/elasticsearch/elasticsearch:8.15.3"
KIBANA_IMAGE = "docker.elastic.co/kibana/kibana:8.15.3"
ROOT = Path(__file__).resolve().parents[2]
UIDS = sorted(m["uid"] for m in build.build_all().values())


def _get_json(url: str, auth: str | None = None) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def grafana_url() -> Iterator[str]:
    from testcontainers.core.container import DockerContainer

    with (DockerContainer(GRAFANA_IMAGE).with_exposed_ports(3000)
          .with_env("GF_SECURITY_ADMIN_PASSWORD", "admin")
          # the provisioning files exactly as shipped, mounted as the README says
          .with_volume_mapping(str(ROOT / "dashboards/provisioning/dashboards"),
                               "/etc/grafana/provisioning/dashboards")
          .with_volume_mapping(str(ROOT / "dashboards/grafana"),
                               "/var/lib/grafana/dashboards/gpu-audit")) as c:
        url = f"http://{c.get_container_host_ip()}:{c.get_exposed_port(3000)}"
        wait_for(lambda: http_get(url + "/api/health")[0] == 200, 120, "grafana health")
        yield url


def test_provisioned_dashboards_load_in_real_grafana(grafana_url: str) -> None:
    """The provider file loads every committed dashboard into the GPU folder."""
    auth = "Basic YWRtaW46YWRtaW4="  # admin:admin, the container's throwaway account
    wait_for(lambda: sorted(d["uid"] for d in _get_json(
        grafana_url + "/api/search?tag=gpu-audit", auth)) == UIDS, 60, "provisioned dashboards")


def test_push_overwrites_in_real_grafana(grafana_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pushing twice succeeds (overwrite by uid) and each dashboard lands in the folder."""
    monkeypatch.setenv("GRAFANA_USER", "admin")
    monkeypatch.setenv("GRAFANA_PASSWORD", "admin")
    for _ in range(2):
        assert main(["dashboards", "push", "--grafana", grafana_url,
                     "--grafana-folder-uid", "gpu-audit-pushed"]) == 0
    got = _get_json(grafana_url + "/api/dashboards/uid/gpu-audit-users",
                    "Basic YWRtaW46YWRtaW4=")
    assert got["meta"]["folderUid"] == "gpu-audit-pushed"
    assert got["dashboard"]["panels"] == build.build_all()["users"]["panels"]


@pytest.fixture(scope="module")
def kibana_url() -> Iterator[str]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network

    with Network() as net, (
            DockerContainer(ES_IMAGE).with_network(net).with_network_aliases("es")
            .with_env("discovery.type", "single-node")
            .with_env("xpack.security.enabled", "false")
            .with_env("ES_JAVA_OPTS", "-Xms512m -Xmx512m")), (
            DockerContainer(KIBANA_IMAGE).with_network(net).with_exposed_ports(5601)
            .with_env("ELASTICSEARCH_HOSTS", "http://es:9200")) as kb:
        url = f"http://{kb.get_container_host_ip()}:{kb.get_exposed_port(5601)}"
        wait_for(lambda: http_get(url + "/api/status")[0] == 200, 300, "kibana status")
        yield url


def test_push_imports_into_real_kibana(kibana_url: str) -> None:
    """The NDJSON imports cleanly (twice: overwrite) and the dashboard is readable."""
    for _ in range(2):
        assert main(["dashboards", "push", "--kibana", kibana_url]) == 0
    got = _get_json(kibana_url + "/api/saved_objects/dashboard/gpu-audit-usage")
    assert got["attributes"]["title"] == json.loads(
        kibana.NDJSON.read_text().splitlines()[-1])["attributes"]["title"]
