"""The leak rule and the waste dashboard's leak panels on real data:
a real Prometheus scrapes the simulator playing busy (a job ramping up after start, noisy
training memory), leak (frank's memory growing 50 MiB a minute) and large (512 small
noisy processes) at --time-scale 60, with the rules of alerts/params/fast.yaml. Over the
whole run, the only leak suspect the panels ever list, and the only GpuMemoryLeak ever
pending or firing, is frank's process on the leak node.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from alerts.params import load_params
from alerts.render import write_rules
from dashboards import build
from tests.dashboards import queries
from tests.dashboards.promstack import Stack, prometheus_stack
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("busy", "leak", "large")
LEAK_PANELS = ("Leak suspects: predicted time until the GPU is full", "Memory of leak suspects")
# busy's ramp-up (carol, 1 to 4 GiB from scenario minute 10) and every process's warm-up
# are past by then (fast params: 10 s warm-up + 40 s window)
RUN_S = 100

pytestmark = [pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="prometheus not installed (apt-get install prometheus)"),
              pytest.mark.timeout(400)]


def _panel_queries(range_s: int) -> list[tuple[str, str]]:
    model = build.build_all()["waste"]
    values = {**queries.all_values(model), "sim": "true|false",
              **queries.builtin_values(range_s, rate_interval="30s")}
    return [(f"{t.panel}/{t.ref_id}", queries.substitute(t.expr, values))
            for t in queries.targets(model) if t.panel in LEAK_PANELS]


def _ever(stack: Stack, expr: str, seconds: int) -> set[tuple[str, str, str]]:
    """(node, user, process) of every series `expr` returned at any second of the run."""
    rows = stack.api("query", query=f"max_over_time(({expr})[{seconds}s:1s])")["result"]
    node_of = {target: name for name, target in stack.nodes.items()}
    return {(node_of.get(r["metric"].get("instance", ""), "?"), r["metric"].get("user", ""),
             r["metric"].get("process_name", "")) for r in rows}


def test_only_the_leak_is_a_suspect_and_ramp_ups_are_not(tmp_path: Path) -> None:
    """frank's growing process is listed by both leak panels and fires GpuMemoryLeak;
    busy's ramp-up, its noisy training memory and large's 512 noisy processes are never
    listed, not even for one evaluation, and never make the alert pending."""
    rules = write_rules(load_params(ROOT / "alerts" / "params" / "fast.yaml"), "fast.yaml",
                        tmp_path / "rules")
    frank = {("leak", "frank", "python")}
    with prometheus_stack(tmp_path, SCENARIOS, rules) as stack:
        started = time.monotonic()

        def frank_listed() -> bool:
            return all(frank <= _ever(stack, expr, 5) for _, expr in _panel_queries(60))

        wait_for(frank_listed, RUN_S + 60, "frank's leak in both panels", step=2)
        while time.monotonic() - started < RUN_S:
            time.sleep(2)
        seconds = int(time.monotonic() - started) + 5
        for key, expr in _panel_queries(seconds):
            assert _ever(stack, expr, seconds) == frank, key
        alert = 'ALERTS{alertname="GpuMemoryLeak"}'
        assert _ever(stack, alert, seconds) == frank
        assert _ever(stack, f'{alert[:-1]}, alertstate="firing"}}', seconds) == frank
