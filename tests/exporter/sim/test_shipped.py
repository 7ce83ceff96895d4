"""Every shipped scenario loads, plays over its whole span and keeps the invariants
every consumer relies on."""

from __future__ import annotations

import math

import pytest

from exporter.sim.scenario import SHIPPED, load_scenario, shipped_path
from gpu_audit.model.fields import BY_KEY, CATALOGUE
from tests.exporter.sim.conftest import open_backend, play

RATIO_KEYS = frozenset(m.key for m in CATALOGUE if m.name.endswith("_ratio"))
COUNTER_KEYS = frozenset(m.key for m in CATALOGUE if m.type == "counter")
SLOW_KEYS = frozenset(m.key for m in CATALOGUE if m.tier == "slow")


def test_shipped_names_are_the_seven_agreed() -> None:
    """The short names other components and the CLI rely on exist as packaged files."""
    assert SHIPPED == ("busy", "idle", "leak", "hot", "xid", "mig", "large")
    for name in SHIPPED:
        assert shipped_path(name).is_file()
        text = shipped_path(name).read_text()
        assert text.startswith(f"# {name}:"), "each file opens with its documented story"


@pytest.mark.parametrize("name", SHIPPED)
def test_scenario_keeps_invariants_over_its_span(name: str) -> None:
    """Memory fits, ratios stay in 0..1, counters never go back, no NaN, no unsupported
    key in values, labels match the catalogue, and slow fields change only on slow cycles."""
    scenario = load_scenario(name)
    assert scenario.name == name
    backend, clock = open_backend(name)
    step = scenario.duration_seconds / 90
    last_counters: dict[tuple[str, str, tuple[str, ...]], float] = {}
    last_slow: dict[str, dict[str, object]] = {}
    cycles = 0
    for i, (_, samples) in enumerate(play(backend, clock, scenario.duration_seconds, step)):
        slow = i % 6 == 0
        cycles += 1
        assert len({s.uuid for s in samples}) == len(scenario.gpus)
        for s in samples:
            if not s.up:
                assert s.error and not s.values and not s.processes
                continue
            assert not (s.unsupported & set(s.values)), "unsupported keys must be absent"
            assert set(s.values) | s.unsupported == set(BY_KEY), "each key measured or declared"
            assert s.info.driver_version and s.info.cuda_version
            for key, series in s.values.items():
                assert key in BY_KEY, key
                for labels, value in series.items():
                    assert len(labels) == len(BY_KEY[key].labels), (key, labels)
                    assert math.isfinite(value), (key, labels, value)
                    if key in RATIO_KEYS:
                        assert 0.0 <= value <= 1.0, (key, value)
                    if key in COUNTER_KEYS:
                        k = (s.uuid, key, labels)
                        assert value >= last_counters.get(k, 0.0), (key, labels)
                        assert value >= 0
                        last_counters[k] = value
            total = s.scalar("memory_total")
            used = s.scalar("memory_used")
            free = s.scalar("memory_free")
            reserved = s.scalar("memory_reserved")
            assert total is not None and used is not None and free is not None
            assert reserved is not None
            assert used <= total
            assert used + free + reserved == pytest.approx(total)
            assert used == sum(p.used_memory_bytes or 0 for p in s.processes)
            for p in s.processes:
                assert p.identity is not None and p.identity.pid == p.pid
                for ratio in (p.sm_util_ratio, p.memory_util_ratio, p.encoder_util_ratio,
                              p.decoder_util_ratio):
                    assert ratio is None or (math.isfinite(ratio) and 0.0 <= ratio <= 1.0)
            slow_now = {k: v for k, v in s.values.items() if k in SLOW_KEYS}
            if not slow and s.uuid in last_slow:
                assert slow_now == last_slow[s.uuid], "slow tier refreshed on a fast cycle"
            last_slow[s.uuid] = dict(slow_now)
    assert cycles >= 90


@pytest.mark.parametrize("name", SHIPPED)
def test_scenario_identities_are_complete(name: str) -> None:
    """Every process carries pid, uid, start ticks and cgroup/environ text that
    attribution can write into a fake /proc."""
    scenario = load_scenario(name)
    assert scenario.processes
    for p in scenario.processes:
        ident = p.identity
        assert ident.pid == p.pid and ident.uid == p.uid
        assert ident.start_time_ticks is not None and ident.start_time_ticks >= 0
        assert "{" not in ident.cgroup, "placeholders are filled"
        assert all("{" not in v for v in ident.environ.values())


def test_identity_formats_cover_every_runtime() -> None:
    """Across the shipped scenarios there are Docker, kubepods/containerd, Slurm v2 and
    v1 cgroups and bare processes; busy alone holds a mix of four kinds."""
    cgroups = [p.identity.cgroup for n in SHIPPED for p in load_scenario(n).processes]
    assert any(c.startswith("0::/system.slice/docker-") and c.rstrip().endswith(".scope")
               for c in cgroups)
    assert any("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" in c
               and "/cri-containerd-" in c for c in cgroups)
    assert any("0::/system.slice/slurmstepd.scope/job_" in c for c in cgroups)
    assert any(c.startswith("12:devices:/slurm/uid_1007/job_1234/step_0") for c in cgroups)
    assert any(c.startswith("0::/user.slice/") for c in cgroups)
    busy = load_scenario("busy").processes
    kinds = {
        "slurm" if "slurmstepd" in p.identity.cgroup else
        "docker" if "docker-" in p.identity.cgroup else
        "k8s" if "kubepods" in p.identity.cgroup else "bare"
        for p in busy
    }
    assert kinds == {"slurm", "docker", "k8s", "bare"}
    bare = [p for p in busy if "user.slice" in p.identity.cgroup]
    assert bare and set(bare[0].identity.environ) == {"USER", "JOB_ID", "PROJECT_NAME"}


def test_large_generates_distinct_pods_and_containers() -> None:
    """`large` expands one template into 8 x 64 processes with unique pids per GPU and
    a distinct pod uid and 64-hex container id each."""
    scenario = load_scenario("large")
    assert len(scenario.gpus) == 8
    assert len(scenario.processes) == 512
    for g in range(8):
        assert sum(1 for p in scenario.processes if p.gpu_index == g) == 64
    cgroups = {p.identity.cgroup for p in scenario.processes}
    assert len(cgroups) == 512
    sample = next(iter(cgroups))
    container = sample.rsplit("cri-containerd-", 1)[1].split(".scope", 1)[0]
    assert len(container) == 64 and all(c in "0123456789abcdef" for c in container)
    pod = sample.split("kubepods-burstable-pod", 1)[1].split(".slice", 1)[0]
    assert len(pod) == 36 and pod.count("_") == 4
    assert len({p.pid for p in scenario.processes}) == 512
