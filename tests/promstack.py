"""A real monitoring stack on loopback for end-to-end tests: simulated exporters,
Prometheus (with rule files and an Alertmanager), Alertmanager, and a webhook that
records what Alertmanager delivers.

Every server runs from the test's temp dir on a free port and is stopped by its own pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.netutil import free_port, http_get
from tests.polling import wait_for


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed (scripts/setup --test installs it)")
    return path


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 15 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Exporter:
    scenario: str
    target: str
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        stop(self.proc)


def start_exporter(tmp: Path, scenario: str, time_scale: float = 60,
                   interval: float = 1.0, env: dict[str, str] | None = None, *,
                   node: str | None = None, port: int | None = None) -> Exporter:
    """`gpu-audit exporter --backend sim` playing a scenario (a shipped name or a file;
    not yet ready: see wait_ready). `node` names its spool directory (with the GPU
    inventory in it) and log, by default the scenario's name: an exporter started again
    with the same node (and `port`) is the same node restarted."""
    node = node or scenario
    port = port or free_port()
    log = (tmp / f"exporter-{node}.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_audit_app.cli", "exporter", "--backend", "sim",
         "--scenario", scenario, "--time-scale", str(time_scale), "--interval", str(interval),
         "--listen", f"127.0.0.1:{port}", "--spool-dir", str(tmp / f"spool-{node}"),
         "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
    )
    return Exporter(node, f"127.0.0.1:{port}", proc)


def scenario_without_gpu(tmp: Path, scenario: str, index: int) -> Path:
    """The shipped scenario as the node looks after a restart once GPU `index` fell off
    the bus: that GPU is no longer enumerated (the others keep their UUIDs, and the
    indexes after it shift down, as NVML numbers what it finds), and the story's events
    are over. The name stays, so the exporter sees the same node (its GPU inventory)."""
    from exporter.sim.scenario import load_scenario, shipped_path

    data = yaml.safe_load(shipped_path(scenario).read_text())
    uuids = [g.info.uuid for g in load_scenario(scenario).gpus]
    if len(data["gpus"]) != 1:
        raise ValueError(f"{scenario}: one GPU group expected")
    group = data["gpus"][0]
    group["count"] = len(uuids) - 1
    group["uuids"] = [u for i, u in enumerate(uuids) if i != index]
    data.pop("events", None)
    path = tmp / f"{scenario}-without-gpu-{index}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait_ready(exporter: Exporter, timeout: float = 60) -> None:
    wait_for(lambda: http_get(f"http://{exporter.target}/readyz")[0] == 200, timeout,
             f"exporter {exporter.scenario} /readyz")


@dataclass
class Webhook:
    """An HTTP server that keeps every Alertmanager notification, by path."""

    url: str
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def notifications(self, receiver: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [body for path, body in self.received
                    if receiver is None or path == f"/{receiver}"]


@contextmanager
def webhook() -> Iterator[Webhook]:
    port = free_port()
    hook = Webhook(f"http://127.0.0.1:{port}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with hook.lock:
                hook.received.append((self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Alertmanager:
    url: str

    def alerts(self, filters: Sequence[str] = ()) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode([("filter", f) for f in filters])
        status, body = http_get(f"{self.url}/api/v2/alerts?{query}")
        assert status == 200, body
        result: list[dict[str, Any]] = json.loads(body)
        return result


@contextmanager
def alertmanager(tmp: Path, config: dict[str, Any]) -> Iterator[Alertmanager]:
    binary = need("prometheus-alertmanager")
    root = tmp / "alertmanager"
    root.mkdir()
    cfg = root / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    with (root / "log.txt").open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.path={root / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, 60, "alertmanager ready")
        yield Alertmanager(url)
    finally:
        stop(proc)


@dataclass
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        status, body = http_get(f"{self.url}/api/v1/query?query={urllib.parse.quote(expr)}")
        assert status == 200, body
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result


@contextmanager
def prometheus(tmp: Path, targets: Sequence[str], rule_files: Sequence[Path] = (),
               alertmanager_url: str | None = None, interval: str = "1s",
               ) -> Iterator[Prometheus]:
    """Prometheus scraping the exporters as job `gpu-audit` with `honor_labels: true`
    (the exporter's `job` label is the workload's, see alerts/README.md)."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": "gpu-audit", "honor_labels": True,
                            "static_configs": [{"targets": list(targets)}]}],
    }
    if alertmanager_url is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [alertmanager_url.removeprefix("http://")]}]}]}
    with prometheus_with_config(tmp, "prometheus", config) as prom:
        yield prom


@contextmanager
def prometheus_with_config(tmp: Path, name: str, config: dict[str, Any]
                           ) -> Iterator[Prometheus]:
    """A real Prometheus on a free loopback port with this configuration, in tmp/name."""
    binary = need("prometheus")
    root = tmp / name
    root.mkdir()
    cfg = root / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    port = free_port()
    with (root / "log.txt").open("wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(url + "/-/ready")[0] == 200, 60, f"{name} ready")
        yield Prometheus(url)
    finally:
        stop(proc)
