"""bench/gpu_check_compare.py on canned nvidia-smi CSV and exposition text."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
UUID = "GPU-5d2a9b1c-7e3f-4a10-9c8d-0123456789ab"
MIB = 1024 * 1024


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check_compare",
                                                  ROOT / "bench" / "gpu_check_compare.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check_compare"] = mod
    spec.loader.exec_module(mod)
    return mod


cmp = _load()

QUERY = f"{UUID}, 97, 38, 143771, 4521, 138638, 41, 312.45, 700.00, 1980, 3201, P0, [N/A]\n"
APPS = f"{UUID}, 4242, /usr/bin/python3, 3900\n{UUID}, 4243, python, worker, 120\n"


def _exposition(util: float = 0.95, proc_labels: str = 'user="gpucheck",project='
                '"gpu-audit-check",job="gpucheck-1"', power: float = 318.0) -> str:
    u = f'gpu="0",uuid="{UUID}"'
    return f"""# HELP gpu_up 1 when the GPU was read.
# TYPE gpu_up gauge
gpu_up{{{u}}} 1
# TYPE gpu_utilization_ratio gauge
gpu_utilization_ratio{{{u}}} {util}
# TYPE gpu_memory_controller_utilization_ratio gauge
gpu_memory_controller_utilization_ratio{{{u}}} 0.4
# TYPE gpu_memory_total_bytes gauge
gpu_memory_total_bytes{{{u}}} {143771 * MIB}
# TYPE gpu_memory_used_bytes gauge
gpu_memory_used_bytes{{{u}}} {4000 * MIB}
# TYPE gpu_memory_reserved_bytes gauge
gpu_memory_reserved_bytes{{{u}}} {521 * MIB}
# TYPE gpu_memory_free_bytes gauge
gpu_memory_free_bytes{{{u}}} {138638 * MIB}
# TYPE gpu_temperature_celsius gauge
gpu_temperature_celsius{{{u}}} 42
# TYPE gpu_power_usage_watts gauge
gpu_power_usage_watts{{{u}}} {power}
# TYPE gpu_power_limit_watts gauge
gpu_power_limit_watts{{{u}}} 700
# TYPE gpu_sm_clock_hertz gauge
gpu_sm_clock_hertz{{{u}}} 1.98e9
# TYPE gpu_memory_clock_hertz gauge
gpu_memory_clock_hertz{{{u}}} 3.201e9
# TYPE gpu_performance_state gauge
gpu_performance_state{{{u}}} 0
# TYPE gpu_process_memory_used_bytes gauge
gpu_process_memory_used_bytes{{{u},{proc_labels}}} {4020 * MIB}
"""


def _rows(text: str) -> dict[str, object]:
    rows = cmp.compare(cmp.parse_exposition(text), cmp.parse_query_gpu(QUERY),
                       cmp.parse_compute_apps(APPS))
    return {r.check: r for r in rows}


def test_parsers_read_nvidia_smi_csv() -> None:
    """Query rows map to field names with [N/A] as None; process names may hold commas."""
    (g,) = cmp.parse_query_gpu(QUERY)
    assert g["uuid"] == UUID and g["pstate"] == "P0" and g["fan.speed"] is None
    apps = cmp.parse_compute_apps(APPS + "No running processes found\n")
    assert apps == [(UUID, 4242, "/usr/bin/python3", 3900.0), (UUID, 4243, "python, worker", 120.0)]
    with pytest.raises(ValueError, match="columns"):
        cmp.parse_query_gpu("a, b\n")


def test_matching_values_all_pass() -> None:
    """Values within tolerance pass, including memory.used read with reserved included,
    the per-GPU process memory sum, the identity labels and a fan absent on both sides."""
    rows = _rows(_exposition())
    failed = [r.render() for r in rows.values() if not r.passed]
    assert failed == []
    assert rows["memory.used"].ours == pytest.approx(4521)
    assert rows["fan.speed"].tolerance == "both absent"
    assert rows["process memory (sum)"].theirs == 4020


def test_out_of_tolerance_and_missing_labels_fail(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A utilisation 40 points off, power 200 W off and unlabelled processes each FAIL,
    and the command exits 1."""
    text = _exposition(util=0.55, proc_labels='user="",project="",job=""', power=512.0)
    rows = _rows(text)
    assert not rows["utilization.gpu"].passed
    assert not rows["power.draw"].passed
    assert not rows["process user/project/job"].passed
    assert rows["temperature.gpu"].passed
    m, q, a = tmp_path / "m.txt", tmp_path / "q.csv", tmp_path / "a.csv"
    m.write_text(text)
    q.write_text(QUERY)
    a.write_text(APPS)
    assert cmp.main(["x", str(m), str(q), str(a)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "3 FAIL" in out


def test_value_on_one_side_only_fails() -> None:
    """A metric nvidia-smi reports but we omit is a failure, not a silent pass."""
    text = _exposition().replace("gpu_power_limit_watts{", "gpu_other_watts{")
    assert not _rows(text)["power.limit"].passed
