"""The simulator tied to this host: real processes on simulated GPUs, and live events.

A scenario with `host:` (exporter/sim/schema.py HostSpec) names one device file per
simulated GPU. A process of this host that holds a GPU's device file open is reported as
a process on that GPU, the way NVML reports a process that opened /dev/nvidiaN for its
CUDA context; its memory and utilisation are the scenario's, or what its own environment
says (`GPU_AUDIT_SIM_MEMORY`, e.g. `2GiB`, and `GPU_AUDIT_SIM_UTIL`, a ratio). Attribution
then reads the host's real /proc for these pids, so a real Slurm job (its environment,
the prolog's job-mapping file) is attributed end to end without a GPU.

`events_file` is a JSON-lines file others append to while the exporter runs; each
complete line is applied once, at the scenario time it is read: `{"gpu": 0, "kind":
"xid", "xid": 79}`, `{"gpu": 0, "kind": "lost"}`, `{"gpu": 0, "kind": "recovered"}`. A
line that is not one of these is reported once with its line number and skipped.

This module is used only by the simulator, which is used only when asked for by name. It
reads /proc and the events file; it never writes anything, never raises out of `scan()`
or `poll()` for a process that vanished or a bad line, and reads at most 64 KiB of a
process's environment, looking at two keys only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from exporter.sim.schema import HostSpec, parse_quantity
from gpu_audit.model.samples import ProcessSample

log = logging.getLogger("gpu_audit.sim")

MEMORY_KEY = b"GPU_AUDIT_SIM_MEMORY"
UTIL_KEY = b"GPU_AUDIT_SIM_UTIL"
_ENVIRON_LIMIT = 64 * 1024
_EVENT_KINDS = frozenset({"xid", "lost", "recovered"})


@dataclass(frozen=True, slots=True)
class LiveEvent:
    gpu: int
    kind: str  # "xid" | "lost" | "recovered"
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class _Known:
    """What is read once per process lifetime: its name and simulated load."""

    start: bytes  # /proc/<pid>/stat after the command name: changes when the pid is reused
    name: str
    memory: int
    util: float


class HostProcesses:
    """Finds this host's processes holding the simulated GPUs' device files, each cycle."""

    def __init__(self, spec: HostSpec, procfs: Path = Path("/proc")) -> None:
        self._spec = spec
        self._proc = str(procfs)
        # the paths as the kernel shows them in /proc/<pid>/fd (symlinks resolved)
        self._index = {os.path.realpath(p): i for i, p in enumerate(spec.devices)}
        self._known: dict[int, _Known] = {}
        self._events_path = spec.events_file
        self._events_offset = 0
        self._events_line = 0
        self._pending = b""

    def scan(self) -> dict[int, tuple[ProcessSample, ...]]:
        """GPU index -> the processes holding its device file now (pid order)."""
        found: dict[int, list[ProcessSample]] = {}
        seen: set[int] = set()
        try:
            entries = os.listdir(self._proc)
        except OSError as exc:
            log.warning("simulator: cannot list %s: %s", self._proc, exc.strerror or exc)
            return {}
        for entry in entries:
            if not entry.isdigit():
                continue
            pid = int(entry)
            gpus = self._gpus_held(pid)
            if not gpus:
                continue
            known = self._identify(pid)
            if known is None:
                continue
            seen.add(pid)
            sample = ProcessSample(pid, known.name, None, "compute", known.memory, known.util,
                                   self._spec.memory_util)
            for gpu in sorted(gpus):
                found.setdefault(gpu, []).append(sample)
        for pid in list(self._known):
            if pid not in seen:
                del self._known[pid]
        return {gpu: tuple(sorted(procs, key=lambda p: p.pid)) for gpu, procs in found.items()}

    def _gpus_held(self, pid: int) -> set[int]:
        fd_dir = f"{self._proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return set()  # gone, or a kernel thread
        held = set()
        index = self._index
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            gpu = index.get(target)
            if gpu is not None:
                held.add(gpu)
        return held

    def _identify(self, pid: int) -> _Known | None:
        base = f"{self._proc}/{pid}"
        try:
            with open(f"{base}/stat", "rb") as fh:
                stat = fh.read(4096)
        except OSError:
            return None
        # "pid (comm) state ...": the command may hold spaces and parentheses
        close = stat.rfind(b")")
        name = stat[stat.find(b"(") + 1:close].decode(errors="replace")
        start = stat[close:]
        fields = start.split()
        start_key = fields[20] if len(fields) > 20 else start
        known = self._known.get(pid)
        if known is not None and known.start == start_key:
            return known
        memory, util = int(self._spec.memory), self._spec.util
        env = _read_environ(f"{base}/environ")
        if MEMORY_KEY in env:
            try:
                value = parse_quantity(env[MEMORY_KEY].decode(errors="replace"))
                if isinstance(value, float) and value >= 0:
                    memory = int(value)
            except ValueError:
                pass
        if UTIL_KEY in env:
            with contextlib.suppress(ValueError):
                util = min(max(float(env[UTIL_KEY]), 0.0), 1.0)
        known = _Known(start_key, name, memory, util)
        self._known[pid] = known
        return known

    def poll(self) -> list[LiveEvent]:
        """The live events appended since the last call (complete lines only)."""
        path = self._events_path
        if path is None:
            return []
        try:
            with open(path, "rb") as fh:
                fh.seek(self._events_offset)
                data = fh.read(1 << 20)
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("simulator: cannot read events file %s: %s", path, exc.strerror or exc)
            return []
        self._events_offset += len(data)
        data = self._pending + data
        complete, _, self._pending = data.rpartition(b"\n")
        out = []
        for raw in complete.split(b"\n") if complete else []:
            self._events_line += 1
            event = _parse_event(raw)
            if isinstance(event, str):
                log.warning("simulator: %s line %d: %s (skipped)", path, self._events_line, event)
                continue
            out.append(event)
        return out


def _read_environ(path: str) -> Mapping[bytes, bytes]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_ENVIRON_LIMIT)
    except OSError:
        return {}
    out = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in (MEMORY_KEY, UTIL_KEY) and key not in out:
            out[key] = value
    return out


def _parse_event(raw: bytes) -> LiveEvent | str:
    """The event of one line, or what is wrong with it."""
    if not raw.strip():
        return "empty line"
    try:
        doc: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"not JSON ({exc.msg})"
    if not isinstance(doc, dict):
        return "not a JSON object"
    gpu, kind, xid = doc.get("gpu"), doc.get("kind"), doc.get("xid")
    if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
        return "'gpu' must be a GPU index"
    if kind not in _EVENT_KINDS:
        return f"'kind' must be one of {sorted(_EVENT_KINDS)}"
    if kind == "xid" and (not isinstance(xid, int) or isinstance(xid, bool) or xid < 1):
        return "an xid event needs 'xid': a positive code"
    return LiveEvent(gpu, str(kind), xid if kind == "xid" else None)
