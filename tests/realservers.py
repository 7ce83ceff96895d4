"""Real InfluxDB 1.x and VictoriaMetrics on loopback for the shipper's crash test and bench.

Each server runs from the test's temp dir on a free port and is stopped by its own pid.
`restart()` stops and starts the same server on the same port and data dir, which is
how the crash test takes a sink down and brings it back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.netutil import free_port, http_get, wait_for


class _Server:
    def __init__(self, argv: list[str], url: str, ping: str, log: Path) -> None:
        self.argv = argv
        self.url = url
        self._ping = ping
        self._log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: http_get(self.url + self._ping, 1.0)[0] in (200, 204), 30,
                 f"{self.argv[0]} at {self.url}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Influxd(_Server):
    database = "gpu_audit"

    def query(self, q: str) -> Any:
        data = urllib.parse.urlencode({"db": self.database, "q": q}).encode()
        with urllib.request.urlopen(self.url + "/query", data, timeout=30) as resp:
            return json.loads(resp.read())


def vm_flush(url: str) -> None:
    """Make just-written VictoriaMetrics samples searchable now."""
    with urllib.request.urlopen(url + "/internal/force_flush", timeout=30) as resp:
        resp.read()


class VictoriaMetrics(_Server):
    def export(self, match: str) -> list[dict[str, Any]]:
        """Every stored series matching a selector, with its raw samples."""
        vm_flush(self.url)
        q = urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(f"{self.url}/api/v1/export?{q}", timeout=60) as resp:
            return [json.loads(line) for line in resp.read().splitlines() if line.strip()]


def _need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} not installed (apt-get install influxdb victoria-metrics)")
    return path


@contextmanager
def influxd_server(tmp_path: Path) -> Iterator[Influxd]:
    binary = _need("influxd")
    root = tmp_path / "influxd"
    root.mkdir()
    port = free_port()
    conf = root / "influxdb.conf"
    conf.write_text(
        "reporting-disabled = true\n"
        f'bind-address = "127.0.0.1:{free_port()}"\n'
        f'[meta]\n  dir = "{root}/meta"\n'
        f'[data]\n  dir = "{root}/data"\n  wal-dir = "{root}/wal"\n'
        '  query-log-enabled = false\n  wal-fsync-delay = "0s"\n'
        f'[http]\n  bind-address = "127.0.0.1:{port}"\n  log-enabled = false\n'
        "  max-body-size = 0\n"
        "[monitor]\n  store-enabled = false\n"
        "[continuous_queries]\n  enabled = false\n"
    )
    server = Influxd([binary, "-config", str(conf)], f"http://127.0.0.1:{port}", "/ping",
                     root / "log.txt")
    server.start()
    try:
        server.query(f"CREATE DATABASE {server.database}")
        yield server
    finally:
        server.stop()


@contextmanager
def victoria_metrics_server(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    binary = _need("victoria-metrics")
    root = tmp_path / "vm"
    root.mkdir()
    port = free_port()
    argv = [
        binary,
        f"-storageDataPath={root}/data",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        # replays write the same sample again; dedup keeps one per series and millisecond,
        # which is how VictoriaMetrics is made idempotent for the shipper
        "-dedup.minScrapeInterval=1ms",
        "-search.disableCache",
        "-loggerLevel=ERROR",
    ]
    server = VictoriaMetrics(argv, f"http://127.0.0.1:{port}", "/health", root / "log.txt")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        if os.environ.get("KEEP_VM_DATA") is None:
            shutil.rmtree(root / "data", ignore_errors=True)
        time.sleep(0)
