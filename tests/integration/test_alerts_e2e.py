"""End to end: the shipped alerts fire from simulated GPUs and reach the right receiver.

A real Prometheus (Debian package) evaluates the rules rendered from
alerts/params/fast.yaml over five `gpu-audit exporter --backend sim` processes playing
the shipped scenarios at `--time-scale 60` (one wall second is one scenario minute); a
real Alertmanager routes with the example configuration (alerts/alertmanager/
alertmanager.yml), its receivers pointed at a webhook in this test and its group waits
shortened to a second. The test proves:

- the idle (waste), leak, hot and xid alerts fire and reach the webhook through
  Alertmanager, with the right receiver and grouping, within a bounded time, labelled
  with the right GPU and owner; every scenario fires exactly its expected alerts;
- the healthy `busy` scenario fires nothing (no alert even pending) over the same run;
- hardware alerts name the owner of the GPU (user, project, job), a lost GPU's too;
- ECC and row-remap alerts follow their XID 48 within a few seconds, with the exporter's
  slow tier at its default 60 s (a memory XID re-reads them at once);
- a missed scrape (the xid node frozen past its scrape timeout, so Prometheus marks its
  series stale) and then an exporter restart in which the lost GPU is no longer
  enumerated resolve nothing: no "resolved" at the webhook for the node's hardware
  alerts, and GpuLost keeps its start time, its owner and its XID 79 after the restart;
- stopping an exporter fires GpuAuditExporterDown (to operations) and Alertmanager
  inhibits that node's waste alerts, which Prometheus still reports from their windows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.params import load_params
from alerts.render import write_rules
from exporter.sim.scenario import load_scenario
from tests.netutil import http_get
from tests.polling import wait_for
from tests.promstack import (
    Exporter,
    Prometheus,
    Webhook,
    alertmanager,
    need,
    prometheus,
    scenario_without_gpu,
    start_exporter,
    wait_ready,
    webhook,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("busy", "idle", "leak", "hot", "xid")
# no audit trail: this test is about metrics (the slow tier keeps its default 60 s, which
# is most of this test's run: ECC and row remapping must come from the memory XID)
EXPORTER_ENV = {"GPU_AUDIT__AUDIT__ENABLED": "false"}
DEADLINE_S = 120  # every expected alert delivered within this of the exporters being up
MEMORY_XID_LAG_S = 5  # ECC / remap alerts after XID 48: a fast cycle, a scrape, an eval
HOLD_S = 25  # after a disruption, watch this long (past keep_firing_for: 20s) for resolves
IVAN = (("user", "ivan"), ("job", "5150"))  # owner of every xid GPU (Slurm job 5150)
HENRY = (("user", "henry"), ("project", "diffusion"), ("job", "sd-ft-19"))

# What each scenario must fire, as (alertname, distinguishing labels); nothing else may
# fire on its node. From the scenario files' stories (exporter/sim/scenarios/).
EXPECTED: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {
    "busy": set(),
    "idle": {
        ("GpuHeldIdle", (("gpu", "1"), ("user", "dave"), ("project", "research-nlp"),
                         ("job", "jupyter-dave"))),
        ("GpuJobLowUtilization", (("user", "dave"), ("project", "research-nlp"),
                                  ("job", "jupyter-dave"))),
    },
    "leak": {
        ("GpuMemoryLeak", (("gpu", "0"), ("user", "frank"), ("project", "data-pipeline"),
                           ("job", "prep-311"))),
    },
    "hot": {
        ("GpuTemperatureHigh", (("gpu", "2"), *HENRY)),
        ("GpuThermalThrottling", (("gpu", "2"), ("reason", "sw_thermal_slowdown"), *HENRY)),
        ("GpuThermalThrottling", (("gpu", "2"), ("reason", "hw_thermal_slowdown"), *HENRY)),
    },
    "xid": {
        ("GpuXidError", (("gpu", "1"), ("xid", "13"), *IVAN)),
        ("GpuXidError", (("gpu", "3"), ("xid", "31"), *IVAN)),
        ("GpuXidCritical", (("gpu", "2"), ("xid", "48"), *IVAN)),
        ("GpuXidCritical", (("gpu", "1"), ("xid", "79"), *IVAN)),
        ("GpuEccUncorrectable", (("gpu", "2"), *IVAN)),
        ("GpuRowRemapPending", (("gpu", "2"), *IVAN)),
        ("GpuLost", (("gpu", "1"), *IVAN)),
    },
}
RECEIVER = {"hardware": "operations", "pipeline": "operations",
            "waste": "owners-finops", "leak": "owners-finops"}

pytestmark = pytest.mark.timeout(420)


def _am_config(hook: Webhook) -> dict[str, Any]:
    """The example configuration with its webhooks pointed at the test and its group
    waits shortened; routing tree, grouping and inhibition unchanged."""
    cfg: dict[str, Any] = yaml.safe_load(
        (ROOT / "alerts" / "alertmanager" / "alertmanager.yml").read_text())
    for receiver in cfg["receivers"]:
        for hook_cfg in receiver["webhook_configs"]:
            hook_cfg["url"] = f"{hook.url}/{receiver['name']}"
    for route in (cfg["route"], *cfg["route"]["routes"]):
        route["group_wait"] = "1s"
        route["group_interval"] = "1s"
    return cfg


def _key(labels: dict[str, str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """An alert's name and the labels EXPECTED distinguishes it by."""
    name = labels["alertname"]
    for want_name, want in EXPECTED[_SCENARIO_OF[labels.get("instance", "")]]:
        if want_name == name and all(labels.get(k) == v for k, v in want):
            return (name, want)
    return (name, tuple(sorted((k, v) for k, v in labels.items()
                               if k not in ("alertname", "alertstate", "instance"))))


