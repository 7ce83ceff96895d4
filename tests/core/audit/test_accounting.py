"""GPU-seconds and energy accounting: sums over records give usage, exactly."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpu_audit.audit.accounting import ENERGY_GRID, elapsed_for, energy_units, split_units
from gpu_audit.audit.builder import build_records
from tests.core.audit.factory import ALICE, BOB, T0, advance, gpu, proc, realistic, snapshot


def _by_gpu(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"procs": [], "unowned": []})
    for r in records:
        if r["kind"] == "gpu":
            out[r["gpu"]["uuid"]]["gpu"] = r
        elif r["kind"] == "process":
            out[r["gpu"]["uuid"]]["procs" if r["attributed"] else "unowned"].append(r)
        elif r["kind"] == "unattributed":
            out[r["gpu"]["uuid"]]["un"] = r
    return out


def _build(prev: Any, snap: Any) -> list[dict[str, Any]]:
    return build_records(snap, prev, stream="exporter", exporter_version="t")


def test_energy_is_conserved_exactly_per_gpu_and_interval() -> None:
    """For every up GPU and interval: sum(owned process energy) + unattributed energy ==
    GPU energy, compared with == (the grid makes float sums exact)."""
    s1 = realistic()
    snaps = [s1]
    for i in range(6):
        snaps.append(advance(snaps[-1], dt=5.0, denergy=1234.567 + i * 0.001))
    checked = 0
    for prev, snap in itertools.pairwise(snaps):
        for uuid, parts in _by_gpu(_build(prev, snap)).items():
            g = parts["gpu"]
            if not g["gpu"]["up"]:
                assert "un" not in parts and "energy_joules" not in g
                continue
            total = sum(p["energy_joules"] for p in parts["procs"]) + parts["un"]["energy_joules"]
            assert total == g["energy_joules"], uuid
            assert all("energy_joules" not in p for p in parts["unowned"])
            checked += 1
    assert checked == 6 * 3


def test_energy_from_counter_delta_and_counter_reset() -> None:
    """GPU energy is the counter delta; after a counter reset (negative delta) it is the
    new reading, and the record says which."""
    s1 = snapshot(T0, [gpu(0, energy=5000.0)])
    s2 = snapshot(T0 + 5, [gpu(0, energy=5750.5)])
    s3 = snapshot(T0 + 10, [gpu(0, energy=12.25)])
    r2 = _by_gpu(_build(s1, s2))
    r3 = _by_gpu(_build(s2, s3))
    (g2,) = (p["gpu"] for p in r2.values())
    (g3,) = (p["gpu"] for p in r3.values())
    assert (g2["energy_joules"], g2["energy_source"]) == (750.5, "counter")
    assert (g3["energy_joules"], g3["energy_source"]) == (12.25, "counter_reset")


def test_energy_falls_back_to_power_times_elapsed() -> None:
    """Without an energy counter the energy is power x elapsed; with neither, it is
    absent (never a made-up 0)."""
    s1 = snapshot(T0, [gpu(0, energy=None, power=250.0), gpu(1, energy=None, power=None)])
    s2 = snapshot(T0 + 4, [gpu(0, energy=None, power=250.0), gpu(1, energy=None, power=None)])
    parts = list(_by_gpu(_build(s1, s2)).values())
    assert parts[0]["gpu"]["energy_joules"] == 1000.0
    assert parts[0]["gpu"]["energy_source"] == "power"
    assert "energy_joules" not in parts[1]["gpu"] and "energy_joules" not in parts[1]["un"]


def test_split_by_sm_share_with_unexplained_utilisation_unattributed() -> None:
    """Energy splits by SM share; the GPU utilisation no owned process explains (here
    the unowned process's share) goes to the unattributed record."""
    procs = [proc(1, sm=0.6), proc(2, sm=0.2), proc(3, sm=0.2)]
    s1 = snapshot(T0, [gpu(0, util=1.0, energy=0.0, processes=procs)], {1: ALICE, 2: BOB})
    s2 = snapshot(T0 + 5, [gpu(0, util=1.0, energy=1000.0, processes=procs)], {1: ALICE, 2: BOB})
    parts = next(iter(_by_gpu(_build(s1, s2)).values()))
    e = {p["process"]["pid"]: p["energy_joules"] for p in parts["procs"]}
    assert e == {1: 600.0, 2: 200.0}
    assert parts["un"]["energy_joules"] == 200.0
    assert abs(parts["un"]["values"]["utilization_ratio"] - 0.2) < 1e-12
    assert parts["un"]["values"]["processes"] == 1


def test_split_by_memory_share_without_utilisation() -> None:
    """Without any SM sample the split is by used memory; memory no owned process
    explains is unattributed."""
    procs = [proc(1, sm=None, mem=3 * 10**9), proc(2, sm=None, mem=1 * 10**9)]
    g_a = gpu(0, util=None, mem_used=8e9, energy=0.0, processes=procs)
    g_b = gpu(0, util=None, mem_used=8e9, energy=800.0, processes=procs)
    s1 = snapshot(T0, [g_a], {1: ALICE, 2: BOB})
    s2 = snapshot(T0 + 5, [g_b], {1: ALICE, 2: BOB})
    parts = next(iter(_by_gpu(_build(s1, s2)).values()))
    assert [p["energy_joules"] for p in parts["procs"]] == [300.0, 100.0]
    assert parts["un"]["energy_joules"] == 400.0
    assert parts["un"]["values"]["memory_used_bytes"] == 4e9


def test_processes_all_at_sm_zero_split_by_memory_as_the_recording_rule_does() -> None:
    """Every process reports SM 0 while the GPU is 3 % busy (a notebook and a loader
    holding memory): the split goes on to memory, the rule's second step, as
    `gpu:gpu_power_watts:share` does (it used to give the whole energy to the
    unattributed record, which the bill then spread equally over the owners)."""
    procs = [proc(1, sm=0.0, mem=3 * 10**9), proc(2, sm=0.0, mem=1 * 10**9)]
    g_a = gpu(0, util=0.03, mem_used=4e9, energy=0.0, processes=procs)
    g_b = gpu(0, util=0.03, mem_used=4e9, energy=800.0, processes=procs)
    s1 = snapshot(T0, [g_a], {1: ALICE, 2: BOB})
    s2 = snapshot(T0 + 5, [g_b], {1: ALICE, 2: BOB})
    parts = next(iter(_by_gpu(_build(s1, s2)).values()))
    assert [p["energy_joules"] for p in parts["procs"]] == [600.0, 200.0]
    assert parts["un"]["energy_joules"] == 0.0


def test_idle_gpu_without_processes_is_all_unattributed() -> None:
    """With no process on a GPU, all its energy and its GPU-seconds are unattributed."""
    s1 = snapshot(T0, [gpu(0, util=0.0, energy=100.0)])
    s2 = snapshot(T0 + 5, [gpu(0, util=0.0, energy=400.0)])
    parts = next(iter(_by_gpu(_build(s1, s2)).values()))
    assert parts["un"]["energy_joules"] == 300.0 == parts["gpu"]["energy_joules"]
    assert parts["un"]["gpu_seconds"] == 5.0 == parts["gpu"]["gpu_seconds"]


def test_gpu_seconds_rules() -> None:
    """GPU record: elapsed when up, 0 when down. Process: elapsed (allocated) and
    busy = elapsed x SM ratio. Unattributed: 0 while an owned process holds the GPU."""
    s1 = realistic()
    s2 = advance(s1, dt=4.0)
    g = _by_gpu(_build(s1, s2))
    for parts in g.values():
        up = parts["gpu"]["gpu"]["up"]
        assert parts["gpu"]["gpu_seconds"] == (4.0 if up else 0.0)
        for p in parts["procs"] + parts["unowned"]:
            assert p["gpu_seconds"] == 4.0
            sm = p["values"].get("utilization_ratio")
            assert p.get("busy_gpu_seconds") == (4.0 * sm if sm is not None else None)
        if up:
            assert parts["un"]["gpu_seconds"] == (0.0 if parts["procs"] else 4.0)


def test_first_snapshot_accounts_nothing_and_long_pause_is_capped() -> None:
    """The first snapshot accounts nothing (nothing observed before: no usage record at
    all in v2); a 10-minute pause with a 5 s interval accounts at most 3 x 5 s."""
    s1 = realistic()
    assert [r for r in _build(None, s1) if r["kind"] != "event"] == []
    late = replace(advance(s1), timestamp=s1.timestamp + 600)
    assert {r["elapsed_seconds"] for r in _build(s1, late)} == {15.0}
    assert elapsed_for(T0, T0 + 5, 5.0, 3.0) == 0.0  # clock went backwards


@given(
    total=st.integers(min_value=0, max_value=10**12),
    weights=st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=70),
)
def test_split_units_always_sums_to_total(total: int, weights: list[float]) -> None:
    """The largest-remainder split never loses or invents a unit."""
    parts = split_units(total, weights)
    assert len(parts) == len(weights) and all(p >= 0 for p in parts)
    assert sum(parts) == (total if sum(weights) > 0 else 0)


