"""Canary test: no secret ever reaches a log, at any level, from any library.

Every sink type is configured with distinctive canary secrets (InfluxDB 1.x both with
`auth: query`, where the password travels in the URL, and with the header; one sink with
a wrong password so the error paths log too), the shipper runs at DEBUG against the
in-process protocol servers, and every output is searched for every canary and its
encoded forms: the log records in-process, and the stderr and stdout of the real CLI.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from gpu_audit import logredact
from gpu_audit.spool import SpoolWriter
from gpu_audit_app.config import load_config
from shipper.engine import Shipper
from tests.netutil import bound_port, http_get
from tests.polling import wait_for
from tests.shipper.producer import chained
from tests.shipper.sinks.servers.forward import ForwardServer
from tests.shipper.sinks.servers.influx import InfluxServer
from tests.shipper.sinks.servers.search import SearchServer

# Distinctive, and with characters that URL encoding changes (the query form differs).
CANARIES = {
    "CANARY_ES_PW": "es-pw-Canary#7f3a!",
    "CANARY_ES_KEY": "es-key-Canary-91c2",
    "CANARY_OS_PW": "os-pw-Canary&5d0e",
    "CANARY_INFLUX_QUERY_PW": "ifq-pw-Canary/3b1d+",
    "CANARY_INFLUX_HEADER_PW": "ifh-pw-Canary-c4e8",
    "CANARY_INFLUX_WRONG_PW": "ifw-pw-Canary-0aa9",
    "CANARY_INFLUX_TOKEN": "if2-tok-Canary-8e67",
    "CANARY_FLUENT_KEY": "fl-key-Canary-2f4b",
    "CANARY_FLUENT_PW": "fl-pw-Canary-6d13",
}
HMAC_CANARY = "hmac-Canary-55ab"
USERS = {"CANARY_ES_PW": "esuser", "CANARY_OS_PW": "osuser",
         "CANARY_INFLUX_QUERY_PW": "ifquser", "CANARY_INFLUX_HEADER_PW": "ifhuser",
         "CANARY_INFLUX_WRONG_PW": "ifwuser", "CANARY_FLUENT_PW": "fluser"}


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def forbidden() -> dict[str, str]:
    """Every text that would betray a secret: the values, URL-quoted, base64, and the
    HTTP Basic credentials built from them."""
    out: dict[str, str] = {}
    for var, value in {**CANARIES, "HMAC": HMAC_CANARY}.items():
        out[var] = value
        out[f"{var} (url-quoted)"] = quote(value, safe="")
        out[f"{var} (base64)"] = base64.b64encode(value.encode()).decode()
        if var in USERS:
            out[f"{var} (basic)"] = _basic(USERS[var], value)
    return out


def assert_no_canary(text: str, where: str) -> None:
    leaks = sorted(name for name, secret in forbidden().items() if secret in text)
    assert not leaks, f"{where} shows secrets: {leaks}"


@dataclass
class Servers:
    es: SearchServer
    es_key: SearchServer
    opensearch: SearchServer
    influx_query: InfluxServer
    influx_header: InfluxServer
    influx_wrong: InfluxServer
    influx_v2: InfluxServer
    fluentd: ForwardServer

    def delivered(self) -> dict[str, bool]:
        return {
            "elasticsearch": bool(self.es.docs),
            "elasticsearch api_key": bool(self.es_key.docs),
            "opensearch": bool(self.opensearch.docs),
            "influxdb_v1 query": bool(self.influx_query.points),
            "influxdb_v1 header": bool(self.influx_header.points),
            "influxdb_v1 wrong password tried": any(
                path.startswith("/write") for _, path in self.influx_wrong.requests),
            "influxdb_v2": bool(self.influx_v2.points),
            "fluentd": bool(self.fluentd.events),
        }


@pytest.fixture
def servers() -> Iterator[Servers]:
    with ExitStack() as stack:
        es = stack.enter_context(SearchServer("elasticsearch"))
        es.basic = "Basic " + _basic("esuser", CANARIES["CANARY_ES_PW"])
        es_key = stack.enter_context(SearchServer("elasticsearch"))
        es_key.basic = "ApiKey " + CANARIES["CANARY_ES_KEY"]
        opensearch = stack.enter_context(SearchServer("opensearch"))
        opensearch.basic = "Basic " + _basic("osuser", CANARIES["CANARY_OS_PW"])
        influx_query = stack.enter_context(InfluxServer())
        influx_query.basic = ("ifquser", CANARIES["CANARY_INFLUX_QUERY_PW"])
        influx_header = stack.enter_context(InfluxServer())
        influx_header.basic = ("ifhuser", CANARIES["CANARY_INFLUX_HEADER_PW"])
        influx_wrong = stack.enter_context(InfluxServer())
        influx_wrong.basic = ("ifwuser", "the-right-password")
        influx_v2 = stack.enter_context(InfluxServer())
        influx_v2.token = CANARIES["CANARY_INFLUX_TOKEN"]
        fluentd = stack.enter_context(ForwardServer(
            shared_key=CANARIES["CANARY_FLUENT_KEY"],
            users={"fluser": CANARIES["CANARY_FLUENT_PW"]}))
        yield Servers(es, es_key, opensearch, influx_query, influx_header, influx_wrong,
                      influx_v2, fluentd)


def sinks(s: Servers, tmp: Path) -> list[dict[str, Any]]:
    return [
        {"type": "archive", "directory": str(tmp / "archive")},
        {"type": "elasticsearch", "name": "es", "hosts": [s.es.url], "username": "esuser",
         "password_env": "CANARY_ES_PW", "timeout_s": 5},
        {"type": "elasticsearch", "name": "es_key", "hosts": [s.es_key.url],
         "api_key_env": "CANARY_ES_KEY", "timeout_s": 5},
        {"type": "opensearch", "name": "os", "hosts": [s.opensearch.url], "username": "osuser",
         "password_env": "CANARY_OS_PW", "timeout_s": 5},
        {"type": "influxdb_v1", "name": "influx_query", "url": s.influx_query.url,
         "database": "audit", "username": "ifquser", "auth": "query",
         "password_env": "CANARY_INFLUX_QUERY_PW", "timeout_s": 5},
        {"type": "influxdb_v1", "name": "influx_header", "url": s.influx_header.url,
         "database": "audit", "username": "ifhuser", "auth": "basic",
         "password_env": "CANARY_INFLUX_HEADER_PW", "timeout_s": 5},
        {"type": "influxdb_v1", "name": "influx_wrong", "url": s.influx_wrong.url,
         "database": "audit", "username": "ifwuser", "auth": "query",
         "password_env": "CANARY_INFLUX_WRONG_PW", "timeout_s": 5},
        {"type": "influxdb_v2", "name": "influx_v2", "url": s.influx_v2.url, "org": "o",
         "bucket": "audit", "token_env": "CANARY_INFLUX_TOKEN", "timeout_s": 5},
        {"type": "fluentd", "name": "fluentd", "host": "127.0.0.1", "port": s.fluentd.port,
         "shared_key_env": "CANARY_FLUENT_KEY", "username": "fluser",
         "password_env": "CANARY_FLUENT_PW", "timeout_s": 5, "ack_timeout_s": 5},
    ]


def write_config(s: Servers, tmp: Path) -> Path:
    key = tmp / "hmac.key"
    key.write_text(HMAC_CANARY + "\n")
    doc = {
        "log_level": "debug",
        "exporter": {"backend": "sim", "scenario": "xid", "time_scale": 60,
                     "interval_seconds": 0.2},
        "audit": {"hmac_key_file": str(key)},
        "spool": {"directory": str(tmp / "spool"), "min_free_bytes": 0},
        "shipper": {"batch_max_wait_s": 0.05, "poll_interval_s": 0.05,
                    "backoff_base_s": 0.05, "backoff_cap_s": 0.2, "shutdown_grace_s": 3,
                    "sinks": sinks(s, tmp)},
    }
    path = tmp / "gpu-audit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def redaction_installed() -> Iterator[None]:
    """The process's logging as `gpu-audit` sets it up, undone afterwards."""
    factory = logging.getLogRecordFactory()
    logredact.setup_logging("debug")
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        logredact.forget_secrets()