_SCENARIO_OF: dict[str, str] = {}


def _delivered(hook: Webhook) -> dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]]:
    """Firing alerts the webhook got, by scenario; checks each went to its category's
    receiver, grouped as the example says."""
    out: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {s: set() for s in SCENARIOS}
    for note in hook.notifications():
        for alert in note["alerts"]:
            labels = alert["labels"]
            if alert["status"] != "firing" or labels.get("instance") not in _SCENARIO_OF:
                continue
            assert note["receiver"] == RECEIVER[labels["category"]], (note["receiver"], labels)
            if note["receiver"] == "owners-finops":
                assert note["groupLabels"] == {"project": labels["project"],
                                               "user": labels["user"]}, note["groupLabels"]
            else:
                assert note["groupLabels"] == {"alertname": labels["alertname"],
                                               "instance": labels["instance"]}
            out[_SCENARIO_OF[labels["instance"]]].add(_key(labels))
    return out


def _seconds(rfc3339: str) -> float:
    """Unix seconds of Prometheus' activeAt ("2026-01-02T03:04:05.123456789Z")."""
    text = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def _active(prom: Prometheus, instance: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], str]:
    """Alerts firing now on `instance`: (name, labels) -> activeAt (when it began)."""
    status, body = http_get(f"{prom.url}/api/v1/alerts")
    assert status == 200, body
    return {(a["labels"]["alertname"], tuple(sorted(a["labels"].items()))): a["activeAt"]
            for a in json.loads(body)["data"]["alerts"]
            if a["state"] == "firing" and a["labels"].get("instance") == instance}


def _resolved(hook: Webhook, instance: str, category: str = "hardware") -> list[str]:
    """Alerts of `category` on `instance` that Alertmanager ever reported resolved."""
    return sorted({a["labels"]["alertname"] for note in hook.notifications()
                   for a in note["alerts"] if a["status"] == "resolved"
                   and a["labels"].get("instance") == instance
                   and a["labels"].get("category") == category})


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[dict[str, Exporter], Any, Any, Webhook]]:
    need("prometheus")
    need("prometheus-alertmanager")
    rules = write_rules(load_params(ROOT / "alerts" / "params" / "fast.yaml"), "fast.yaml",
                        tmp_path / "rules")
    with ExitStack() as stack:
        exporters = {s: start_exporter(tmp_path, s, env=EXPORTER_ENV) for s in SCENARIOS}
        for exporter in exporters.values():
            # by name: the test replaces the xid exporter when it restarts it
            stack.callback(lambda s=exporter.scenario: exporters[s].stop())
        hook = stack.enter_context(webhook())
        am = stack.enter_context(alertmanager(tmp_path, _am_config(hook)))
        # every exporter answers before Prometheus' first scrape: a failed first scrape
        # would make GpuAuditExporterDown pending on the node that must stay silent
        for exporter in exporters.values():
            wait_ready(exporter)
        prom = stack.enter_context(prometheus(
            tmp_path, [e.target for e in exporters.values()], rules, am.url))
        _SCENARIO_OF.clear()
        _SCENARIO_OF.update({e.target: s for s, e in exporters.items()})
        yield exporters, prom, am, hook


