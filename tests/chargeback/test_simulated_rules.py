"""Rules rendered with include_simulated (alerts/params/fast.yaml, for the simulator) keep
simulated series in their sums. A bill without --include-simulated must still leave
them out: the source sees that the rules hold simulated GPUs and reads the raw series
with the filter instead. Before, it billed the simulated GPU-hours (with no energy: the
raw energy query filtered them)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from alerts.params import load_params
from alerts.render import write_rules
from chargeback.model import Request
from chargeback.sources.prometheus import read_prometheus
from tests.chargeback.promfill import backfilled_prometheus
from tests.chargeback.test_cross_source import OpenMetrics, Run
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
START = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
STEP = 10
SPAN = 600


def test_simulated_series_in_the_rules_are_not_billed(tmp_path: Path) -> None:
    om = OpenMetrics()
    t0 = START.timestamp()
    for k in range(SPAN // STEP + 1):
        t = t0 + STEP * k
        om(snapshot(t, [gpu(0, util=0.5, energy=100.0 * k, power=10.0,
                            processes=[proc(101, sm=0.5)])], {101: ALICE}, interval=STEP))
        om(snapshot(t, [gpu(1, util=0.5, energy=100.0 * k, power=10.0,
                            processes=[proc(102, sm=0.5)])], {102: BOB}, interval=STEP,
                    simulated=True))
    rules = write_rules(load_params(ROOT / "alerts" / "params" / "fast.yaml"), "fast.yaml",
                        tmp_path / "rules")
    [recording] = [p for p in rules if p.name.startswith("recording")]
    run = Run(START, START + timedelta(seconds=SPAN), STEP)
    with backfilled_prometheus(tmp_path, run,  # type: ignore[arg-type]
                               writer=om.write, rule_file_in=recording) as prom:
        req = Request(start=START + timedelta(seconds=60),
                      end=START + timedelta(seconds=SPAN), source="prometheus", config=None,
                      prometheus_url=prom.url, rates=None, directory=None,
                      idle_policy="none", out="out")
        data = read_prometheus(req)
        users = {o[0] for (o, _m) in data.usage}
        assert "bob" not in users, data.usage
        assert users == {"alice"}
        assert sum(f.gpu_seconds for f in data.fleet.values()) == pytest.approx(540, abs=11)
        assert any("count simulated series" in n for n in data.notes)
        both = read_prometheus(dataclasses.replace(req, include_simulated=True))
        assert {o[0] for (o, _m) in both.usage} == {"alice", "bob"}
