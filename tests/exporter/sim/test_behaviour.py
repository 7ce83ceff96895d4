"""Each shipped scenario shows the behaviour it exists for (the story in its header)."""

from __future__ import annotations

from pathlib import Path

from exporter.sim.backend import SimBackend
from exporter.sim.scenario import load_scenario
from gpu_audit.model.fields import CLOCK_EVENT_REASONS
from tests.exporter.sim.conftest import START, FakeClock, by_index, open_backend, play

GiB = 1024**3


def test_busy_is_healthy_and_busy() -> None:
    """busy: four H100s at high utilisation, moderate temperatures, no throttling."""
    backend, clock = open_backend("busy")
    for _, samples in play(backend, clock, 7200, 300):
        for s in samples:
            assert s.up
            util = s.scalar("utilization_gpu")
            assert util is not None and util > 0.7
            temp = s.scalar("temperature_gpu")
            assert temp is not None and 50 <= temp <= 75
            reasons = s.values["clock_event_reason"]
            assert reasons[("sw_thermal_slowdown",)] == 0.0
            assert reasons[("hw_thermal_slowdown",)] == 0.0
            assert s.scalar("performance_state") == 0.0
            assert len(s.values["nvlink_up"]) == 18


def test_idle_holds_30_gib_at_zero_util_for_hours() -> None:
    """idle: GPU 1 holds 30 GiB at ~0% for the whole 8 hours while the others work."""
    backend, clock = open_backend("idle")
    seen = 0
    for _, samples in play(backend, clock, 8 * 3600, 600):
        idle = by_index(samples, 1)
        assert idle.scalar("memory_used") == 30 * GiB
        util = idle.scalar("utilization_gpu")
        assert util is not None and util < 0.01
        assert [p.pid for p in idle.processes] == [51001]
        for other in (0, 2, 3):
            busy_util = by_index(samples, other).scalar("utilization_gpu")
            assert busy_util is not None and busy_util > 0.6
        seen += 1
    assert backend.elapsed_scenario_seconds >= 8 * 3600
    assert seen >= 48


def test_leak_memory_grows_steadily_until_near_full() -> None:
    """leak: pid 33120 grows 50 MiB a minute, stops near full, and nothing else grows."""
    backend, clock = open_backend("leak", time_scale=60.0)
    history: list[tuple[float, int]] = []
    other: set[int] = set()
    for t, samples in play(backend, clock, 20 * 3600, 1800):
        leak = by_index(samples, 0).processes[0]
        assert leak.pid == 33120 and leak.used_memory_bytes is not None
        history.append((t, leak.used_memory_bytes))
        other.add(round((by_index(samples, 1).processes[0].used_memory_bytes or 0) / GiB))
    mems = [m for _, m in history]
    assert mems == sorted(mems)
    t1, m1 = history[1]
    t2, m2 = history[4]
    per_minute = (m2 - m1) / ((t2 - t1) / 60)
    assert abs(per_minute - 50 * 1024**2) < 1024
    assert mems[-1] == 76 * GiB, "stops growing at its max"
    assert other == {40}


def test_hot_gpu_throttles_with_reasons_and_lower_clock() -> None:
    """hot: GPU 2 climbs to ~92 C; above 87 C sw_thermal_slowdown, above 90 C
    hw_thermal_slowdown, each with a lower SM clock; the other GPUs stay cool."""
    backend, clock = open_backend("hot")
    early = by_index(backend.sample(clock(), slow=True), 2)
    assert early.values["clock_event_reason"][("sw_thermal_slowdown",)] == 0.0
    cool_clock = early.scalar("clock_sm")
    clock.advance(2200)
    warm = by_index(backend.sample(clock(), slow=False), 2)
    warm_temp = warm.scalar("temperature_gpu")
    assert warm_temp is not None and 87 <= warm_temp < 90
    assert warm.values["clock_event_reason"][("sw_thermal_slowdown",)] == 1.0
    assert warm.values["clock_event_reason"][("hw_thermal_slowdown",)] == 0.0
    clock.advance(1800)
    samples = backend.sample(clock(), slow=False)
    hot = by_index(samples, 2)
    temp = hot.scalar("temperature_gpu")
    assert temp is not None and 91 <= temp <= 93
    reasons = hot.values["clock_event_reason"]
    assert reasons[("sw_thermal_slowdown",)] == 1.0
    assert reasons[("hw_thermal_slowdown",)] == 1.0
    assert set(reasons) == {(r,) for r in CLOCK_EVENT_REASONS}
    assert cool_clock is not None and warm.scalar("clock_sm") is not None
    assert hot.scalar("clock_sm") < warm.scalar("clock_sm") < cool_clock  # type: ignore[operator]
    assert hot.scalar("fan_speed") == 1.0
    assert "temperature_memory" in hot.unsupported
    for i in (0, 1, 3):
        other = by_index(samples, i)
        other_temp = other.scalar("temperature_gpu")
        assert other_temp is not None and other_temp < 80
        assert other.values["clock_event_reason"][("sw_thermal_slowdown",)] == 0.0
        assert other.scalar("clock_sm") == cool_clock


