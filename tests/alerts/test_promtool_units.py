"""promtool unit tests of the committed rules (alerts/unittests/*.yaml): recording-rule
values, and for every alert at production parameters a case where it fires (exact
labels and annotations) and one where it must not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "alerts" / "unittests"
RULES = ROOT / "alerts" / "rules"


def _unit_files() -> list[Path]:
    return sorted(UNITS.glob("*.yaml"))


def _alert_names() -> set[str]:
    data = yaml.safe_load((RULES / "alerts.yaml").read_text())
    return {r["alert"] for g in data["groups"] for r in g["rules"]}


def _alert_cases() -> list[dict[str, Any]]:
    cases = []
    for path in _unit_files():
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases += test.get("alert_rule_test", [])
    return cases


@pytest.mark.parametrize("path", _unit_files(), ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path: Path) -> None:
    """`promtool test rules` passes on each unit-test file."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    res = subprocess.run([promtool, "test", "rules", path.name], cwd=UNITS,
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    """Each alerting rule has at least one unit case where it fires, with its severity,
    category and every annotation spelled out, and one where it must stay silent."""
    cases = _alert_cases()
    problems = []
    for name in sorted(_alert_names()):
        mine = [c for c in cases if c["alertname"] == name]
        firing = [c for c in mine if c.get("exp_alerts")]
        if not firing:
            problems.append(f"{name}: no case where it fires")
        if not any(not c.get("exp_alerts") for c in mine):
            problems.append(f"{name}: no case where it must not fire")
        for case in firing:
            for alert in case["exp_alerts"]:
                if {"severity", "category"} - set(alert.get("exp_labels", {})):
                    problems.append(f"{name}: a firing case without severity/category")
                if {"summary", "description", "runbook_url"} - set(
                        alert.get("exp_annotations", {})):
                    problems.append(f"{name}: a firing case without every annotation")
    assert not problems, "\n".join(problems)