def test_shipper_at_debug_logs_no_secret_of_any_sink(
        servers: Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, redaction_installed: None) -> None:
    """In-process: every sink type delivers at DEBUG (one fails auth), and no log record,
    message or traceback, shows any canary secret in any encoding."""
    for var, value in CANARIES.items():
        monkeypatch.setenv(var, value)
    caplog.set_level(logging.DEBUG)
    config = load_config(write_config(servers, tmp_path))
    writer = SpoolWriter(config.spool)
    shipper = Shipper(config.shipper, config.spool, writer=writer)
    try:
        writer.commit(chained(50, 1_790_000_000_000_000_000))
        shipper.start()
        wait_for(lambda: all(servers.delivered().values()), 30,
                 f"every sink to be tried: {servers.delivered()}")
    finally:
        shipper.stop(timeout=3)
        writer.close()
    assert any("urllib3" in r.name and "/write" in r.getMessage() for r in caplog.records), \
        "urllib3 request lines are logged at DEBUG (what this test guards)"
    formatter = logging.Formatter(logredact.LOG_FORMAT)
    assert_no_canary(caplog.text, "caplog text")
    for record in caplog.records:
        assert_no_canary(formatter.format(record), f"record from {record.name}")


def test_cli_run_at_debug_prints_no_secret(servers: Servers, tmp_path: Path) -> None:
    """The real `gpu-audit run --log-level debug` with every sink type (and an HMAC key):
    neither its stderr nor its stdout shows any canary secret in any encoding."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **CANARIES)
    out_log, err_log = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with out_log.open("ab") as out_file, err_log.open("ab") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_audit_app", "run", "--config",
             str(write_config(servers, tmp_path)), "--listen", "127.0.0.1:0",
             "--log-level", "debug"],
            stdout=out_file, stderr=err_file, env=env)
    try:
        port = bound_port(err_log, proc, 60)
        wait_for(lambda: proc.poll() is not None or all(servers.delivered().values()), 60,
                 f"every sink to be tried: {servers.delivered()}")
        assert proc.poll() is None, "gpu-audit run ended early"
        assert http_get(f"http://127.0.0.1:{port}/status")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    out, err = out_log.read_bytes(), err_log.read_bytes()
    stderr = err.decode(errors="replace")
    assert "urllib3.connectionpool" in stderr and "/write?" in stderr, stderr[-2000:]
    assert_no_canary(stderr, "stderr")
    assert_no_canary(out.decode(errors="replace"), "stdout")
