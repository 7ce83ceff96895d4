"""The SimBackend contract: it says it is simulated, keeps scenario time from its own
clock and time scale, is reproducible, and is created only from an explicit scenario."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from exporter.backends.base import GpuBackend
from exporter.config import ExporterConfig
from exporter.sim.backend import SimBackend, create
from exporter.sim.scenario import load_scenario
from gpu_audit.errors import ConfigError
from gpu_audit.model.fields import CATALOGUE
from tests.exporter.sim.conftest import START, FakeClock, by_index, open_backend, play

DCGM_KEYS = {m.key for m in CATALOGUE if m.dcgm_only}


def test_open_says_simulated_and_logs_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """open() returns BackendInfo(simulated=True, detail naming the scenario) and logs
    one WARNING on gpu_audit.sim that the data is simulated."""
    backend = SimBackend(load_scenario("busy"), clock=FakeClock())
    protocol = set(GpuBackend.__annotations__) | {
        k for k in GpuBackend.__dict__ if not k.startswith("_")}
    assert protocol == {"name", "open", "sample", "error_counts", "close"}
    assert all(hasattr(backend, member) for member in protocol)
    with caplog.at_level(logging.WARNING, logger="gpu_audit.sim"):
        info = backend.open()
    assert info.name == "sim" and info.simulated and info.detail == "scenario busy"
    warnings = [r for r in caplog.records if r.name == "gpu_audit.sim"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "SIMULATED" in warnings[0].getMessage()


def test_scenario_time_starts_now_by_default() -> None:
    """Without start_time, scenario time starts at the clock's time at open."""
    clock = FakeClock(1_700_000_000.0)
    backend = SimBackend(load_scenario("idle"), clock=clock)
    backend.open()
    assert backend.scenario_time() == 1_700_000_000.0
    clock.advance(10)
    assert backend.scenario_time() == 1_700_000_010.0
    assert backend.elapsed_scenario_seconds == 10.0


def test_time_scale_makes_scenario_time_run_faster() -> None:
    """With time_scale 60 one wall minute plays one scenario hour: the leak grows by an
    hour's worth and XIDs scheduled half an hour in have already happened."""
    fast, fast_clock = open_backend("xid", time_scale=60.0)
    slow, slow_clock = open_backend("xid", time_scale=1.0)
    fast_clock.advance(60)
    slow_clock.advance(60)
    assert fast.elapsed_scenario_seconds == 3600.0
    assert slow.elapsed_scenario_seconds == 60.0
    assert fast.scenario_time() == START + 3600
    assert by_index(fast.sample(fast_clock(), slow=True), 1).up is False
    assert by_index(slow.sample(slow_clock(), slow=True), 1).xid_totals == {}


def test_sampler_now_argument_does_not_move_scenario_time() -> None:
    """The wall-clock `now` the sampler passes is ignored; only the backend's clock counts."""
    a, clock_a = open_backend("busy")
    b, clock_b = open_backend("busy")
    clock_a.advance(30)
    clock_b.advance(30)
    assert a.sample(0.0, slow=True) == b.sample(9e9, slow=True)


def test_same_seed_same_values_and_seed_changes_noise(tmp_path: Path) -> None:
    """Two runs of one scenario over the same clock give identical samples; another seed
    gives different noise."""
    runs = []
    for _ in range(2):
        backend, clock = open_backend("busy")
        seq = []
        for _ in range(5):
            clock.advance(37)
            seq.append(backend.sample(clock(), slow=True))
        runs.append(seq)
    assert runs[0] == runs[1]
    text = Path(load_scenario("busy").source).read_text().replace("seed: 4242", "seed: 99")
    other_file = tmp_path / "busy99.yaml"
    other_file.write_text(text)
    other = SimBackend(load_scenario(str(other_file)), start_time=START, clock=FakeClock())
    other.open()
    other._clock.advance(37)  # type: ignore[attr-defined]
    assert other.sample(0, slow=True) != runs[0][0]


def test_noise_depends_on_time_not_on_how_often_it_is_sampled() -> None:
    """Sampling more often does not change the value at a given scenario time."""
    dense, dense_clock = open_backend("large")
    sparse, sparse_clock = open_backend("large")
    for _ in range(10):
        dense_clock.advance(6)
        dense.sample(dense_clock(), slow=False)
    sparse_clock.advance(60)
    d = by_index(dense.sample(dense_clock(), slow=False), 3)
    s = by_index(sparse.sample(sparse_clock(), slow=False), 3)
    assert d.processes == s.processes
    assert d.scalar("utilization_gpu") == s.scalar("utilization_gpu")


def test_counters_do_not_go_back_when_the_clock_steps_back() -> None:
    """A wall clock stepped backwards freezes scenario time instead of rewinding counters."""
    backend, clock = open_backend("busy")
    clock.advance(600)
    before = by_index(backend.sample(clock(), slow=True), 0).scalar("energy")
    clock.advance(-300)
    after = by_index(backend.sample(clock(), slow=True), 0).scalar("energy")
    assert before is not None and after is not None and after >= before


def test_energy_integrates_power_over_scenario_time() -> None:
    """The energy counter grows by about mean power x elapsed scenario seconds."""
    backend, clock = open_backend("busy")
    e0 = by_index(backend.sample(clock(), slow=True), 0).scalar("energy")
    powers = []
    for _ in range(60):
        clock.advance(10)
        s = by_index(backend.sample(clock(), slow=False), 0)
        powers.append(s.scalar("power_usage") or math.nan)
    e1 = s.scalar("energy")
    assert e0 is not None and e1 is not None
    mean = sum(powers) / len(powers)
    assert e1 - e0 == pytest.approx(mean * 600, rel=0.03)
    assert e0 > 0, "the driver has been up since boot"


