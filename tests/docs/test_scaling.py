"""The Prometheus configurations of docs/SCALING.md are valid and do what the page says:
promtool accepts them, and run for real they remote-write to VictoriaMetrics (without the
simulated series) and federate the aggregates to a global Prometheus.

The snippets are read from the page (the fenced block after each
`<!-- checked: prometheus-config NAME -->`); the test replaces only addresses, rule-file
paths and intervals.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.netutil import http_get
from tests.polling import wait_for
from tests.promstack import (
    need,
    prometheus_with_config,
    start_exporter,
    wait_ready,
)
from tests.realservers import VictoriaMetrics, victoria_metrics_server

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "SCALING.md"
RULES_PREFIX = "/etc/prometheus/gpu-audit/"


def snippets() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8")
    found = re.findall(
        r"<!-- checked: prometheus-config (\w+) -->\n```yaml\n(.*?)```", text, re.S)
    return dict(found)


def _localised(snippet: str) -> dict[str, Any]:
    """The snippet with its rule files pointing at alerts/rules/ of this checkout."""
    config: dict[str, Any] = yaml.safe_load(
        snippet.replace(RULES_PREFIX, str(ROOT / "alerts" / "rules") + "/"))
    return config


def test_the_page_has_both_checked_snippets() -> None:
    """A renamed or dropped marker would silently skip the checks below."""
    assert set(snippets()) == {"cluster", "global"}


@pytest.mark.parametrize("name", ["cluster", "global"])
def test_promtool_accepts_the_snippet(tmp_path: Path, name: str) -> None:
    """`promtool check config` passes, with the rule files the snippet names (which must
    be the ones in alerts/rules/)."""
    promtool = need("promtool")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(_localised(snippets()[name])), encoding="utf-8")
    result = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _vm_series(vm: VictoriaMetrics, match: str) -> list[dict[str, Any]]:
    status, body = http_get(
        f"{vm.url}/api/v1/series?{urllib.parse.urlencode({'match[]': match})}", timeout=30)
    assert status == 200, body
    result: list[dict[str, Any]] = json.loads(body)["data"]
    return result


def test_remote_write_and_federation_run_as_documented(tmp_path: Path) -> None:
    """Cluster Prometheus (snippet 1) scrapes a simulator exporter and remote-writes to a
    real VictoriaMetrics with its cluster label, dropping every simulated series; the
    global Prometheus (snippet 2) federates gpu_up from it and not the per-process
    series."""
    exporter = start_exporter(tmp_path, "busy", time_scale=60, interval=1.0)
    try:
        wait_ready(exporter)
        with victoria_metrics_server(tmp_path) as vm:
            cluster = _localised(snippets()["cluster"])
            cluster["global"].update(scrape_interval="1s", evaluation_interval="1s")
            cluster["scrape_configs"][0]["static_configs"] = [{"targets": [exporter.target]}]
            cluster["remote_write"][0]["url"] = f"{vm.url}/api/v1/write"
            cluster["remote_write"][0]["queue_config"]["batch_send_deadline"] = "1s"
            with prometheus_with_config(tmp_path, "cluster", cluster) as node:
                glob = _localised(snippets()["global"])
                glob["global"]["scrape_interval"] = "1s"
                glob["scrape_configs"][0]["static_configs"] = [
                    {"targets": [node.url.removeprefix("http://")]}]
                with prometheus_with_config(tmp_path, "global", glob) as top:
                    wait_for(lambda: bool(node.query('gpu_up{simulated="true"}')), 60,
                             "the cluster Prometheus scraped the exporter")
                    wait_for(lambda: bool(_vm_series(
                        vm, '{__name__="gpu_audit_sample_duration_seconds",'
                            'cluster="gpu-a"}')), 60,
                             "remote-written self-metrics in VictoriaMetrics")
                    wait_for(lambda: bool(top.query('gpu_up{cluster="gpu-a"}')), 60,
                             "gpu_up federated to the global Prometheus")
                    # simulated series were scraped but never left the cluster
                    assert _vm_series(vm, '{simulated="true"}') == []
                    # only the matched series are federated
                    assert node.query("gpu_process_memory_used_bytes")
                    assert top.query("gpu_process_memory_used_bytes") == []
    finally:
        exporter.stop()