def test_xid_errors_then_one_gpu_lost_while_others_report() -> None:
    """xid: XID counters rise at their scheduled times with timestamps; XID 48 raises
    uncorrected ECC and remapped rows; GPU 1 is then lost (up=False, gpu_lost, no values)
    while GPUs 0, 2, 3 keep reporting every value."""
    backend, clock = open_backend("xid")
    first = backend.sample(clock(), slow=True)
    assert all(s.up and not s.xid_totals for s in first)
    clock.advance(1000)
    mid = backend.sample(clock(), slow=True)
    gpu1 = by_index(mid, 1)
    assert gpu1.xid_totals == {13: 2}
    assert [e.xid for e in gpu1.new_xids] == [13, 13]
    assert gpu1.xid_last_timestamp == START + 900
    assert by_index(mid, 3).xid_totals == {31: 1}
    ecc_before = by_index(mid, 2).values["ecc_errors"][("uncorrected", "volatile")]
    clock.advance(300)
    after_dbe = by_index(backend.sample(clock(), slow=True), 2)
    assert after_dbe.xid_totals == {48: 1}
    assert after_dbe.values["ecc_errors"][("uncorrected", "volatile")] == ecc_before + 1
    assert after_dbe.values["remapped_rows"][("uncorrectable",)] == 1.0
    assert after_dbe.values["remapped_rows_pending"][()] == 1.0
    clock.advance(600)
    lost_cycle = backend.sample(clock(), slow=False)
    lost = by_index(lost_cycle, 1)
    assert not lost.up and lost.error == "gpu_lost"
    assert not lost.values and not lost.processes
    assert lost.xid_totals == {13: 2, 79: 1}
    assert [e.xid for e in lost.new_xids] == [79]
    full_keys = set(by_index(first, 0).values)
    for i in (0, 2, 3):
        s = by_index(lost_cycle, i)
        assert s.up and set(s.values) == full_keys and s.processes
    clock.advance(60)
    backend.sample(clock(), slow=False)
    assert backend.error_counts() == {"gpu_lost": 2}


def test_mig_instances_and_processes_carry_instance_ids() -> None:
    """mig: GPU 0 lists its three MIG instances with per-instance memory; its processes
    carry gpu/compute instance ids and no utilisation; utilisation is unsupported on the
    parent like on real hardware, while the whole GPU 1 reports it."""
    backend, clock = open_backend("mig")
    clock.advance(1200)
    samples = backend.sample(clock(), slow=True)
    parent = by_index(samples, 0)
    assert parent.info.mig_mode
    assert [(m.profile, m.gpu_instance_id) for m in parent.mig] == [
        ("3g.40gb", 2), ("2g.20gb", 3), ("2g.20gb", 4)]
    assert all(m.uuid.startswith("MIG-") and m.memory_total_bytes for m in parent.mig)
    for key in ("utilization_gpu", "utilization_memory", "utilization_encoder",
                "utilization_decoder"):
        assert key in parent.unsupported and key not in parent.values
    by_gi = {p.gpu_instance_id: p for p in parent.processes}
    assert set(by_gi) == {2, 3, 4}
    for p in parent.processes:
        assert p.compute_instance_id == 0
        assert p.sm_util_ratio is None and p.memory_util_ratio is None
    for inst in parent.mig:
        assert inst.memory_used_bytes == by_gi[inst.gpu_instance_id].used_memory_bytes
        assert inst.memory_used_bytes is not None and inst.memory_total_bytes is not None
        assert inst.memory_used_bytes <= inst.memory_total_bytes
    assert parent.scalar("power_usage") > 100  # type: ignore[operator]
    whole = by_index(samples, 1)
    assert not whole.info.mig_mode and not whole.mig
    assert whole.scalar("utilization_gpu") is not None
    assert whole.processes[0].gpu_instance_id is None


