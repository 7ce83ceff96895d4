"""Malformed scenarios: one ConfigError that lists every problem with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.sim.scenario import load_scenario, parse_scenario
from gpu_audit.errors import EXIT_USAGE, ConfigError

MANY_PROBLEMS = """\
name: broken
seed: 1
colour: blue
gpus:
  - count: 2
    model: NVIDIA H100 80GB HBM3
    memory_total: 80GiB
    uuids: [GPU-aaaa, GPU-aaaa]
  - model: NVIDIA A100-SXM4-80GB
    memory_total: lots
processes:
  - name: a
    pid: 100
    gpu: 0
    memory: 90GiB
  - name: b
    pid: 100
    gpu: 0
    memory: 1GiB
    util: {sm: 1.5}
  - name: c
    pid: 300
    gpu: 7
    memory: 1GiB
    cgroup: "0::/docker-{container}.scope"
  - name: d
    pid: 400
    gpu: 1
    memory: {start: 1GiB, rate: 1MiB}
events:
  - {at: 10, gpu: 9, kind: xid, xid: 13}
  - {at: 20, gpu: 0, kind: xid}
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_scenario(text, "broken.yaml")
    assert err.value.source == "broken.yaml"
    return err.value.problems


def test_every_problem_is_listed_once_with_its_line() -> None:
    """Structural and whole-file problems come back together, each with a line number."""
    problems = problems_of(MANY_PROBLEMS)
    text = "\n".join(problems)
    expected = {
        "line 3: colour: unknown key": "unknown top-level key",
        "line 10: gpus.1.memory_total": "bad size",
        "line 8: gpus.0.uuids.1: duplicate uuid 'GPU-aaaa'": "duplicate uuid",
        "line 15: processes.0.memory: peaks at": "process memory above the GPU's",
        "line 17: processes.1.pid: pid 100 is already on GPU 0": "duplicate pid",
        "line 20: processes.1.util.sm": "ratio above 1",
        "line 25: processes.2.cgroup: unknown placeholder(s) ['container']": "placeholder",
        "line 29: processes.3.memory: grows without bound": "unbounded leak",
        "line 32: events.1": "xid event without a code",
    }
    for needle, what in expected.items():
        assert any(p.startswith(needle) for p in problems), f"{what} missing:\n{text}"
    # GPU 1 failed validation, so unknown-GPU checks are not run against a wrong count.
    assert not any("no such GPU" in p for p in problems), text
    assert all(p.startswith("line ") for p in problems), text
    assert len(problems) == len(expected)


def test_unknown_gpu_references_are_reported_when_gpus_are_valid() -> None:
    """A process or event naming a GPU the scenario does not have is a problem."""
    text = MANY_PROBLEMS.replace("memory_total: lots", "memory_total: 80GiB")
    problems = problems_of(text)
    assert any(p.startswith("line 23: processes.2.gpu: no such GPU [7]") for p in problems)
    assert any(p.startswith("line 31: events.0.gpu: no such GPU 9") for p in problems)


def test_unknown_nested_keys_are_rejected() -> None:
    """A misspelt key anywhere (here inside a curve and a GPU) is an error, not ignored."""
    text = """\
name: typo
gpus:
  - model: X
    memroy_total: 80GiB
processes:
  - {name: p, pid: 1, gpu: 0, memory: {value: 1GiB, nosie: 3}}
"""
    problems = problems_of(text)
    assert any(p.startswith("line 4: gpus.0.memroy_total: unknown key") for p in problems)
    assert any("processes.0.memory.nosie: unknown key" in p for p in problems)


def test_concurrent_processes_over_the_budget_are_reported() -> None:
    """Processes that each fit but together exceed the GPU's memory are a problem; ones
    that never run at the same time are not."""
    base = """\
name: crowded
gpus: [{memory_total: 80GiB}]
processes:
  - {name: a, pid: 1, gpu: 0, memory: 50GiB, end: 100}
  - {name: b, pid: 2, gpu: 0, memory: 50GiB, start: START}
"""
    assert any("peak total" in p for p in problems_of(base.replace("START", "50")))
    assert parse_scenario(base.replace("START", "100"), "ok.yaml").processes