def test_alerts_fire_route_and_inhibit_end_to_end(
        stack: tuple[dict[str, Exporter], Any, Any, Webhook], tmp_path: Path) -> None:
    """Each scenario's alerts reach the right receiver, grouped right, with the right
    GPU and owner, within DEADLINE_S; `busy` fires nothing; memory alerts follow XID 48
    within seconds; a missed scrape and a restart that loses GPU 1 from enumeration
    resolve no hardware alert; a stopped exporter fires GpuAuditExporterDown and
    inhibits its node's waste alerts."""
    exporters, prom, am, hook = stack
    started = time.monotonic()

    def all_delivered() -> bool:
        got = _delivered(hook)
        return all(EXPECTED[s] <= got[s] for s in SCENARIOS)

    try:
        wait_for(all_delivered, DEADLINE_S, "every expected alert at the webhook", step=1)
    finally:
        print(f"delivered after {time.monotonic() - started:.0f}s:", _delivered(hook))
    took = time.monotonic() - started

    # Exactly the expected alerts, on every node, over the whole run (pending included
    # for busy: the healthy node never even came close).
    ever = prom.query("max_over_time(ALERTS[10m])")
    fired: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {s: set() for s in SCENARIOS}
    for series in ever:
        labels = series["metric"]
        scenario = _SCENARIO_OF.get(labels.get("instance", ""))
        if labels == {"alertname": "GpuAuditExporterAbsent", "alertstate": "pending",
                      "category": "pipeline", "severity": "critical"}:
            continue  # Prometheus' first evaluations ran before its first scrape
        assert scenario is not None, f"an alert on no scenario's node: {labels}"
        if labels["alertstate"] == "firing" or scenario == "busy":
            fired[scenario].add(_key(labels))
    assert fired == EXPECTED
    assert _delivered(hook) == EXPECTED

    xid = exporters["xid"]
    before = _active(prom, xid.target)
    # The memory XID brings its ECC and row-remap alerts within a fast cycle or so.
    began = {name: at for (name, labels), at in before.items()}
    by_xid = {dict(labels).get("xid"): at for (name, labels), at in before.items()
              if name == "GpuXidCritical"}
    for name in ("GpuEccUncorrectable", "GpuRowRemapPending"):
        lag = _seconds(began[name]) - _seconds(by_xid["48"])
        expected = MEMORY_XID_LAG_S + (5 if name == "GpuRowRemapPending" else 0)  # for: 5s
        assert lag <= expected, f"{name} began {lag:.1f}s after XID 48"

    # A missed scrape: the xid node freezes past Prometheus' scrape timeout (1 s), so
    # its series go stale; nothing of its hardware may resolve.
    os.kill(xid.proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: bool(prom.query(f'up{{instance="{xid.target}"}} == 0')), 20,
                 "a failed scrape of the xid node", step=0.2)
    finally:
        os.kill(xid.proc.pid, signal.SIGCONT)
    time.sleep(HOLD_S)
    assert _resolved(hook, xid.target) == []
    assert {k: v for k, v in _active(prom, xid.target).items() if k in before} == before

    # An exporter restart in which the lost GPU 1 is no longer enumerated: its GPU
    # inventory reports it down still, so GpuLost goes on (same start, same owner) and
    # its XID 79 is still served.
    lost = next(k for k in before if k[0] == "GpuLost")
    xid.stop()
    exporters["xid"] = start_exporter(
        tmp_path, str(scenario_without_gpu(tmp_path, "xid", 1)), env=EXPORTER_ENV,
        node="xid", port=int(xid.target.rsplit(":", 1)[1]))
    wait_ready(exporters["xid"])
    time.sleep(HOLD_S)
    assert "GpuLost" not in _resolved(hook, xid.target)
    assert _active(prom, xid.target).get(lost) == before[lost], "GpuLost began again"
    uuid1 = load_scenario("xid").gpus[1].info.uuid
    assert prom.query(f'gpu_xid_errors_total{{instance="{xid.target}", uuid="{uuid1}", '
                      f'xid="79"}} == 1')
    print("memory XID, missed scrape and restart: no hardware alert resolved on the xid node")

    # Stop the idle node's exporter: the pipeline alert fires and reaches operations,
    # and the node's waste alerts, still firing in Prometheus from their windows, are
    # inhibited in Alertmanager.
    idle = exporters["idle"]
    idle.stop()
    stopped = time.monotonic()

    def down_delivered() -> bool:
        return any(a["labels"]["alertname"] == "GpuAuditExporterDown"
                   and a["labels"]["instance"] == idle.target and a["status"] == "firing"
                   for note in hook.notifications("operations") for a in note["alerts"])

    wait_for(down_delivered, 30, "GpuAuditExporterDown at the operations webhook", step=0.5)

    def waste_inhibited() -> bool:
        waste = am.alerts([f'instance="{idle.target}"', 'category="waste"'])
        return {a["labels"]["alertname"] for a in waste} == {
            "GpuHeldIdle", "GpuJobLowUtilization"} and all(
            a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]
            for a in waste)

    wait_for(waste_inhibited, 20, "the idle node's waste alerts inhibited", step=0.5)
    still = prom.query(f'ALERTS{{alertstate="firing",category="waste",'
                       f'instance="{idle.target}"}}')
    assert still, "the waste alerts ended before the inhibition could be seen"
    print(f"alerts delivered in {took:.0f}s; exporter down and inhibition seen "
          f"{time.monotonic() - stopped:.0f}s after the stop")
