"""Shared builders for attribution tests: GPU samples, processes, pid directories."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.sim.fakeproc import write_fake_proc
from gpu_audit.model.samples import GpuInfo, GpuSample, MigInstance, ProcessIdentity, ProcessSample

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-000000000000"
USERS = {1000: "alice", 1001: "bob", 0: "root"}


def proc(
    pid: int,
    *,
    uid: int | None = 1000,
    environ: Mapping[str, str] | None = None,
    cgroup: str = "",
    start: int | None = None,
    name: str = "python3",
    gpu_instance_id: int | None = None,
    software: Mapping[str, str] | None = None,
) -> ProcessSample:
    return ProcessSample(
        pid=pid,
        name=name,
        used_memory_bytes=1 << 30,
        gpu_instance_id=gpu_instance_id,
        identity=ProcessIdentity(
            pid=pid,
            uid=uid,
            start_time_ticks=start,
            environ=dict(environ or {}),
            cgroup=cgroup,
            software=dict(software or {}),
        ),
    )


def gpu(uuid: str, *procs: ProcessSample, index: int = 0,
        mig: tuple[MigInstance, ...] = ()) -> GpuSample:
    return GpuSample(info=GpuInfo(uuid=uuid, index=index), processes=procs, mig=mig)


def make_tree(root: Path, *procs: ProcessSample) -> Path:
    write_fake_proc(root, procs)
    return root


def config(tmp_path: Path, **overrides: Any) -> AttributionConfig:
    values: dict[str, Any] = {
        "procfs_root": tmp_path / "proc",
        "jobmap_dir": tmp_path / "jobs",
    }
    values.update(overrides)
    return AttributionConfig(**values)


def resolver(cfg: AttributionConfig, **kwargs: Any) -> Resolver:
    kwargs.setdefault("user_lookup", USERS.get)
    return Resolver(cfg, **kwargs)


def write_job(directory: Path, name: str, doc: Mapping[str, Any] | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def only(result: Mapping[str, tuple[Any, ...]], uuid: str = GPU0) -> Any:
    """The attribution of the single process on `uuid`."""
    (attributed,) = result[uuid]
    return attributed.attribution
