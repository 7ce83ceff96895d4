"""A real Prometheus (the Debian package) scrapes `gpu-audit exporter --backend sim` and
answers queries on its metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netutil import bound_port, free_port, http_get
from tests.polling import wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus binary not installed (scripts/setup --test installs it)",
)


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = tmp_path / "exporter.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "exporter", "--backend", "sim",
             "--scenario", "busy", "--time-scale", "60", "--interval", "0.5",
             "--listen", "127.0.0.1:0", "--spool-dir", str(tmp_path / "spool")],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    try:
        url = f"http://127.0.0.1:{bound_port(log, proc)}"
        wait_for(lambda: http_get(url + "/readyz")[0] == 200, 30, "exporter /readyz")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def prometheus(tmp_path: Path, exporter: str) -> Iterator[str]:
    port = free_port()
    target = exporter.removeprefix("http://")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpu-audit\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, 60, "prometheus ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _query(prom: str, expr: str) -> list[dict[str, object]]:
    status, body = http_get(f"{prom}/api/v1/query?query={urllib.parse.quote(expr)}")
    assert status == 200, body
    result: list[dict[str, object]] = json.loads(body)["data"]["result"]
    return result


def test_prometheus_scrapes_the_simulated_exporter_and_answers_queries(prometheus: str) -> None:
    """Prometheus scrapes the exporter (target up), and queries on GPU, process and
    identity metrics return the simulated node's data, marked simulated."""
    wait_for(lambda: bool(_query(prometheus, 'up{job="gpu-audit"} == 1')), 60, "target up")
    wait_for(lambda: len(_query(prometheus, "gpu_utilization_ratio")) == 4, 60, "4 GPUs")
    info = _query(prometheus, "gpu_info")
    assert len(info) == 4
    assert all(s["metric"]["simulated"] == "true" for s in info)  # type: ignore[index]
    used = _query(prometheus, "sum(gpu_memory_used_bytes)")
    assert float(used[0]["value"][1]) > 0  # type: ignore[index]
    # a join on the identity info metric works: utilisation by GPU name
    joined = _query(prometheus, "gpu_utilization_ratio * on(uuid) group_left(name) gpu_info")
    assert len(joined) == 4 and all("name" in s["metric"] for s in joined)  # type: ignore[operator]
    procs = _query(prometheus, "sum by (user, project, job) (gpu_process_memory_used_bytes)")
    assert procs and any(s["metric"].get("user") for s in procs)  # type: ignore[union-attr]
    energy = _query(prometheus, "gpu_energy_joules_total")
    assert energy and all(float(s["value"][1]) > 0 for s in energy)  # type: ignore[index]
    wait_for(lambda: bool(_query(prometheus, "rate(gpu_energy_joules_total[10s]) > 0")), 60,
             "energy counter increasing")
