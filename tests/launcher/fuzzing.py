"""The launcher protocol fuzz: random and mutated frames through the daemon's frame parser
and every request handler (launcher.server.handle_line), shared by the CI test (a short
budget) and bench/bench_launcher_fuzz.py (100,000+ inputs).

Frames come from four strategies: bytes of any kind; JSON objects built from the
protocol's ops and keys with hostile values (huge and negative integers, floats, NaN
text, long and NUL-laden strings, nested lists and objects, YAML specs with out-of-range
numbers); well-formed requests with plausible values (so every handler is reached:
submissions good and bad, logs and controls of jobs that exist or not); and byte-level
mutations (flips, cuts, insertions, duplications) of requests. `check(answer)` is the
property: every frame gets a JSON-encodable answer object, never an exception and never
an internal error, with bounded text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from hypothesis import strategies as st

from launcher.config import PolicyConfig
from launcher.engine import Engine
from launcher.executor import ProcessExecutor
from launcher.peer import Caller
from launcher.protocol import KEYS, OPS
from launcher.scheduler import Scheduler
from launcher.service import Service
from launcher.sim.gpus import SimGpuSource
from launcher.store import Store
from launcher.telemetry import Telemetry

ERRORS = {"invalid", "denied", "not_found", "bad_request", "too_large", "busy"}
ROOT = Caller(pid=1, uid=0, gid=0, groups=frozenset({0}), user="root", admin=True)
USER = Caller(pid=2, uid=os.getuid() or 4242, gid=4242, groups=frozenset({4242}),
              user="fuzz-user", admin=False)
OTHER = Caller(pid=3, uid=4343, gid=4343, groups=frozenset({4343}), user="fuzz-other",
               admin=False)


def service(state: Path) -> Service:
    """A daemon's service with its real frame parser, store and executor (no job ever
    starts: nothing ticks), with a few jobs to act on."""
    executor = ProcessExecutor(state, switch_users=False)  # creates state/ and state/logs
    store = Store(state / "launcher.db")
    engine = Engine(store, Scheduler(PolicyConfig()), SimGpuSource(2), executor,
                    lambda: 1_000_000.0)
    svc = Service(engine, store, executor, jobmap=None, audit=None, telemetry=Telemetry(),
                  clock=lambda: 1_000_000.0)
    for caller in (USER, OTHER, USER, OTHER):  # jobs 1-4: the user may act on 1 and 3
        svc.handle(caller, _parsed({"op": "submit", "spec": "{name: a, command: [x]}"}))
    return svc


def _parsed(doc: dict[str, Any]) -> Any:
    from launcher.protocol import parse_request

    return parse_request(orjson.dumps(doc))


_INTS = st.one_of(st.integers(-(1 << 70), 1 << 70), st.sampled_from(
    [0, 1, 2, -1, 1 << 53, (1 << 53) + 1, (1 << 63) - 1, 1 << 62]))
_TEXT = st.one_of(st.text(max_size=40), st.sampled_from(
    ["", "9" * 30, "1", "01", "-1", "\uff11\uff12", "out", "err", "\0", "x" * 5000, "../../etc"]))
_SPECS = st.sampled_from([
    "{name: a, command: [x]}", "{name: a, command: [x], gpu_fraction: 1e-300}",
    "{name: a, command: [x], max_runtime_seconds: .inf}", "{name: a, command: x, gpus: 99}",
    "jobs: []", "[1, 2]", "a: &a [x, x]\nb: [*a, *a]", "!!python/object/apply:os.system [x]",
    "{name: a, command: [x], gpu_memory_bytes: '1" + "0" * 300 + "GiB'}",
    "jobs:\n" + "".join(f"  - {{name: j{i}, command: [x], after: [j{i + 1}]}}\n"
                        for i in range(50)),
])
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, st.floats(allow_nan=False), _TEXT)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=8)
_KEYS = sorted({k for keys in KEYS.values() for k in keys} | {"op", "uid", "user", "x"})


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A request object: a real op (mostly) with real and unknown keys, hostile values."""
    op = draw(st.one_of(st.sampled_from(sorted(OPS)), _VALUES))
    doc: dict[str, Any] = {"op": op}
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=5)):
        value = draw(_SPECS) if key == "spec" and draw(st.booleans()) else draw(_VALUES)
        doc[key] = value
    return doc


@st.composite
def well_formed(draw: st.DrawFn) -> dict[str, Any]:
    """A request of the right shape with plausible values, so the frames reach every
    handler (submit with good and bad specs, logs of jobs that exist or not, controls)."""
    op = draw(st.sampled_from(sorted(OPS)))
    doc: dict[str, Any] = {"op": op}
    for key in sorted(KEYS[op]):
        if not draw(st.booleans()) and key not in ("spec", "id"):
            continue
        doc[key] = draw({
            "id": st.one_of(st.integers(1, 4), st.sampled_from(["1", "2", "9"])),
            "offset": st.integers(0, 1 << 20), "attempt": st.integers(1, 3),
            "events_from": st.integers(0, 500),
            "stream": st.sampled_from(["out", "err"]), "spec": _SPECS,
            "path": st.sampled_from(["a.yaml", "/x/b.yaml"]),
            "cwd": st.sampled_from(["/tmp", "/", "rel"]),
        }[key])
    return doc


def _encode(doc: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # integers past 64 bits: written by hand, as a hostile client would
        return repr(doc).replace("'", '"').replace("None", "null").replace(
            "True", "true").replace("False", "false").encode()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request's bytes, flipped, cut, spliced or repeated."""
    data = bytearray(_encode(draw(requests())))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "dup"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del data[i:i + draw(st.integers(1, 8))]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[i:i] = data[i:i + draw(st.integers(1, 16))]
    return bytes(data)


frames = st.one_of(st.binary(max_size=256), requests().map(_encode),
                   well_formed().map(_encode), mutated())
callers = st.sampled_from([ROOT, USER])


def check(answer: object) -> None:
    """The property every answer holds."""
    assert isinstance(answer, dict), answer
    encoded = orjson.dumps(answer)
    assert isinstance(answer.get("ok"), bool), answer
    if not answer["ok"]:
        assert answer.get("error") in ERRORS, answer
        assert isinstance(answer.get("message"), str) and len(answer["message"]) < 1000
        problems = answer.get("problems", [])
        assert isinstance(problems, list) and len(problems) <= 200
        assert all(isinstance(p, str) and len(p) < 2000 for p in problems), problems
    assert len(encoded) < 8 << 20
