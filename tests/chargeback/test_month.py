"""The month generator itself: its two outputs describe the same fleet."""

from __future__ import annotations

import io

from tests.chargeback.month import audit_records, check, scenario, write_openmetrics


def test_records_account_the_scenario_hours() -> None:
    check()
    m = scenario(step=3600)
    held: dict[str | None, float] = {}
    gpu_seconds = 0.0
    for r in audit_records(m):
        if r["simulated"]:
            continue
        if r["kind"] == "process":
            user = r.get("attribution", {}).get("user")
            held[user] = held.get(user, 0.0) + r["gpu_seconds"]
        elif r["kind"] == "gpu":
            gpu_seconds += r["gpu_seconds"]
    # hours by hand from the module docstring
    assert held["alice"] / 3600 == 240 + 48 + 200
    assert held["bob"] / 3600 == 120 + 200
    assert held[None] / 3600 == 72
    assert gpu_seconds / 3600 == 4 * 720 - 24


def test_openmetrics_is_grouped_and_terminated() -> None:
    m = scenario(step=3600)
    buf = io.StringIO()
    n = write_openmetrics(m, buf)
    text = buf.getvalue()
    assert text.endswith("# EOF\n")
    assert n == text.count("\n") - text.count("# ")
    # the MIG GPU's energy counter appears once per instance
    assert text.count('gpu_energy_joules_total{instance="node-b:9400",gpu="1"') == 2 * 720
