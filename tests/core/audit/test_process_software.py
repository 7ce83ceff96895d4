"""What a process runs goes into its process_start event, and into no other record."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from gpu_audit.audit.builder import build_cycle, build_records
from gpu_audit.audit.canonical import ZERO_HASH, seal, seal_chain
from gpu_audit.audit.parts import PartsCache
from gpu_audit.audit.schema import record_schema
from gpu_audit.model.attribution import Software
from gpu_audit.model.snapshot import Snapshot
from tests.core.audit.factory import advance, realistic

VALIDATOR = Draft202012Validator(record_schema())
TORCH = Software(loaded=("cudart", "nccl", "torch"),
                 libraries={"nccl": "2.21.5", "cudart": "12.4.127"})


def _with_software(snap: Snapshot, pid: int, sw: Software) -> Snapshot:
    procs = {uuid: tuple(replace(ap, software=sw) if ap.process.pid == pid else ap
                         for ap in aps) for uuid, aps in snap.processes.items()}
    return replace(snap, processes=procs)


def _records(snaps: list[Snapshot]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    prev = None
    for s in snaps:
        out += build_records(s, prev, stream="exporter", exporter_version="t")
        prev = s
    return out


def test_process_start_carries_software_and_nothing_else_does() -> None:
    s1 = _with_software(realistic(), 101, TORCH)
    s2 = _with_software(advance(s1), 101, TORCH)
    g0 = s2.gpus[0]
    s3 = replace(s2, timestamp=s2.timestamp + 5,
                 gpus=(replace(g0, processes=g0.processes[1:]), *s2.gpus[1:]),
                 processes={**s2.processes, g0.info.uuid: s2.processes[g0.info.uuid][1:]})
    records = _records([s1, s2, s3])
    with_sw = [r for r in records if "software" in r]
    assert [(r["kind"], r.get("event"), r["process"]["pid"]) for r in with_sw] == [
        ("event", "process_start", 101)]
    # sorted names, versions only where known; unknown absent
    assert with_sw[0]["software"] == {"loaded": ["cudart", "nccl", "torch"],
                                      "libraries": {"cudart": "12.4.127", "nccl": "2.21.5"}}
    ends = [r for r in records if r.get("event") == "process_end"]
    assert [r["process"]["pid"] for r in ends] == [101] and "software" not in ends[0]
    others = [r for r in records if r.get("event") == "process_start" and r is not with_sw[0]]
    assert others and all("software" not in r for r in others)
    prev = ZERO_HASH
    for seq, r in enumerate(records, 1):
        VALIDATOR.validate(orjson.loads(seal(r, seq, prev, None)))
        prev = r["hash"]


def test_usage_record_bytes_do_not_change_with_software() -> None:
    """The producer's stored bytes of every record but process_start (the encoded
    process records included) are identical with and without software on a process."""
    def stored(sw: Software | None) -> list[bytes]:
        s1, parts = realistic(), PartsCache(fragments=True)
        if sw is not None:
            s1 = _with_software(s1, 101, sw)
        s2 = _with_software(advance(s1), 101, sw) if sw is not None else advance(s1)
        kept: list[Any] = []
        for s, prev in ((s1, None), (s2, s1)):
            kept += [r for r in build_cycle(s, prev, stream="exporter", exporter_version="t",
                                            parts=parts)
                     if isinstance(r, tuple) or r.get("event") != "process_start"]
        assert any(isinstance(r, tuple) for r in kept)  # encoded process records
        return seal_chain(kept, 0, ZERO_HASH, None)[0]
    assert stored(TORCH) == stored(None)


def test_schema_refuses_software_elsewhere_and_bad_values() -> None:
    """software only on process_start; names from the allow-list; versions dotted
    numbers; no empty list or object."""
    records = _records([_with_software(realistic(), 101, TORCH)])
    start = next(r for r in records if "software" in r)
    base = orjson.loads(seal(start, 1, ZERO_HASH, None))
    assert VALIDATOR.is_valid(base)
    assert VALIDATOR.is_valid({**base, "software": {"image": "nvcr.io/nvidia/pytorch:24.01-py3"}})
    bad: list[dict[str, Any]] = [
        {**base, "event": "process_end"},
        {**base, "software": {"loaded": ["evil"]}},
        {**base, "software": {"loaded": []}},
        {**base, "software": {"loaded": ["cudart"], "libraries": {"cudart": "12; rm"}}},
        {**base, "software": {"loaded": ["cudart"], "libraries": {}}},
        {**base, "software": {"loaded": ["cudart"], "image": "bad image"}},
        {**base, "software": {"image": ""}},
        {**base, "software": {}},
        {**base, "software": {"loaded": ["cudart"], "os": "x"}},
    ]
    for rec in bad:
        assert not VALIDATOR.is_valid(rec), rec["software"]