def test_slow_tier_is_computed_on_first_sample_then_only_on_slow_cycles() -> None:
    """Slow fields exist from the first sample even if it is a fast cycle, and later
    refresh only when slow=True."""
    backend, clock = open_backend("xid")
    first = by_index(backend.sample(clock(), slow=False), 0)
    assert "ecc_errors" in first.values and "power_limit" in first.values
    clock.advance(7200)
    fast = by_index(backend.sample(clock(), slow=False), 0)
    assert fast.values["ecc_errors"] == first.values["ecc_errors"]
    slow = by_index(backend.sample(clock(), slow=True), 0)
    assert slow.values["ecc_errors"][("corrected", "volatile")] == 8.0  # 4 per hour x 2 h


def test_dcgm_fields_only_when_the_scenario_asks(tmp_path: Path) -> None:
    """By default DCGM profiling keys are unsupported and absent; `dcgm: true` fills them."""
    backend, clock = open_backend("hot")
    plain = by_index(backend.sample(clock(), slow=True), 0)
    assert plain.unsupported >= DCGM_KEYS and not DCGM_KEYS & set(plain.values)
    text = Path(load_scenario("hot").source).read_text().replace("seed: 8787", "dcgm: true")
    path = tmp_path / "hot_dcgm.yaml"
    path.write_text(text)
    dcgm = SimBackend(load_scenario(str(path)), clock=FakeClock())
    dcgm.open()
    s = by_index(dcgm.sample(0, slow=True), 0)
    assert set(s.values) >= DCGM_KEYS and not DCGM_KEYS & s.unsupported
    for key in DCGM_KEYS - {"prof_pcie_tx_bytes", "prof_pcie_rx_bytes"}:
        assert 0.0 <= (s.scalar(key) or -1) <= 1.0


def test_busy_declares_dcgm_profiling_data() -> None:
    """The shipped busy scenario produces every DCGM profiling field, at the ratios it
    declares (before: no shipped scenario produced any, so tensor-core panels were empty
    on every demo)."""
    scenario = load_scenario("busy")
    assert scenario.spec.dcgm is not None
    assert scenario.spec.dcgm.pipe_tensor_active == 0.6
    backend, clock = open_backend("busy")
    for s in backend.sample(clock(), slow=True):
        assert set(s.values) >= DCGM_KEYS and not DCGM_KEYS & s.unsupported
        sm = s.scalar("utilization_gpu") or 0.0
        assert sm > 0.5
        assert s.scalar("prof_pipe_tensor_active") == pytest.approx(sm * 0.6)
        assert s.scalar("prof_gr_engine_active") == pytest.approx(sm * 0.97)
        mem = s.scalar("utilization_memory") or 0.0
        assert s.scalar("prof_pcie_tx_bytes") == pytest.approx(2.5e9 * mem)


def test_dcgm_ratios_are_validated() -> None:
    """A declared profiling ratio outside 0..1 is refused with its line number."""
    from exporter.sim.scenario import parse_scenario
    from gpu_audit.errors import ConfigError

    text = ("name: x\ndcgm:\n  pipe_tensor_active: 1.5\n"
            "gpus:\n  - {count: 1, model: m, memory_total: 1GiB}\n")
    with pytest.raises(ConfigError, match="pipe_tensor_active"):
        parse_scenario(text, "x.yaml")


def test_sample_before_open_is_an_error() -> None:
    """Sampling an unopened backend fails loudly instead of returning nothing."""
    with pytest.raises(RuntimeError, match="open"):
        SimBackend(load_scenario("idle")).sample(0, slow=True)


def test_close_is_idempotent() -> None:
    """close() may be called twice."""
    backend, _ = open_backend("idle")
    backend.close()
    backend.close()


def test_create_needs_a_scenario() -> None:
    """create() with backend sim and no scenario is a ConfigError that names the fix."""
    with pytest.raises(ConfigError) as err:
        create(ExporterConfig(backend="sim"))
    assert "--scenario" in str(err.value) and "busy" in str(err.value)


def test_create_reads_scenario_and_time_scale() -> None:
    """create() loads the named scenario and applies the configured time scale."""
    backend = create(ExporterConfig(backend="sim", scenario="mig", time_scale=30.0))
    assert backend.scenario.name == "mig" and backend.time_scale == 30.0


def test_create_with_unknown_scenario_lists_the_shipped_names() -> None:
    """A scenario that is neither shipped nor a file is a ConfigError naming the choices."""
    with pytest.raises(ConfigError) as err:
        create(ExporterConfig(backend="sim", scenario="bussy"))
    assert "busy, idle, leak, hot, xid, mig, large" in str(err.value)


def test_thermal_violation_time_accumulates_while_throttled() -> None:
    """Scenario hot: GPU 2's thermal violation seconds stay 0 below 87 C and then grow by
    the time spent in thermal slowdown; the cool GPUs and the power policy stay at 0."""
    backend, clock = open_backend("hot")
    last = 0.0
    grew = False
    for t, gpus in play(backend, clock, until=3600, step=60):
        hot, cool = by_index(gpus, 2), by_index(gpus, 0)
        viol = hot.values["violation_time"]
        assert cool.values["violation_time"] == {("power",): 0.0, ("thermal",): 0.0}
        assert viol[("power",)] == 0.0
        assert viol[("thermal",)] >= last  # a counter
        if (hot.scalar("temperature_gpu") or 0) < 87 and t < 1800:
            assert viol[("thermal",)] == 0.0
        grew = grew or viol[("thermal",)] > last
        last = viol[("thermal",)]
    assert grew and 600 <= last <= 1800
