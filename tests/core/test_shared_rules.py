"""Each rule every component must apply alike is defined once, in gpu_audit.rules: the
idle threshold, the label sets, the recording rules a bill reads and the energy split. A
literal copy elsewhere (the threshold re-typed, a rule expression re-typed) fails here,
as does a shipped rule file that no longer holds the core's expressions."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from chargeback.sources.prometheus import RULES
from gpu_audit.rules import IDLE_UTILIZATION, bill_rules

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpu_audit", "gpu_audit_app", "exporter", "shipper", "alerts", "dashboards",
            "chargeback", "launcher")
HOME = ROOT / "gpu_audit" / "rules.py"
# fragments only a rule's own definition contains
RULE_FRAGMENTS = ("> bool 0) == 1", "gpu:gpu_held:bool and on (instance, uuid)",
                  "count by (instance, uuid, gpu_instance_id)")


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if p != HOME and "_podresources" not in p.parts]


def _idle_literals(tree: ast.AST) -> list[int]:
    """Lines where a name, field or keyword about idleness gets a number literal."""
    found = []
    for node in ast.walk(tree):
        pairs: list[tuple[str, ast.AST | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs = [(node.target.id, node.value)]
        elif isinstance(node, ast.keyword) and node.arg:
            pairs = [(node.arg, node.value)]
        for name, value in pairs:
            if "idle" in name.lower() and isinstance(value, ast.Constant) and isinstance(
                    value.value, float) and 0 < value.value < 1:
                found.append(node.lineno)
    return found


def test_no_copy_of_the_idle_threshold_or_a_bill_rule() -> None:
    copies = []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        copies += [f"{rel}:{line}: idle threshold as a literal"
                   for line in _idle_literals(ast.parse(text))]
        copies += [f"{rel}: re-typed rule expression ({frag!r})"
                   for frag in RULE_FRAGMENTS if frag in text]
        if "gpu_utilization_ratio" in text and f"< {IDLE_UTILIZATION}" in text:
            copies += [f"{rel}: idle threshold inside a PromQL string"]
    assert copies == []


def test_the_check_finds_a_copy() -> None:
    """The scanner itself: the copies the shared rules replaced would be found."""
    assert _idle_literals(ast.parse("IDLE_UTILIZATION = 0.05\n")) == [1]
    assert _idle_literals(ast.parse("f(idle_threshold=0.1)\n")) == [1]
    assert _idle_literals(ast.parse("x = 0.05\n")) == []


def test_the_bill_reads_the_shipped_rules() -> None:
    """chargeback's Prometheus source evaluates the core's expressions, and the shipped
    alerts/rules/recording.yaml (production params) holds exactly them."""
    assert bill_rules("{S}") == RULES
    shipped = {r["record"]: r["expr"] for r in yaml.safe_load(
        (ROOT / "alerts" / "rules" / "recording.yaml").read_text())["groups"][0]["rules"]}
    for record, expr in bill_rules('{simulated!="true"}').items():
        assert shipped[record].strip() == expr.strip(), record
