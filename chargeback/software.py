"""What GPU processes ran, from the audit trail: the exporter's `process_start` records
carry a `software` object (docs/AUDIT.md: `loaded`, `libraries` {name: version},
`image`), and the GPU-seconds of each process come from its usage records (version 2
`process` records, version 3 `usage` records' `tasks`). `SoftwareUsage` joins the two by
(host, pid, start ticks) and sums GPU-seconds per software group, for
`gpu-audit chargeback bill --group-by software` and the Slurm per-job report.

Group keys (`group_label`): `software` is the whole fingerprint ("image x; cudart
12.4.127, torch 2.6.0" from the image and every library with a version), `software:NAME`
one library's version ("12.4.127"). A process whose start the trail does not hold, or
whose software the exporter did not read, is in the group NO_RECORD; one that ran
without the named library in NOT_LOADED. Every GPU-second of a process lands in exactly
one group, so the groups add up to the processes' total (the reconciliation).

Pure and deterministic (sorted output, math.fsum): no I/O; values from the trail are
kept only when they match the exporter's allow-lists (names, dotted versions, image
references), so nothing else reaches a report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NO_RECORD = "(no software recorded)"
NOT_LOADED = "(not loaded)"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_VERSION = re.compile(r"^[0-9]{1,8}(\.[0-9]{1,8}){0,3}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
MAX_LIBRARIES = 32

ProcessKey = tuple[str, int, int]  # host, pid, start time in clock ticks


def clean_software(sw: Any) -> dict[str, Any] | None:
    """A trail's `software` object reduced to what the exporter may write: `loaded`
    (sorted names), `libraries` {name: version}, `image`; None when nothing is left."""
    if not isinstance(sw, Mapping):
        return None
    loaded = sorted({n for n in sw.get("loaded") or () if isinstance(n, str)
                     and _NAME.match(n)})[:MAX_LIBRARIES]
    libs_in = sw.get("libraries")
    libs = {} if not isinstance(libs_in, Mapping) else {
        k: v for k, v in sorted(libs_in.items())[:MAX_LIBRARIES]
        if isinstance(k, str) and _NAME.match(k) and isinstance(v, str) and _VERSION.match(v)}
    image = sw.get("image")
    out: dict[str, Any] = {}
    if loaded:
        out["loaded"] = loaded
    if libs:
        out["libraries"] = libs
    if isinstance(image, str) and _IMAGE.match(image):
        out["image"] = image
    return out or None


def describe(sw: Mapping[str, Any] | None) -> str:
    """The whole fingerprint as one label: 'image IMG; cudart 12.4.127, torch 2.6.0'
    (libraries loaded without a version in their file name are named without one)."""
    if not sw:
        return NO_RECORD
    libs: Mapping[str, str] = sw.get("libraries") or {}
    names = sorted(set(sw.get("loaded") or ()) | set(libs))
    parts = ", ".join(f"{n} {libs[n]}" if n in libs else n for n in names)
    image = sw.get("image")
    if image:
        return f"image {image}; {parts}" if parts else f"image {image}"
    return parts or NO_RECORD


def group_label(sw: Mapping[str, Any] | None, key: str) -> str:
    """The group of a process under `key` ('software' or 'software:NAME')."""
    if key == "software":
        return describe(sw)
    name = key.split(":", 1)[1]
    if not sw:
        return NO_RECORD
    version = (sw.get("libraries") or {}).get(name)
    if version:
        return f"{name} {version}"
    if name == "image":
        return str(sw["image"]) if sw.get("image") else NOT_LOADED
    return f"{name} (version unknown)" if name in (sw.get("loaded") or ()) else NOT_LOADED


def valid_key(key: str) -> bool:
    if key == "software":
        return True
    prefix, _, name = key.partition(":")
    return prefix == "software" and bool(_NAME.match(name))


def _num(v: Any) -> float | None:
    if type(v) not in (int, float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f >= 0 else None


@dataclass(slots=True)
class Group:
    label: str
    gpu_seconds: float = 0.0
    processes: int = 0
    users: set[str] = field(default_factory=set)


@dataclass(slots=True)
class SoftwareUsage:
    """Feed it records (`add`); `groups(key)` then sums GPU-seconds per software group.
    `start_ns`/`end_ns`: only usage in (start, end] counts (a process's software is taken
    from its start record whenever that was)."""

    start_ns: int | None = None
    end_ns: int | None = None
    include_simulated: bool = False
    software: dict[ProcessKey, dict[str, Any]] = field(default_factory=dict)
    seconds: dict[ProcessKey, list[float]] = field(default_factory=dict)
    owner: dict[ProcessKey, str] = field(default_factory=dict)
    simulated_left_out: int = 0

    def add(self, rec: Mapping[str, Any]) -> None:
        host = rec.get("host")
        if not isinstance(host, str):
            return
        if (rec.get("simulated") is True or rec.get("sim") is True) \
                and not self.include_simulated:
            self.simulated_left_out += 1
            return
        kind = rec.get("kind")
        if kind == "event" and rec.get("event") == "process_start":
            key = _key(host, rec.get("process"), "pid", "start_time_ticks")
            sw = clean_software(rec.get("software"))
            if key is not None and sw is not None:
                self.software[key] = sw
            return
        t = rec.get("time_ns")
        if not isinstance(t, int) or (self.start_ns is not None and t <= self.start_ns) or (
                self.end_ns is not None and t > self.end_ns):
            return
        if kind == "process":
            key = _key(host, rec.get("process"), "pid", "start_time_ticks")
            secs = _num(rec.get("gpu_seconds"))
            if key is not None and secs is not None:
                self._count(key, secs, _user(rec.get("attribution")))
        elif kind == "usage":
            self._interval(host, rec)

    def _interval(self, host: str, rec: Mapping[str, Any]) -> None:
        """A version 3 record: the holder's GPU-seconds shared by its tasks' time seen
        (as chargeback.slurm.usage shares them among jobs)."""
        tasks = rec.get("tasks")
        total = _num(rec.get("s"))
        if not isinstance(tasks, list) or not total:
            return
        seen = [(k, s) for task in tasks if isinstance(task, Mapping)
                and (k := _key(host, task, "pid", "st")) is not None
                and (s := _num(task.get("s"))) is not None and s > 0]
        whole = math.fsum(s for _, s in seen)
        user = rec.get("user") if isinstance(rec.get("user"), str) else ""
        for k, s in seen:
            self._count(k, total * s / whole, str(user))

    def _count(self, key: ProcessKey, secs: float, user: str) -> None:
        self.seconds.setdefault(key, []).append(secs)
        if user:
            self.owner.setdefault(key, user)

    def total_gpu_seconds(self) -> float:
        return math.fsum(s for parts in self.seconds.values() for s in parts)

    def groups(self, key: str) -> list[Group]:
        """Groups by GPU-seconds, largest first (ties by label): deterministic."""
        parts: dict[str, list[float]] = {}
        out: dict[str, Group] = {}
        for pkey, secs in self.seconds.items():
            label = group_label(self.software.get(pkey), key)
            parts.setdefault(label, []).extend(secs)
            g = out.setdefault(label, Group(label))
            g.processes += 1
            if pkey in self.owner:
                g.users.add(self.owner[pkey])
        for label, g in out.items():
            g.gpu_seconds = math.fsum(parts[label])
        return sorted(out.values(), key=lambda g: (-g.gpu_seconds, g.label))

    def of_processes(self, keys: Iterable[ProcessKey]) -> list[dict[str, Any]]:
        """The distinct software of these processes (for one job's report), sorted."""
        seen = {describe(sw): sw for k in keys if (sw := self.software.get(k)) is not None}
        return [seen[label] for label in sorted(seen)]


def _key(host: str, proc: Any, pid_field: str, ticks_field: str) -> ProcessKey | None:
    if not isinstance(proc, Mapping):
        return None
    pid, ticks = proc.get(pid_field), proc.get(ticks_field, 0)
    if type(pid) is not int:
        return None
    return host, pid, ticks if type(ticks) is int else 0


def _user(attribution: Any) -> str:
    if isinstance(attribution, Mapping):
        u = attribution.get("user") or attribution.get("slurm_user")
        if isinstance(u, str):
            return u
    return ""
