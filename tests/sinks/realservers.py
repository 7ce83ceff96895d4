"""Real InfluxDB 1.x and VictoriaMetrics servers for tests and benchmarks.

Plain context managers (usable outside pytest, e.g. by the shipper crash test and
bench/): each starts the Debian binary on a free loopback port with its data under the
given directory, waits until it answers, and stops it by its own pid. They raise
ServerUnavailable when the binary is missing, so callers can skip with that reason.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path


class ServerUnavailable(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerUnavailable(f"{url}: exited with {proc.returncode}: "
                                    f"{log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise ServerUnavailable(f"{url} did not answer within {timeout}s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def influxd_server(tmp_path: Path, db: str = "audit") -> Iterator[tuple[str, str]]:
    """InfluxDB 1.x (`influxd`) on a free port; yields (url, database), database created."""
    binary = shutil.which("influxd")
    if binary is None:
        raise ServerUnavailable("influxd not installed (apt-get install influxdb)")
    root = tmp_path / "influxd"
    root.mkdir(parents=True, exist_ok=True)
    port, bind_port = free_port(), free_port()
    conf = root / "influxdb.conf"
    conf.write_text(
        "reporting-disabled = true\n"
        f'bind-address = "127.0.0.1:{bind_port}"\n'
        f'[meta]\n  dir = "{root}/meta"\n'
        f'[data]\n  dir = "{root}/data"\n  wal-dir = "{root}/wal"\n'
        '  query-log-enabled = false\n'
        f'[http]\n  bind-address = "127.0.0.1:{port}"\n  log-enabled = false\n'
        '[monitor]\n  store-enabled = false\n'
        '[continuous_queries]\n  enabled = false\n'
    )
    log = root / "influxd.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, "-config", str(conf)], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/ping", proc, log)
        data = urllib.parse.urlencode({"q": f'CREATE DATABASE "{db}"'}).encode()
        with urllib.request.urlopen(url + "/query", data=data, timeout=10):
            pass
        yield url, db
    finally:
        _stop(proc)


@contextlib.contextmanager
def victoria_metrics_server(tmp_path: Path) -> Iterator[str]:
    """VictoriaMetrics single-node on a free port; yields its base URL."""
    binary = shutil.which("victoria-metrics")
    if binary is None:
        raise ServerUnavailable("victoria-metrics not installed (apt-get install "
                                "victoria-metrics)")
    root = tmp_path / "vm"
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = root / "vm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"-storageDataPath={root}/data", f"-httpListenAddr=127.0.0.1:{port}",
             "-loggerLevel=ERROR", "-search.latencyOffset=0s",
             # replays rewrite the same (series, timestamp): keep one sample, as InfluxDB does
             "-dedup.minScrapeInterval=1ms",
             # test records carry fixed past timestamps: keep them whatever their age
             "-retentionPeriod=100y"],
            stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/health", proc, log)
        yield url
    finally:
        _stop(proc)


def vm_flush(url: str) -> None:
    """Make just-written VictoriaMetrics samples searchable now."""
    with urllib.request.urlopen(url + "/internal/force_flush", timeout=10):
        pass