def test_processes_appear_and_leave_at_their_times() -> None:
    """A process with start/end is absent before its start and after its end."""
    backend, clock = open_backend("busy")
    before = by_index(backend.sample(clock(), slow=True), 1)
    assert 93102 not in {p.pid for p in before.processes}
    clock.advance(700)
    during = by_index(backend.sample(clock(), slow=False), 1)
    assert 93102 in {p.pid for p in during.processes}
    clock.advance(4000)
    after = by_index(backend.sample(clock(), slow=False), 1)
    assert 93102 not in {p.pid for p in after.processes}


RECOVERY = """\
name: recovery
seed: 3
gpus:
  - count: 2
    model: Tesla V100-SXM2-32GB
    memory_total: 32GiB
    power_limit_watts: 300
    idle_power_watts: 40
    retired_pages: {single_bit_ecc: 2}
    remapped_rows: null
processes:
  - {name: python, pid: 10, gpu: all, memory: 8GiB, util: {sm: 0.5}}
events:
  - {at: 100, gpu: 0, kind: xid, xid: 48}
  - {at: 200, gpu: 0, kind: xid, xid: 79}
  - {at: 200, gpu: 0, kind: lost, until: 500}
"""


def test_lost_gpu_recovers_at_its_time_with_counters_intact(tmp_path: Path) -> None:
    """A GPU lost with `until` comes back up with its values; energy and XID totals
    continue from where they were; XID 48 retires a page where retired pages exist."""
    path = tmp_path / "recovery.yaml"
    path.write_text(RECOVERY)
    backend = SimBackend(load_scenario(str(path)), start_time=START, clock=(clock := FakeClock()))
    backend.open()
    clock.advance(150)
    before = by_index(backend.sample(clock(), slow=True), 0)
    assert before.values["retired_pages"] == {("single_bit_ecc",): 2.0, ("double_bit_ecc",): 1.0}
    assert before.values["retired_pages_pending"][()] == 1.0
    assert "remapped_rows" in before.unsupported
    clock.advance(100)
    down = backend.sample(clock(), slow=False)
    assert not by_index(down, 0).up and by_index(down, 1).up
    clock.advance(300)
    back = by_index(backend.sample(clock(), slow=False), 0)
    assert back.up and back.processes and back.xid_totals == {48: 1, 79: 1}
    assert back.scalar("energy") >= before.scalar("energy")  # type: ignore[operator]
    assert backend.error_counts() == {"gpu_lost": 1}


def test_xid_48_raises_ecc_and_row_remapping_on_a_fast_cycle() -> None:
    """xid: the double-bit ECC error (XID 48 at t=1200) shows in the uncorrected ECC count
    and the remap-pending flag in the very sample that reports the XID, a fast cycle, as
    the NVML backend re-reads memory errors on such an XID."""
    backend, clock = open_backend("xid")
    backend.sample(clock(), slow=True)
    clock.advance(1199)
    before = by_index(backend.sample(clock(), slow=False), 2)
    assert before.values["remapped_rows_pending"][()] == 0.0
    clock.advance(2)
    after = by_index(backend.sample(clock(), slow=False), 2)
    assert [e.xid for e in after.new_xids] == [48]
    assert after.values["ecc_errors"][("uncorrected", "volatile")] == (
        before.values["ecc_errors"][("uncorrected", "volatile")] + 1)
    assert after.values["remapped_rows_pending"][()] == 1.0
