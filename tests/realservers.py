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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.netutil import free_port, http_get, owns_listener
from tests.polling import wait_for

_ServerT = TypeVar("_ServerT", bound="_Server")


class PortLost(Exception):
    """The server exited before it listened: most likely another process took the port
    between free_port() and the bind (these servers cannot bind port 0 and report it)."""


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
        proc, port = self.proc, int(self.url.rsplit(":", 1)[1])

        def ours_answers() -> bool:
            if proc.poll() is not None:
                raise PortLost(f"{self.argv[0]} exited with {proc.returncode}: "
                               f"{self._log.read_text(errors='replace')[-1500:]}")
            # the ping must reach our process, not whoever else may hold the port
            return (owns_listener(proc.pid, port)
                    and http_get(self.url + self._ping, 1.0)[0] in (200, 204))

        wait_for(ours_answers, 30, f"{self.argv[0]} at {self.url}")

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


def _start_on_free_ports(make: Callable[[], _ServerT], attempts: int = 3) -> _ServerT:
    """Start the server `make()` builds (on newly chosen free ports each time), again
    when it lost its port to another process before binding."""
    for attempt in range(attempts):
        server = make()
        try:
            server.start()
            return server
        except PortLost:
            server.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextmanager
def influxd_server(tmp_path: Path) -> Iterator[Influxd]:
    binary = _need("influxd")
    root = tmp_path / "influxd"
    root.mkdir()

    def make() -> Influxd:
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
        return Influxd([binary, "-config", str(conf)], f"http://127.0.0.1:{port}", "/ping",
                       root / "log.txt")

    server = _start_on_free_ports(make)
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
    def make() -> VictoriaMetrics:
        port = free_port()
        argv = [
            binary,
            f"-storageDataPath={root}/data",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            # replays write the same sample again; dedup keeps one per series and
            # millisecond, which is how VictoriaMetrics is made idempotent for the shipper
            "-dedup.minScrapeInterval=1ms",
            "-search.disableCache",
            "-loggerLevel=ERROR",
        ]
        return VictoriaMetrics(argv, f"http://127.0.0.1:{port}", "/health", root / "log.txt")

    server = _start_on_free_ports(make)
    try:
        yield server
    finally:
        server.stop()
        if os.environ.get("KEEP_VM_DATA") is None:
            shutil.rmtree(root / "data", ignore_errors=True)
        time.sleep(0)
