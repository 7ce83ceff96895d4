"""The users dashboard's arithmetic, evaluated by promtool on exact series: GPU-hours
count only the evaluations an identity was present in (a job held for half the range
gets half the hours, not all of them), and efficiency is busy GPU-hours divided by held
GPU-hours as whole terms."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import build
from tests.dashboards import queries

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool not installed (apt-get install prometheus)")

OWNER = 'user="ann",project="p1",job="j1"'


def _panel_exprs(panel: str) -> dict[str, str]:
    model = build.build_all()["users"]
    values = {**queries.all_values(model), **queries.builtin_values(3600)}
    return {t.ref_id: queries.substitute(t.expr, values)
            for t in queries.targets(model) if t.panel == panel}


def test_gpu_hours_and_efficiency_on_exact_series(tmp_path: Path) -> None:
    """One evaluation a minute at 1m..60m (60 in the 1 h range whether its start is
    open, as in Prometheus 3, or closed, as in 2.x); ann holds 2 GPUs (1 busy GPU's
    worth) in 29 of them: 29 * 2 / 60 h = 0.9667 GPU-hours held, half of it
    busy, efficiency 0.5, 290 W -> 0.14017 kWh."""
    exprs = _panel_exprs("Top consumers (user, project)")
    held, busy, energy, efficiency = (29 * 2 / 60, 29 * 1 / 60, 29 * 290 / 60 / 1000, 0.5)
    labels = '{project="p1", user="ann"}'
    case = {
        "interval": "1m",
        "input_series": [
            {"series": "fleet:gpus:count", "values": "_ 4x59"},
            {"series": f"user_project_job:gpus_held:sum{{{OWNER}}}", "values": "_ 2x28"},
            {"series": f"user_project_job:gpus_busy:sum{{{OWNER}}}", "values": "_ 1x28"},
            {"series": f"user_project_job:gpu_power_watts:sum{{{OWNER}}}", "values": "_ 290x28"},
        ],
        "promql_expr_test": [
            {"expr": exprs["A"], "eval_time": "60m",
             "exp_samples": [{"labels": labels, "value": held}]},
            {"expr": exprs["B"], "eval_time": "60m",
             "exp_samples": [{"labels": labels, "value": busy}]},
            {"expr": exprs["C"], "eval_time": "60m",
             "exp_samples": [{"labels": labels, "value": energy}]},
            {"expr": exprs["D"], "eval_time": "60m",
             "exp_samples": [{"labels": labels, "value": efficiency}]},
        ],
    }
    test_file = tmp_path / "dashboard_test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m",
                                         "tests": [case]}))
    result = subprocess.run(["promtool", "test", "rules", str(test_file)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
