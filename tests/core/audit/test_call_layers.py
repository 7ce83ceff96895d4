"""The audit record path reads top-down: one snapshot, traced from
`AuditProducer.on_snapshot`, only ever calls down a declared order of modules.

The modules of gpu_audit/audit/ a snapshot passes through, top to bottom:

- the producer (the entry: chain and commit);
- the orchestrators, one per trail: builder.py (per-cycle records and every event) and
  interval.py (interval records);
- what they call: the record kinds (usage.py, events.py), the parts the records are made
  of and their cache (parts.py), the bill's rules (holders.py);
- the shared leaves: canonical.py (the encoding: bytes, ids, the chain) and
  accounting.py (time and energy arithmetic).

Three rules, checked on a real trace (sys.setprofile, every Python call in the package):

1. every call from one module into another goes to a strictly lower layer: nothing
   calls up or sideways, so no module is re-entered from below;
2. every module above the leaves is entered from one module only: it is read in one
   place, never again from another branch after its caller has returned;
3. every module entered is declared here (a new module gets a place in the order).

The input makes every module work: both cadences (per-cycle and interval), process
starts and ends, an XID, a GPU that goes down and one that disappears.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import gpu_audit.audit
from gpu_audit.audit import AuditConfig, AuditProducer
from gpu_audit.model.samples import XidEvent
from gpu_audit.model.snapshot import Snapshot
from tests.core.audit import factory
from tests.core.audit.fakes import MemorySpool

PACKAGE = Path(gpu_audit.audit.__file__).resolve().parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("producer",),
    ("builder", "interval"),
    ("usage", "events", "parts", "holders"),
    ("canonical", "accounting"),
)
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}
LEAVES = set(LAYERS[-1])


def _module(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    return path.stem if path.parent == PACKAGE else None


def _trace(producer: AuditProducer, snaps: list[Snapshot]) -> list[tuple[str, str, str]]:
    """(caller module, callee module, callee function) of every call that crosses from
    one module of the package into another, in order. A call from outside the package
    (orjson, the model, the spool) does not cross: the caller is the nearest frame of the
    package below it."""
    crossings: list[tuple[str, str, str]] = []
    stack: list[str | None] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            mod = _module(frame)
            outer = next((m for m in reversed(stack) if m is not None), None)
            if mod is not None and outer is not None and mod != outer:
                crossings.append((outer, mod, frame.f_code.co_qualname))
            stack.append(mod)
        elif event == "return" and stack:
            stack.pop()

    for snap in snaps:
        sys.setprofile(profile)
        try:
            producer.on_snapshot(snap)
        finally:
            sys.setprofile(None)
        stack.clear()
    return crossings


def _snapshots() -> list[Snapshot]:
    """Three cycles: the first (every process starts, GPU 2 is down, an XID), then one
    where a process ends and one starts, then one where GPU 3 is gone."""
    s0 = factory.realistic()
    s1 = factory.advance(s0)
    g0 = s1.gpus[0]
    started = factory.proc(104, sm=0.3)
    g0 = replace(g0, processes=(*g0.processes[1:], started),
                 new_xids=(XidEvent(g0.info.uuid, 13, s1.timestamp - 0.5),))
    s1 = factory.snapshot(s1.timestamp, [g0, *s1.gpus[1:]],
                          {101: factory.ALICE, 102: factory.BOB, 104: factory.BOB,
                           301: factory.ALICE})
    s2 = factory.advance(s1)
    s2 = replace(s2, gpus=s2.gpus[:3],
                 processes={u: p for u, p in s2.processes.items() if u in
                            {g.info.uuid for g in s2.gpus[:3]}})
    return [s0, s1, s2]


def _violations(crossings: list[tuple[str, str, str]]) -> list[str]:
    out: list[str] = []
    undeclared = sorted({m for c in crossings for m in c[:2] if m not in RANK})
    if undeclared:
        out.append(f"modules not in LAYERS: {undeclared}")
    upward: dict[tuple[str, str], list[str]] = defaultdict(list)
    callers: dict[str, set[str]] = defaultdict(set)
    for a, b, fn in crossings:
        if a in RANK and b in RANK and RANK[b] <= RANK[a]:
            upward[a, b].append(fn)
        callers[b].add(a)
    for (a, b), fns in sorted(upward.items()):
        kind = "sideways" if RANK[a] == RANK[b] else "up"
        out.append(f"{a} -> {b} ({kind}) {len(fns)} calls: {sorted(set(fns))}")
    for mod, who in sorted(callers.items()):
        if mod not in LEAVES and len(who) > 1:
            out.append(f"{mod} is entered from {len(who)} modules: {sorted(who)}")
    return out


def _produce(audit_interval: float) -> list[tuple[str, str, str]]:
    producer = AuditProducer(AuditConfig(interval_seconds=audit_interval), MemorySpool(),
                             host=factory.HOST, exporter_version="t", simulated=False)
    producer.start()
    crossings = _trace(producer, _snapshots())
    assert producer.stats()["records_written"] > 0
    return crossings


@pytest.mark.parametrize(("audit_interval", "path"), [
    # per-cycle cadence: usage records and events every cycle
    (5.0, {"builder", "usage", "events", "parts", "canonical", "accounting",
           "Cycle.record", "usage_records", "gpu_events", "missing_gpu_events",
           "PartsCache.owner", "PartsCache.process", "seal_chain"}),
    # interval cadence: events every cycle, the interval's records once it ends
    (10.0, {"builder", "interval", "holders", "events", "parts", "canonical", "accounting",
            "IntervalUsage.add", "IntervalUsage.emit", "gpu_events", "seal_chain"}),
])
def test_one_snapshot_only_calls_down_the_declared_order(
    audit_interval: float, path: set[str]
) -> None:
    crossings = _produce(audit_interval)
    problems = _violations(crossings)
    assert not problems, (
        f"{len(crossings)} crossings between modules; against the order:\n"
        + "\n".join(problems))
    # the trace saw the whole path: a rule checked on part of it proves nothing
    seen = {b for _a, b, _fn in crossings} | {fn for _a, _b, fn in crossings}
    assert path <= seen, sorted(path - seen)


def test_the_rule_sees_a_call_up_sideways_and_a_second_caller() -> None:
    """The checker itself: each kind of wrong call is reported."""
    assert _violations([("builder", "usage", "f"), ("usage", "builder", "g")]) == [
        "usage -> builder (up) 1 calls: ['g']"]
    assert _violations([("usage", "parts", "f")]) == [
        "usage -> parts (sideways) 1 calls: ['f']"]
    assert _violations([("builder", "parts", "f"), ("interval", "parts", "g")]) == [
        "parts is entered from 2 modules: ['builder', 'interval']"]
    assert _violations([("builder", "canonical", "f"), ("usage", "canonical", "g")]) == []
    assert _violations([("builder", "mystery", "f")]) == ["modules not in LAYERS: ['mystery']"]