def test_mig_layout_problems() -> None:
    """Invalid profiles, over-subscribed slices, duplicate instance ids and processes
    without (or with a wrong) instance on a MIG GPU are all reported."""
    text = """\
name: badmig
gpus:
  - model: NVIDIA A100-SXM4-80GB
    memory_total: 80GiB
    mig:
      - {profile: 4g.40gb, gpu_instance_id: 1}
      - {profile: 4g.40gb, gpu_instance_id: 1}
      - {profile: 5g.50gb, gpu_instance_id: 2}
  - model: NVIDIA A100-SXM4-80GB
processes:
  - {name: a, pid: 1, gpu: 0, memory: 1GiB}
  - {name: b, pid: 2, gpu: 0, mig: 9, memory: 1GiB}
  - {name: c, pid: 3, gpu: 1, mig: 1, memory: 1GiB}
"""
    problems = problems_of(text)
    joined = "\n".join(problems)
    assert "unknown MIG profile '5g.50gb'" in joined
    valid = text.replace("5g.50gb", "1g.10gb")
    joined = "\n".join(problems_of(valid))
    assert "duplicate gpu_instance_id 1" in joined
    assert "9 compute slices" in joined
    assert "processes.0.mig: GPU 0 is in MIG mode" in joined
    assert "processes.1.mig: GPU 0 has no MIG instance 9" in joined
    assert "processes.2.mig: GPU 1 is not in MIG mode" in joined
    shared = text.replace("5g.50gb", "1g.10gb").replace(
        "  - model: NVIDIA A100-SXM4-80GB\n    memory_total: 80GiB\n",
        "  - model: NVIDIA A100-SXM4-80GB\n    count: 2\n    memory_total: 80GiB\n", 1,
    ).replace("gpu_instance_id: 2}", "gpu_instance_id: 2, uuid: MIG-1}")
    assert "an explicit MIG uuid needs a GPU group with count 1" in "\n".join(
        problems_of(shared))


def test_overlapping_lost_periods_and_bad_event_times() -> None:
    """Two lost periods of one GPU may not overlap; recovery must follow the loss."""
    text = """\
name: lost
gpus: [{count: 2}]
events:
  - {at: 10, gpu: 0, kind: lost, until: 100}
  - {at: 50, gpu: 0, kind: lost}
  - {at: 50, gpu: 1, kind: lost, until: 20}
"""
    joined = "\n".join(problems_of(text))
    assert "events.1: overlaps another lost period of GPU 0" in joined
    assert "until must be after at" in joined


def test_not_yaml_and_not_a_mapping() -> None:
    """Broken YAML names its line; a list at the top level is refused clearly."""
    with pytest.raises(ConfigError, match="line 3, column 1: not valid YAML"):
        parse_scenario("name: x\ngpus: [\n", "x.yaml")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_scenario("- a\n- b\n", "x.yaml")


def test_missing_file_lists_shipped_names(tmp_path: Path) -> None:
    """A path that does not exist is a ConfigError naming the shipped scenarios."""
    with pytest.raises(ConfigError) as err:
        load_scenario(str(tmp_path / "nope.yaml"))
    assert "busy, idle, leak, hot, xid, mig, large" in str(err.value)


def test_bad_file_on_disk_reports_its_path(tmp_path: Path) -> None:
    """load_scenario on a bad file names the file as the source, exit code 2 territory."""
    path = tmp_path / "bad.yaml"
    path.write_text(MANY_PROBLEMS)
    with pytest.raises(ConfigError) as err:
        load_scenario(str(path))
    assert err.value.source == str(path)
    assert str(err.value).startswith(f"{path}: 9 problem(s)")
    assert EXIT_USAGE == 2
