"""The runbooks and the alerts that ship agree, in the files a site deploys: every alert
of the committed alerts/rules/alerts.yaml and of the Kubernetes PrometheusRule links to a
docs/runbooks.md section that exists and says what to do, and every alert section of
docs/runbooks.md belongs to an alert that exists (no runbook for a removed alert).

tests/alerts/test_runbooks.py checks the renderings of the params files; this checks the
committed copies and the reverse direction.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
CATEGORIES = {"hardware", "waste", "leaks", "pipeline"}  # the grouping headings


def _sections() -> dict[str, str]:
    """`## Heading` -> its body, keyed by GitHub's anchor of the heading."""
    out: dict[str, str] = {}
    parts = re.split(r"^## +(.+)$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out[anchor] = body
    return out


def _alerts(groups: list[dict[str, Any]]) -> dict[str, str]:
    return {r["alert"]: r["annotations"]["runbook_url"]
            for g in groups for r in g["rules"] if "alert" in r}


def _shipped() -> dict[str, dict[str, str]]:
    rules = yaml.safe_load((ROOT / "alerts" / "rules" / "alerts.yaml").read_text())
    prom_rule = yaml.safe_load(
        (ROOT / "deploy" / "kubernetes" / "base" / "generated" / "prometheusrule.yaml")
        .read_text())
    return {"alerts/rules/alerts.yaml": _alerts(rules["groups"]),
            "PrometheusRule": _alerts(prom_rule["spec"]["groups"])}


def test_every_shipped_alert_links_to_a_runbook_that_says_what_to_do() -> None:
    """Each runbook_url is docs/runbooks.md#<alert>, the section exists and has an
    `Act:` step."""
    sections = _sections()
    problems = []
    for where, alerts in _shipped().items():
        assert alerts, f"{where}: no alerts found"
        for alert, url in alerts.items():
            page, _, anchor = url.rpartition("#")
            if not page.endswith("docs/runbooks.md") or anchor != alert.lower():
                problems.append(f"{where}: {alert} links to {url}")
            elif anchor not in sections:
                problems.append(f"{where}: {alert}: no section '## {alert}'")
            elif "Act:" not in sections[anchor]:
                problems.append(f"{where}: {alert}: its section has no 'Act:' step")
    assert not problems, "\n".join(problems)


def test_no_runbook_for_an_alert_that_does_not_exist() -> None:
    """Every `##` section other than the category headings names a shipped alert."""
    shipped = {a.lower() for alerts in _shipped().values() for a in alerts}
    orphans = sorted(set(_sections()) - shipped - CATEGORIES)
    assert not orphans, f"runbook sections without an alert: {orphans}"