def _split_by_definition(total: int, weights: list[float]) -> list[int]:
    """The largest-remainder split as first written: sort by (-remainder, index)."""
    wsum = math.fsum(weights)
    if total == 0 or wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    parts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


@given(
    total=st.integers(min_value=0, max_value=10**12),
    weights=st.lists(st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1 / 3, 2.0]),
                               st.floats(min_value=0, max_value=1e6)),
                     min_size=1, max_size=70),
)
def test_split_units_gives_the_units_to_the_largest_remainders(total: int,
                                                               weights: list[float]) -> None:
    """split_units (remainders sorted in C) gives every unit to the same weight as the
    definition does: largest remainder first, ties to the earlier weight (equal weights
    are common: processes at the same utilisation), so the energy in stored records
    never changes."""
    assert split_units(total, weights) == _split_by_definition(total, weights)


def test_energy_units_grid() -> None:
    """Energy is counted in 1/1024 J units."""
    assert energy_units(10.5, 10.0, None, 5.0) == (ENERGY_GRID // 2, "counter")


def test_capped_pause_bills_only_the_accounted_share_of_the_counter() -> None:
    """After a 60 s gap with a 5 s interval (cap 15 s), the GPU record bills a quarter of
    the counter delta; the raw counter stays in values for fleet totals."""
    s1 = snapshot(T0, [gpu(0, energy=0.0)])
    s2 = snapshot(T0 + 60, [gpu(0, energy=6000.0)])
    parts = next(iter(_by_gpu(_build(s1, s2)).values()))
    assert parts["gpu"]["elapsed_seconds"] == 15.0
    assert parts["gpu"]["energy_joules"] == 1500.0
    assert parts["gpu"]["values"]["energy_joules_total"] == 6000.0


def test_non_finite_readings_are_unmeasured_not_a_crash() -> None:
    """A NaN or infinite GPU utilisation, memory, energy or power reading (found by the
    fast-vs-plain property test: it raised ValueError in the energy split) is treated as
    not measured: the cycle's records are built and hold only finite numbers."""
    nan, inf = float("nan"), float("inf")
    procs = [proc(1, sm=inf), proc(2, sm=nan)]
    s1 = snapshot(T0, [gpu(0, util=nan, mem_used=inf, energy=0.0, processes=procs)],
                  {1: ALICE})
    s2 = snapshot(T0 + 5, [gpu(0, util=inf, mem_used=nan, energy=inf, power=nan,
                               processes=procs)], {1: ALICE})
    s3 = snapshot(T0 + 10, [gpu(0, util=nan, energy=100.0, power=inf, processes=procs)],
                  {1: ALICE})
    for prev, snap in ((s1, s2), (s2, s3)):
        recs = _build(prev, snap)
        assert recs
        numbers = [v for r in recs for v in _numbers(r)]
        assert all(math.isfinite(v) for v in numbers)


def _numbers(obj: Any) -> list[float]:
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _numbers(x)]
    if isinstance(obj, float | int) and not isinstance(obj, bool):
        return [float(obj)]
    return []
