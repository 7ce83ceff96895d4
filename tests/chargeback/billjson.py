"""A bill read back from its `chargeback.json` (the inverse of
chargeback.outputs.bill_to_json, to the rounding it applied): the round-trip tests
compare a bill with what its JSON says. Nothing in the packages reads a bill back, so
this lives with the tests; it must never be imported by the packages."""

from __future__ import annotations

from typing import Any

from chargeback.model import (
    Bill,
    Completeness,
    Fleet,
    Line,
    Owner,
    Reconciliation,
    Row,
    RowDifference,
    SourceComparison,
    Usage,
)
from chargeback.outputs import JSON_FORMAT
from chargeback.values import JOULES_PER_KWH, SECONDS_PER_HOUR, parse_rfc3339

_HOURS = SECONDS_PER_HOUR
_KWH = JOULES_PER_KWH


def completeness_from_json(obj: Any) -> Completeness | None:
    if not isinstance(obj, dict):
        return None
    return Completeness(chains=list(obj["chains"]), gaps=list(obj["gaps"]),
                        silent=list(obj["silent"]), inventory_gpus=obj["inventory_gpus"],
                        inventory_hosts=obj["inventory_hosts"],
                        expected_gpu_hours=obj["expected_gpu_hours"],
                        observed_gpu_hours=obj["observed_gpu_hours"],
                        allowed=obj["allowed"])


def _no_nulls(obj: dict[str, Any]) -> dict[str, Any]:
    """A showback's empty costs (null) as 0.0, what the Bill holds when not priced."""
    return {k: 0.0 if v is None else v for k, v in obj.items()}


def bill_from_json(obj: dict[str, Any]) -> Bill:
    """The inverse of `bill_to_json` (to the rounding it applied)."""
    if obj.get("format") != JSON_FORMAT:
        raise ValueError(f"not a {JSON_FORMAT} document: format={obj.get('format')!r}")
    rows = [Row(**_no_nulls(row)) for row in obj["rows"]]
    lines = [Line(**_no_nulls(li)) for li in obj.get("lines", [])]
    recj = dict(obj["reconciliation"])
    comparisons = {
        name: SourceComparison(**{**c, "largest_differences": [
            RowDifference(**d) for d in c["largest_differences"]]})
        for name, c in recj.pop("comparisons", {}).items()}
    rec = Reconciliation(**recj, comparisons=comparisons)
    days: dict[str, tuple[dict[Owner, Usage], Fleet]] = {}
    for day, value in obj["days"].items():
        owners: dict[Owner, Usage] = {}
        for entry in value["owners"]:
            owners[(entry["user"], entry["project"])] = Usage(
                allocated_gpu_seconds=(entry["allocated_gpu_hours"] or 0.0) * _HOURS,
                used_gpu_seconds=entry["used_gpu_hours"] * _HOURS,
                charged_gpu_seconds=entry["charged_gpu_hours"] * _HOURS,
                busy_gpu_seconds=entry["busy_gpu_hours"] * _HOURS,
                idle_held_gpu_seconds=entry["idle_held_gpu_hours"] * _HOURS,
                energy_joules=entry["energy_kwh"] * _KWH,
                power_energy_joules=entry["power_energy_kwh"] * _KWH,
            )
        f = value["fleet"]
        days[day] = (owners, Fleet(
            gpu_seconds=f["gpu_hours"] * _HOURS,
            down_gpu_seconds=f["down_gpu_hours"] * _HOURS,
            held_gpu_seconds=f["held_gpu_hours"] * _HOURS,
            busy_gpu_seconds=f["busy_gpu_hours"] * _HOURS,
            idle_held_gpu_seconds=f["idle_held_gpu_hours"] * _HOURS,
            energy_joules=f["energy_kwh"] * _KWH,
            power_energy_joules=f["power_energy_kwh"] * _KWH,
        ))
    return Bill(
        start=parse_rfc3339(obj["period"]["start"]), end=parse_rfc3339(obj["period"]["end"]),
        source=obj["source"], currency=obj["currency"] or "",
        idle_policy=obj["idle_policy"],
        idle_policy_note=obj["idle_policy_note"], rows=rows, reconciliation=rec, days=days,
        unmapped=list(obj["unmapped"]), simulated_excluded=obj["simulated_excluded"],
        simulated_included=obj["simulated_included"], verified=obj["verified"],
        verification_problems=list(obj["verification_problems"]), notes=list(obj["notes"]),
        completeness=completeness_from_json(obj.get("completeness")),
        priced=obj.get("priced", True), allocation_known=obj.get("allocation_known", True),
        energy_kwh_price=obj.get("energy_kwh_price") or 0.0,
        lines=lines,
    )
