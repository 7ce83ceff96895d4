"""Simulated processes declare their software; a sim run records it as a real host would.

The scenario's `software:` goes into the fake /proc/<pid>/maps (exporter/sim/fakeproc.py),
the real resolver reads it and the audit builder puts it in the process_start events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.sim.fakeproc import SimProcfs
from exporter.sim.scenario import load_scenario
from gpu_audit.audit.builder import build_records
from gpu_audit.errors import ConfigError
from gpu_audit.model.samples import BackendInfo
from gpu_audit.model.snapshot import Snapshot
from tests.exporter.sim.conftest import open_backend


def _first_cycle(scenario: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The records of a scenario's first cycle, attributed through its fake /proc as
    `--backend sim` does (exporter/sim/harness.py)."""
    backend, clock = open_backend(scenario)
    procfs = SimProcfs()
    try:
        gpus = tuple(backend.sample(clock(), slow=True))
        procfs.update(gpus)
        resolver = Resolver(AttributionConfig(procfs_root=procfs.root, jobmap_dir=tmp_path,
                                              passwd_file=procfs.passwd))
        snap = Snapshot(timestamp=clock(), host="sim", backend=BackendInfo("sim", True),
                        gpus=gpus, processes=resolver.attribute(gpus))
        records = build_records(snap, None, stream="exporter", exporter_version="t")
    finally:
        procfs.remove()
    return records


def test_busy_scenario_records_what_each_process_runs(tmp_path: Path) -> None:
    records = _first_cycle("busy", tmp_path)
    starts = {(r["gpu"]["index"], r["process"]["pid"]): r.get("software")
              for r in records if r.get("event") == "process_start"}
    ddp = {"loaded": ["cublas", "cuda", "cudart", "cudnn", "nccl", "torch", "torch_cuda"],
           "libraries": {"cublas": "12.4.5.8", "cuda": "550.54.15", "cudart": "12.4.127",
                         "cudnn": "9.1.0", "nccl": "2.21.5"},
           "image": "pytorch_24.04-py3.sif"}
    assert [starts[(g, 81200 + g)] for g in range(4)] == [ddp] * 4
    notebook = [sw for (g, pid), sw in starts.items() if g == 3 and pid >= 90311]
    assert notebook == [{"loaded": ["cublas", "cuda", "cudart", "cudnn", "torch"],
                         "libraries": {"cublas": "11", "cuda": "550.54.15", "cudart": "11",
                                       "cudnn": "8"}}]
    assert starts[(2, 77015)] is None  # the inference server declares none


def test_bad_software_is_refused_naming_every_problem(tmp_path: Path) -> None:
    text = (Path(__file__).parents[3] / "exporter/sim/scenarios/idle.yaml").read_text()
    bad = text.replace("processes:\n", "processes:\n  - {name: p, pid: 5, gpu: 0, memory: 1GiB,"
                       " software: {cudart: '12.x', evil: '1', nccl: null}}\n", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    with pytest.raises(ConfigError) as err:
        load_scenario(str(path))
    message = str(err.value)
    assert "'evil' is not a known library" in message
    assert "cudart: version '12.x'" in message


def test_mig_scenario_triton_pod(tmp_path: Path) -> None:
    """The MIG scenario's Triton pod records TensorRT and its CUDA runtime."""
    records = _first_cycle("mig", tmp_path)
    (triton,) = [r["software"] for r in records
                 if r.get("event") == "process_start" and r["process"]["pid"] == 12002]
    assert triton["libraries"]["tensorrt"] == "8.6.1"
    assert triton["loaded"] == ["cublas", "cuda", "cudart", "onnxruntime", "tensorrt"]
    assert "image" not in triton
