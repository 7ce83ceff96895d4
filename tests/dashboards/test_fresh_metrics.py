"""A freshly started, healthy node already serves every family the dashboards read:
counters with known label values are there at 0 from the first
scrape, not only once something has failed. The few families that exist only after an
event (an XID) are read only by panels that say why they are empty.

A real `gpu-audit run` (and `gpu-audit exporter`, which serves no shipper families)
plays the healthy busy scenario; its first /metrics after /readyz is scanned.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboards import build
from tests.dashboards import queries
from tests.netutil import free_port, http_get
from tests.polling import wait_for
from tests.promstack import stop

ROOT = Path(__file__).resolve().parents[2]
# families that cannot exist before their event: no XID has happened on a healthy node
# (their label values are XID codes, unknown in advance), and a sink has no time of its
# last delivery before its first one (a moment after the start)
AFTER_AN_EVENT = {"gpu_xid_errors_total", "gpu_xid_last_timestamp_seconds",
                  "gpu_audit_shipper_last_success_timestamp_seconds"}
# what the shipper serves (the spool and sinks): `gpu-audit exporter` alone has none
SHIPPER_FAMILIES = re.compile(r"^gpu_audit_(shipper_|spool_(bytes|segments|full|refused|"
                              r"evicted|corrupt)|records_produced)")


def _documented() -> set[str]:
    text = (ROOT / "docs" / "METRICS.md").read_text()
    return set(re.findall(r"^\| `([a-z_][a-z0-9_]*)` \|", text, re.M))


def _families_read() -> dict[str, set[tuple[str, str]]]:
    """family -> {(dashboard, panel)} for every exporter family a dashboard query reads."""
    documented = _documented()
    out: dict[str, set[tuple[str, str]]] = {}
    for name, model in build.build_all().items():
        for t in queries.targets(model):
            for token in set(re.findall(r"\b[a-z_][a-z0-9_]*\b", t.expr)):
                base = re.sub(r"_(bucket|sum|count)$", "", token)
                family = token if token in documented else base
                if family in documented:
                    out.setdefault(family, set()).add((name, t.panel))
    return out


def _no_value(dashboard: str, panel: str) -> str:
    model: dict[str, Any] = build.build_all()[dashboard]
    for p in model["panels"]:
        if p.get("title") == panel:
            return str(p.get("fieldConfig", {}).get("defaults", {}).get("noValue", ""))
    raise KeyError(panel)


def _fresh_scrape(tmp: Path, command: str) -> set[str]:
    """The families of the first /metrics a healthy busy node serves once ready."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_audit_app.cli", command, "--backend", "sim",
         "--scenario", "busy", "--listen", f"127.0.0.1:{port}", "--spool-dir",
         str(tmp / f"spool-{command}"), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=(tmp / f"{command}.log").open("wb"),
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_get(url + "/readyz")[0] == 200, 60, f"{command} ready")
        status, body = http_get(url + "/metrics")
        assert status == 200
    finally:
        stop(proc)
    # a family with no sample (prometheus_client writes its HELP and TYPE anyway) is no
    # data for a panel
    return {f.name + ("_total" if f.type == "counter" else "")
            for f in text_string_to_metric_families(body.decode()) if f.samples}


@pytest.mark.parametrize("command", ["run", "exporter"])
def test_a_fresh_healthy_node_serves_every_family_the_dashboards_read(
        tmp_path: Path, command: str) -> None:
    """Every family a panel reads is in the first scrape of a healthy node, except those
    that only an event creates (and, for `exporter` alone, the shipper's); each panel
    reading one of those says why it is empty instead of staying blank."""
    served = _fresh_scrape(tmp_path, command)
    read = _families_read()
    assert {"gpu_audit_records_failed_total", "gpu_audit_sample_errors_total",
            "gpu_up"} <= set(read)
    allowed = set(AFTER_AN_EVENT)
    if command == "exporter":
        allowed |= {f for f in read if SHIPPER_FAMILIES.match(f)}
    missing = sorted(f for f in read if f not in served and f not in allowed)
    assert missing == [], f"families the dashboards read, absent on a fresh node: {missing}"
    silent = sorted(f"{d}/{p} ({f})" for f in allowed if f not in served
                    for d, p in read.get(f, ()) if not _no_value(d, p))
    assert silent == [], f"panels on families a healthy node lacks, with no why: {silent}"
