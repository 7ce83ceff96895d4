"""One alerting rule, and how it becomes the dict Prometheus reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from alerts.params import Params

Severity = Literal["critical", "warning", "info"]
Category = Literal["hardware", "waste", "leak", "pipeline"]


_ZERO = ("0s", "0m", "0h")


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: Severity
    category: Category
    summary: str
    description: str
    keep_firing_for: str = "0s"
    """How long the alert stays firing once its condition stops holding, so a missed
    scrape or an exporter restart does not resolve it and page again (Prometheus 2.42)."""

    def to_rule(self, p: Params) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ not in _ZERO:
            rule["for"] = self.for_
        if self.keep_firing_for not in _ZERO:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = {"severity": self.severity, "category": self.category}
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": runbook_url(p, self.name),
        }
        return rule


def runbook_url(p: Params, alert: str) -> str:
    """The alert's section of docs/runbooks.md (a `## AlertName` heading's anchor)."""
    return f"{p.runbook_base_url}#{alert.lower()}"
