"""Process lists and utilisation samples as the real binding hands them out.

The backend reads them on its hot path by layout (utilisation structs unpacked in one
call, process objects through their __dict__); these tests pin that every shape the
binding may give - its own ctypes structs and friendly objects, a raw struct of an old
binding, a struct of another layout - reads to the same values.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pynvml

from exporter.backends.nvml_processes import (
    INSTANCE_NOT_AVAILABLE,
    NOT_AVAILABLE,
    _unpacker,
    build_processes,
    newest_util_samples,
)

ROWS = [  # pid, timestamp, sm, mem, enc, dec
    (10, 1_000, 50, 20, 0, 0),
    (10, 3_000, 90, 30, 1, 2),  # newer: wins
    (10, 2_000, 10, 10, 0, 0),  # older than the kept one: ignored
    (11, 2_500, 7, 3, 4, 5),
]
EXPECTED = {10: (10, 3_000, 90, 30, 1, 2), 11: (11, 2_500, 7, 3, 4, 5)}


def _structs(cls: Any) -> list[Any]:
    array = (cls * len(ROWS))()
    for i, (pid, ts, sm, mem, enc, dec) in enumerate(ROWS):
        s = array[i]
        s.pid, s.timeStamp, s.smUtil, s.memUtil, s.encUtil, s.decUtil = (
            pid, ts, sm, mem, enc, dec)
    return array[0:len(ROWS)]  # what the binding returns: a slice of its array


def test_binding_util_structs_read_as_their_fields() -> None:
    """nvidia-ml-py's own utilisation structs (read in one unpack) give the same newest
    samples as plain objects with those fields."""
    plain = [SimpleNamespace(pid=p, timeStamp=t, smUtil=s, memUtil=m, encUtil=e, decUtil=d)
             for p, t, s, m, e, d in ROWS]
    assert newest_util_samples(plain) == (EXPECTED, 3_000)
    assert newest_util_samples(_structs(pynvml.c_nvmlProcessUtilizationSample_t)) == (
        EXPECTED, 3_000)
    assert newest_util_samples([]) == ({}, None)
    assert _unpacker(pynvml.c_nvmlProcessUtilizationSample_t) is not None  # one unpack each


class _Reordered(ctypes.Structure):
    """Same names, another order and width: must not be unpacked as the binding's."""

    _fields_ = [("timeStamp", ctypes.c_ulonglong), ("pid", ctypes.c_uint),
                ("decUtil", ctypes.c_ushort), ("encUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("smUtil", ctypes.c_uint)]


def test_util_struct_of_another_layout_is_read_field_by_field() -> None:
    """A struct whose layout differs from the six integer fields in the binding's order
    is read by name, never unpacked by position."""
    assert _unpacker(_Reordered) is None
    assert newest_util_samples(_structs(_Reordered)) == (EXPECTED, 3_000)


def _name(pid: int) -> str:
    return f"job{pid}"


def test_binding_process_objects_and_raw_structs_build_the_same_samples() -> None:
    """Friendly objects (fields in __dict__) and raw ctypes structs of an old binding
    (fields only as descriptors) give the same ProcessSamples, N/A memory and instance
    ids as None."""
    raw = (pynvml.c_nvmlProcessInfo_v2_t * 2)()
    raw[0].pid, raw[0].usedGpuMemory = 10, 100
    raw[0].gpuInstanceId = raw[0].computeInstanceId = INSTANCE_NOT_AVAILABLE
    raw[1].pid, raw[1].usedGpuMemory = 11, NOT_AVAILABLE
    raw[1].gpuInstanceId, raw[1].computeInstanceId = 1, 0
    friendly = [pynvml.nvmlStructToFriendlyObject(raw[0]),
                pynvml.nvmlStructToFriendlyObject(raw[1])]
    util = {10: (10, 5, 50, 25, 0, 0)}
    a, names_a = build_processes([("compute", friendly)], util, {}, _name)
    b, names_b = build_processes([("compute", list(raw))], util, {}, _name)
    assert a == b and names_a == names_b == {10: "job10", 11: "job11"}
    p10, p11 = a
    assert (p10.pid, p10.used_memory_bytes, p10.gpu_instance_id, p10.compute_instance_id) == (
        10, 100, None, None)
    assert (p10.sm_util_ratio, p10.memory_util_ratio) == (0.5, 0.25)
    assert (p11.used_memory_bytes, p11.gpu_instance_id, p11.compute_instance_id) == (
        None, 1, 0)
    assert p11.sm_util_ratio is None and p11.name == "job11"


def test_one_sample_per_pid_and_instance_first_list_wins_names_asked_once() -> None:
    """A pid listed as compute and graphics counts once (as compute); the same pid in two
    MIG instances counts twice; a known name is not asked for again; names of pids gone
    are forgotten."""
    na = INSTANCE_NOT_AVAILABLE

    def p(pid: int, gi: int = na, ci: int = na) -> Any:
        return SimpleNamespace(pid=pid, usedGpuMemory=1, gpuInstanceId=gi, computeInstanceId=ci)

    asked: list[int] = []

    def name_of(pid: int) -> str:
        asked.append(pid)
        return f"n{pid}"

    lists: list[tuple[Any, list[Any]]] = [
        ("compute", [p(10), p(20, 1, 0), p(20, 2, 0)]),
        ("graphics", [p(10), p(20, 1, 0), p(30)]),
    ]
    out, names = build_processes(lists, {}, {10: "known", 99: "gone"}, name_of)
    assert [(s.pid, s.type, s.gpu_instance_id) for s in out] == [
        (10, "compute", None), (20, "compute", 1), (20, "compute", 2), (30, "graphics", None)]
    assert asked == [20, 30]
    assert names == {10: "known", 20: "n20", 30: "n30"}
