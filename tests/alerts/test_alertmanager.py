"""The example Alertmanager configuration is valid and routes every shipped alert by its
category: hardware and pipeline to operations, waste and leak to the owners/FinOps
receiver, grouped by project and user with a long repeat interval."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "alerts" / "alertmanager" / "alertmanager.yml"
RECEIVER = {"hardware": "operations", "pipeline": "operations",
            "waste": "owners-finops", "leak": "owners-finops"}


def _amtool() -> str:
    path = shutil.which("amtool")
    if path is None:
        pytest.skip("amtool not installed (apt-get install prometheus-alertmanager)")
    return path


def _routes_test(labels: dict[str, str], receiver: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_amtool(), "config", "routes", "test", f"--config.file={CONFIG}",
         f"--verify.receivers={receiver}", *(f"{k}={v}" for k, v in labels.items())],
        capture_output=True, text=True, check=False)


def test_amtool_check_config_accepts_the_example() -> None:
    """`amtool check-config` accepts the file: one route tree, two receivers, three
    inhibit rules."""
    res = subprocess.run([_amtool(), "check-config", str(CONFIG)], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout and "3 inhibit rules" in res.stdout


def test_every_shipped_alert_reaches_the_receiver_of_its_category() -> None:
    """`amtool config routes test` sends each alert of alerts/rules/alerts.yaml (its
    name and labels, plus an owner) to the receiver its category calls for."""
    rules = yaml.safe_load((ROOT / "alerts" / "rules" / "alerts.yaml").read_text())
    wrong = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            labels = {"alertname": rule["alert"], **rule["labels"], "instance": "n1:9945",
                      "user": "dave", "project": "nlp"}
            expected = RECEIVER[rule["labels"]["category"]]
            res = _routes_test(labels, expected)
            if res.returncode != 0:
                wrong.append(f"{rule['alert']}: expected {expected}, got {res.stdout.strip()}")
    assert not wrong, "\n".join(wrong)


def test_routes_test_notices_a_wrong_receiver() -> None:
    """The check above can fail: a waste alert is not routed to operations."""
    res = _routes_test({"alertname": "GpuHeldIdle", "category": "waste"}, "operations")
    assert res.returncode != 0
    assert "owners-finops" in res.stdout


def test_owner_route_groups_by_project_and_user_daily_and_inhibits_waste() -> None:
    """Waste and leak notifications are grouped by project and user and repeat at most
    daily; waste and leak are inhibited by a down exporter (same node), a missing
    exporter, and a lost GPU (same node and GPU)."""
    cfg = yaml.safe_load(CONFIG.read_text())
    owners = next(r for r in cfg["route"]["routes"] if r["receiver"] == "owners-finops")
    assert owners["group_by"] == ["project", "user"]
    assert owners["repeat_interval"] == "24h"
    inhibit = {(tuple(r["source_matchers"]), tuple(r.get("equal", [])))
               for r in cfg["inhibit_rules"]
               if r["target_matchers"] == ['category=~"waste|leak"']}
    assert inhibit == {
        (('alertname="GpuAuditExporterDown"',), ("instance",)),
        (('alertname="GpuAuditExporterAbsent"',), ()),
        (('alertname="GpuLost"',), ("instance", "uuid")),
    }
