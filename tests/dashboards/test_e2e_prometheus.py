"""End to end: every query of every dashboard panel and
every template-variable query, with its variables substituted, parses and returns data
from a real Prometheus scraping the simulator playing the scenarios that feed them, with
the rules rendered from alerts/params/fast.yaml loaded. No panel is left empty.

And on a healthy node alone (the node variable set to it), run as `gpu-audit run` and as
`gpu-audit exporter` without a shipper, every panel still has data or says why it has
none (its "no value" text: "No GPU lost", "No shipper on this node"...): a panel that is
blank on a healthy node looks broken, not healthy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dashboards import build
from tests.dashboards import queries
from tests.dashboards.promstack import PromError, Stack, prometheus_stack

ROOT = Path(__file__).resolve().parents[2]
FAST_PARAMS = ROOT / "alerts" / "params" / "fast.yaml"
# busy: healthy node, played by `gpu-audit run` so the shipper's gpu_audit_* are there
# (and busy-exporter, the same healthy node without a shipper); idle: idle-held GPU and a
# low-utilisation job; leak: growing memory; hot: throttling; xid: XIDs, ECC, remapped
# rows, a lost GPU, sampling errors, and (its spool capped at 64 KiB with no shipper
# draining it) a full spool that refuses records.
SCENARIOS = ("busy", "idle", "leak", "hot", "xid")
HEALTHY = ("busy", "busy-exporter")
DEADLINE_S = 150.0

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus not installed (apt-get install prometheus)")


def _rule_files(tmp: Path) -> list[Path]:
    override = os.environ.get("GPU_AUDIT_E2E_RULES")  # a rules file, while developing rules
    if override:
        return [Path(override)]
    if not FAST_PARAMS.is_file():
        pytest.skip(f"{FAST_PARAMS.relative_to(ROOT)} missing: the recording rules come from "
                    "alerts/")
    out = tmp / "rules"
    subprocess.run([sys.executable, "-m", "gpu_audit_app.cli", "rules", "render",
                    "--params", str(FAST_PARAMS), "--out", str(out)], check=True)
    files = sorted(out.glob("*.y*ml"))
    assert files, f"gpu-audit rules render wrote no rule file into {out}"
    return files


def _no_value_texts(model: dict[str, Any]) -> dict[str, str]:
    """Panel title -> what the panel says when its queries return nothing ("" if none)."""
    return {p.get("title", ""): p.get("fieldConfig", {}).get("defaults", {}).get("noValue", "")
            for p in model.get("panels", []) if p.get("type") != "row"}


def _empty_or_failing(stack: Stack, started: float, node: str | None = None
                      ) -> dict[str, str]:
    """Each query that fails or returns nothing now: 'dashboard/panel/ref' -> why. With
    `node`, the node variable is that node's instance, and a query of a panel that says
    why it is empty (its no-value text) may return nothing."""
    problems: dict[str, str] = {}
    range_s = max(60, int(time.monotonic() - started) + 30)
    for name, model in build.build_all().items():
        values = {**queries.all_values(model), "sim": "true|false",
                  **queries.builtin_values(range_s, rate_interval="30s")}
        says_why = _no_value_texts(model) if node is not None else {}
        if node is not None and "node" in values:
            values["node"] = stack.nodes[node]  # its dots match themselves (and any char)
        for t in queries.targets(model):
            key = f"{name}/{t.panel}/{t.ref_id}"
            try:
                data = stack.api("query", query=queries.substitute(t.expr, values))
            except PromError as exc:
                problems[key] = f"error: {exc}"
                continue
            if not data["result"] and not says_why.get(t.panel):
                problems[key] = "no data"
        # (variables are checked fleet-wide: a node without a shipper has no sink to
        # choose, and the variable then offers none)
        for v in queries.variable_queries(model) if node is None else ():
            key = f"{name}/${v.name}"
            try:
                got = stack.api(f"label/{v.label}/values",
                                **{"match[]": queries.substitute(v.match, values)})
            except PromError as exc:
                problems[key] = f"error: {exc}"
                continue
            if not got:
                problems[key] = "no values"
    return problems


def test_every_panel_and_variable_query_returns_data(tmp_path: Path) -> None:
    """Against a real Prometheus with the fast recording rules and the five scenarios,
    every dashboard query parses and returns data before the deadline (the panels that
    need a story, such as a GPU lost at t=30 min, get it at --time-scale 60)."""
    rules = _rule_files(tmp_path)
    with prometheus_stack(tmp_path, SCENARIOS, rules, run_scenario="busy",
                          full_spool="xid", exporter_only=("busy",)) as stack:
        started = time.monotonic()

        def all_problems() -> dict[str, str]:
            found = _empty_or_failing(stack, started)
            for node in HEALTHY:
                found.update({f"{node}: {k}": v for k, v in
                              _empty_or_failing(stack, started, node).items()})
            return found

        problems = all_problems()
        while problems and time.monotonic() - started < DEADLINE_S:
            # a syntax error never heals: fail at once, naming every one
            errors = {k: v for k, v in problems.items() if "bad_data" in v}
            assert not errors, errors
            time.sleep(3)
            problems = all_problems()
        assert problems == {}, "\n".join(f"{k}: {v}" for k, v in sorted(problems.items()))
        _lost_gpu_rows_name_the_owner(stack, started)


def _lost_gpu_rows_name_the_owner(stack: Stack, started: float) -> None:
    """The lost-GPU tables (fleet and hardware) and the firing-alert lists name xid's lost
    GPU 1 with the owner of the job it was running (ivan, Slurm job 5150)."""
    range_s = int(time.monotonic() - started) + 30
    titles = {"Lost GPUs and their owners", "Lost GPUs (gpu_up == 0) and their owners",
              "Firing alerts", "Firing hardware alerts"}
    found = set()
    for name, model in build.build_all().items():
        values = {**queries.all_values(model), "sim": "true|false",
                  **queries.builtin_values(range_s, rate_interval="30s")}
        for t in queries.targets(model):
            if t.panel not in titles:
                continue
            rows = stack.api("query", query=queries.substitute(t.expr, values))["result"]
            owners = {(r["metric"].get("instance"), r["metric"].get("gpu"),
                       r["metric"].get("user"), r["metric"].get("job")) for r in rows
                      if r["metric"].get("alertname", "GpuLost") == "GpuLost"}
            assert (stack.nodes["xid"], "1", "ivan", "5150") in owners, (name, t.panel, owners)
            found.add(t.panel)
    assert found == titles
