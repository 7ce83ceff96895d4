"""The dcgm-exporter compatibility profile on rendered expositions: a lost GPU keeps its
last XID, dcgm-exporter's labels by default, every compat field equal to its native
value in dcgm-exporter's unit, per-MIG-instance series, pod labels, the host label."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import CompatConfig
from exporter.exposition.compat import COMPAT_NAMES, XID_NAME
from exporter.exposition.render import Renderer, RenderOptions, render_snapshot
from exporter.sim.backend import SimBackend
from exporter.sim.scenario import load_scenario
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.samples import ProcessSample
from gpu_audit.model.snapshot import Snapshot
from tests.exporter.exposition.snapshots import UUID0, UUID1, small_snapshot

T0 = 1_800_000_000.0
MIB = 1024 * 1024
COMPAT = RenderOptions(dcgm_compat=True)

Sample = tuple[str, dict[str, str], float]


def parse(body: bytes) -> list[Sample]:
    return [(s.name, dict(s.labels), s.value)
            for f in text_string_to_metric_families(body.decode()) for s in f.samples]


def env_attribution(p: ProcessSample) -> Attribution:
    env = p.identity.environ if p.identity else {}
    return Attribution(user=env.get("USER", ""), project=env.get("PROJECT_NAME", ""),
                       sources={"user": "environ"} if env.get("USER") else {})


def sim_snapshots(name: str, times: Iterable[float],
                  attribute: Callable[[ProcessSample], Attribution] = env_attribution,
                  ) -> list[Snapshot]:
    """Snapshots of a shipped scenario at the given scenario times (every cycle slow)."""
    now = [0.0]
    backend = SimBackend(load_scenario(name), start_time=T0, clock=lambda: now[0])
    info = backend.open()
    out = []
    for cycle, t in enumerate(times):
        now[0] = t
        gpus = tuple(backend.sample(0.0, slow=True))
        procs = {g.uuid: tuple(AttributedProcess(g.uuid, p, attribute(p)) for p in g.processes)
                 for g in gpus}
        out.append(Snapshot(timestamp=T0 + t, host="sim-node", backend=info, gpus=gpus,
                            processes=procs, interval_seconds=5.0, cycle=cycle))
    return out


# --- 1. a lost GPU keeps its last XID ---------------------------------------------------

def test_lost_gpu_keeps_its_last_xid_with_identity_labels() -> None:
    """A down GPU's DCGM_FI_DEV_XID_ERRORS stays, with gpu, UUID, pci_bus_id, device and
    modelName; it is that GPU's only compat series (before: it vanished with the GPU)."""
    data = parse(render_snapshot(small_snapshot(), COMPAT).body)
    lost = [(n, lb, v) for n, lb, v in data if n.startswith("DCGM_") and lb["gpu"] == "1"]
    assert lost == [(XID_NAME, {
        "gpu": "1", "UUID": UUID1, "pci_bus_id": "00000000:0F:00.0", "device": "nvidia1",
        "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node-1",
        "DCGM_FI_DRIVER_VERSION": "535.104.05", "simulated": "true"}, 79.0)]


def test_xid_scenario_gpu_lost_at_79_reads_79_until_the_end() -> None:
    """Scenario xid: GPU 1 gets XID 79 and is lost at t=1800; its compat XID reads 13
    before and 79 on every cycle after, while the native gpu_up says 0."""
    r = Renderer(COMPAT)
    seen = []
    for snap in sim_snapshots("xid", [1000, 1799, 1800, 2400, 3600]):
        data = parse(r.render(snap).body)
        xid = {lb["gpu"]: v for n, lb, v in data if n == XID_NAME}
        up = {lb["gpu"]: v for n, lb, v in data if n == "gpu_up"}
        seen.append((xid.get("1"), up["1"]))
        assert xid["0"] == 0 and len(xid) == 4
    assert seen == [(13, 1), (13, 1), (79, 0), (79, 0), (79, 0)]


# --- 2 and 7. dcgm-exporter's labels, the host label ----------------------------------

def test_model_name_label_by_default() -> None:
    """Every compat series carries modelName as dcgm-exporter does (before: only in exact
    mode, so rules grouping by modelName got nothing)."""
    data = [(n, lb) for n, lb, _ in parse(render_snapshot(small_snapshot(), COMPAT).body)
            if n.startswith("DCGM_")]
    assert len(data) > 15
    assert {lb.get("modelName") for _, lb in data} == {"NVIDIA A100-SXM4-80GB"}
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in {n for n, _ in data}


@pytest.mark.parametrize("label", ["Hostname", "hostname"])
def test_host_label_name_is_a_setting(label: str) -> None:
    """The host label is named as configured: Hostname (released) or hostname (main)."""
    opts = RenderOptions(dcgm_compat=True, dcgm_host_label=label)
    data = [lb for n, lb, _ in parse(render_snapshot(small_snapshot(), opts).body)
            if n.startswith("DCGM_")]
    assert {lb.get(label) for lb in data} == {"node-1"}
    other = "hostname" if label == "Hostname" else "Hostname"
    assert not any(other in lb for lb in data)


def test_host_label_config_defaults_and_validation() -> None:
    """The YAML default is dcgm-exporter's released name; an invalid or clashing label
    name is refused."""
    assert CompatConfig().host_label == "Hostname"
    assert CompatConfig(host_label="hostname").host_label == "hostname"
    for bad in ("host-name", "__host", "UUID", "9host"):
        with pytest.raises(ValueError, match="label"):
            CompatConfig(host_label=bad)


# --- 3. every compat field equals its native value in dcgm-exporter's unit --------------

# nvml.h nvmlClocksEventReason* bits, written out here independently of the code.
_REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
                "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
                "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
                "display_clock_setting": 0x100}

# compat name -> (native name, label filter, how the native samples become the value)
_SUM = Callable[[list[tuple[dict[str, str], float]]], float]


def _one(scale: float) -> _SUM:
    def f(rows: list[tuple[dict[str, str], float]]) -> float:
        assert len(rows) == 1, rows
        return rows[0][1] * scale
    return f


def _bits(rows: list[tuple[dict[str, str], float]]) -> float:
    return float(sum(_REASON_BITS[lb["reason"]] for lb, v in rows if v))


def _kib(rows: list[tuple[dict[str, str], float]]) -> float:
    return sum(v for _, v in rows) / 1024


NATIVE: dict[str, tuple[str, dict[str, str], _SUM]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio", {}, _one(100)),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_controller_utilization_ratio", {}, _one(100)),
    "DCGM_FI_DEV_ENC_UTIL": ("gpu_encoder_utilization_ratio", {}, _one(100)),
    "DCGM_FI_DEV_DEC_UTIL": ("gpu_decoder_utilization_ratio", {}, _one(100)),
    "DCGM_FI_DEV_FB_TOTAL": ("gpu_memory_total_bytes", {}, _one(1 / MIB)),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", {}, _one(1 / MIB)),
    "DCGM_FI_DEV_FB_FREE": ("gpu_memory_free_bytes", {}, _one(1 / MIB)),
    "DCGM_FI_DEV_FB_RESERVED": ("gpu_memory_reserved_bytes", {}, _one(1 / MIB)),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", {}, _one(1)),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_memory_temperature_celsius", {}, _one(1)),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_usage_watts", {}, _one(1)),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpu_energy_joules_total", {}, _one(1000)),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_hertz", {}, _one(1e-6)),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpu_memory_clock_hertz", {}, _one(1e-6)),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gpu_remapped_rows_pending", {}, _one(1)),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gpu_remapped_rows_failure", {}, _one(1)),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_errors_total", {}, _one(1)),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gpu_graphics_engine_active_ratio", {}, _one(1)),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpu_tensor_pipe_active_ratio", {}, _one(1)),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpu_dram_active_ratio", {}, _one(1)),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpu_pcie_transmit_bytes_per_second", {}, _one(1)),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpu_pcie_receive_bytes_per_second", {}, _one(1)),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gpu_clock_event_reason_active", {}, _bits),
    "DCGM_FI_DEV_POWER_VIOLATION": ("gpu_clock_violation_seconds_total",
                                    {"policy": "power"}, _one(1e6)),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("gpu_clock_violation_seconds_total",
                                      {"policy": "thermal"}, _one(1e6)),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("gpu_ecc_errors_total",
                                      {"error_type": "corrected", "counter": "volatile"},
                                      _one(1)),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("gpu_ecc_errors_total",
                                      {"error_type": "uncorrected", "counter": "volatile"},
                                      _one(1)),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("gpu_ecc_errors_total",
                                      {"error_type": "corrected", "counter": "aggregate"},
                                      _one(1)),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("gpu_ecc_errors_total",
                                      {"error_type": "uncorrected", "counter": "aggregate"},
                                      _one(1)),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("gpu_nvlink_data_bytes_total", {}, _kib),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows", {"cause": "correctable"},
                                              _one(1)),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows",
                                                {"cause": "uncorrectable"}, _one(1)),
    XID_NAME: ("gpu_xid_errors_total", {}, lambda rows: 0.0),  # checked on its own above
}
# Per MIG instance: framebuffer from the instance's native memory series.
MIG_NATIVE = {"DCGM_FI_DEV_FB_TOTAL": lambda t, u: t, "DCGM_FI_DEV_FB_USED": lambda t, u: u,
              "DCGM_FI_DEV_FB_FREE": lambda t, u: t - u}
# Fields no shipped scenario moves off 0 at the times sampled (no power capping, no
# encoder, no failed remap); their conversion is covered by the hand-built snapshot.
ZERO_IN_SCENARIOS = {"DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_ENC_UTIL",
                     "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"}


def test_comparison_table_covers_every_compat_name() -> None:
    """A compat name added without a native comparison below fails here."""
    assert set(NATIVE) == set(COMPAT_NAMES)


def _compare(body: bytes) -> dict[str, float]:
    """Check every compat sample against the native value; name -> largest |value|."""
    data = parse(body)
    checked: dict[str, float] = {}
    for name, lb, value in data:
        if name not in NATIVE or name == XID_NAME:
            continue
        if "GPU_I_ID" in lb and name in MIG_NATIVE:
            mig = {n: v for n, mlb, v in data if n.startswith("gpu_mig_memory_")
                   and mlb["gpu"] == lb["gpu"] and mlb["gpu_instance_id"] == lb["GPU_I_ID"]}
            expected = MIG_NATIVE[name](mig["gpu_mig_memory_total_bytes"],
                                        mig["gpu_mig_memory_used_bytes"]) / MIB
        else:
            # per MIG instance (DCGM profiling): the native series of that instance
            native, want, conv = NATIVE[name]
            rows = [(nlb, v) for n, nlb, v in data if n == native and nlb["gpu"] == lb["gpu"]
                    and nlb.get("gpu_instance_id") == lb.get("GPU_I_ID")
                    and all(nlb.get(k) == x for k, x in want.items())]
            expected = conv(rows)
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-9), (name, lb["gpu"])
        checked[name] = max(checked.get(name, 0.0), abs(value))
    return checked


def test_every_compat_field_equals_its_native_value() -> None:
    """Over busy (DCGM profiling, NVLink), hot (thermal violation), xid (ECC, remapped
    rows, PCIe replays) and mig, every compat sample equals the native value converted
    to dcgm-exporter's unit, and every compat name is checked with a non-zero value
    at least once (except the few no scenario moves)."""
    checked: dict[str, float] = {}
    for name, times in (("busy", [600, 3600]), ("hot", [3000]), ("xid", [3600]),
                        ("mig", [1200])):
        for snap in sim_snapshots(name, times):
            for k, v in _compare(render_snapshot(snap, COMPAT).body).items():
                checked[k] = max(checked.get(k, 0.0), v)
    for k, v in _compare(render_snapshot(small_snapshot(), COMPAT).body).items():
        checked[k] = max(checked.get(k, 0.0), v)
    assert set(checked) == set(COMPAT_NAMES) - {XID_NAME}
    zero = {k for k, v in checked.items() if v == 0}
    assert zero <= ZERO_IN_SCENARIOS


def test_hand_built_conversions() -> None:
    """Exact values on the hand-built snapshot: violations in microseconds, the event
    reasons bit mask, NVLink in KiB, ECC by kind."""
    data = {n: v for n, lb, v in parse(render_snapshot(small_snapshot(), COMPAT).body)
            if n.startswith("DCGM_") and lb["gpu"] == "0" and "GPU_I_ID" not in lb}
    assert data["DCGM_FI_DEV_POWER_VIOLATION"] == 2_500_000
    assert data["DCGM_FI_DEV_THERMAL_VIOLATION"] == 750_000
    assert data["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x40
    assert data["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 12
    assert data["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 3
    assert data["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 1234567891


# --- 4. MIG ------------------------------------------------------------------------------

def test_mig_framebuffer_per_instance() -> None:
    """Scenario mig: GPU 0 (MIG) has one FB_USED/FB_FREE/FB_TOTAL series per GPU instance
    with GPU_I_PROFILE and GPU_I_ID and none for the parent; the whole GPU 1 has one
    series without them; device-wide fields stay one per GPU."""
    snap, = sim_snapshots("mig", [1200])
    data = parse(render_snapshot(snap, COMPAT).body)
    used = sorted((lb["gpu"], lb.get("GPU_I_ID"), lb.get("GPU_I_PROFILE"), v)
                  for n, lb, v in data if n == "DCGM_FI_DEV_FB_USED")
    assert [u[:3] for u in used] == [("0", "2", "3g.40gb"), ("0", "3", "2g.20gb"),
                                     ("0", "4", "2g.20gb"), ("1", None, None)]
    assert used[0][3] == pytest.approx(30 * 1024, abs=64)  # the 30 GiB pod in instance 2
    assert used[1][3] == 11 * 1024
    temps = [lb for n, lb, _ in data if n == "DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 2 and not any("GPU_I_ID" in lb for lb in temps)


def test_mig_profiling_per_instance_and_never_invented() -> None:
    """Scenario mig (simulated DCGM): the profiling fields NVIDIA's dashboard reads for
    utilisation and tensor cores come per GPU instance of the MIG GPU (native with
    mig_uuid/gpu_instance_id, compat with GPU_I_ID/GPU_I_PROFILE), busiest in the busy
    pod's instance, and once for the whole GPU 1; the MIG parent has none of its own.
    Scenario hot (no DCGM): no profiling series at all, native or compat."""
    snap, = sim_snapshots("mig", [1200])
    data = parse(render_snapshot(snap, COMPAT).body)
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        rows = {(lb["gpu"], lb.get("GPU_I_ID"), lb.get("GPU_I_PROFILE")): v
                for n, lb, v in data if n == name}
        assert set(rows) == {("0", "2", "3g.40gb"), ("0", "3", "2g.20gb"),
                             ("0", "4", "2g.20gb"), ("1", None, None)}, name
        assert rows[("0", "2", "3g.40gb")] > rows[("0", "3", "2g.20gb")] > 0
    native = {(lb["gpu"], lb.get("gpu_instance_id")) for n, lb, _ in data
              if n == "gpu_graphics_engine_active_ratio"}
    assert native == {("0", "2"), ("0", "3"), ("0", "4"), ("1", None)}
    hot, = sim_snapshots("hot", [600])
    names = {n for n, _, _ in parse(render_snapshot(hot, COMPAT).body)}
    assert not {n for n in names if n.startswith("DCGM_FI_PROF_") or n in {
        "gpu_graphics_engine_active_ratio", "gpu_tensor_pipe_active_ratio"}}


# --- 5. Kubernetes -----------------------------------------------------------------------

def _pod(ns: str, pod: str, container: str) -> Attribution:
    return Attribution(k8s_namespace=ns, k8s_pod=pod, k8s_container=container,
                       sources={"k8s_namespace": "kubelet", "k8s_pod": "kubelet",
                                "k8s_container": "kubelet"})


def _proc(pid: int, gi: int | None = None) -> ProcessSample:
    return ProcessSample(pid=pid, name="python", used_memory_bytes=MIB, gpu_instance_id=gi)


def test_pod_namespace_container_labels_from_attribution() -> None:
    """A GPU whose processes belong to one pod carries pod/namespace/container on its
    compat series, as dcgm-exporter's kubelet mapping adds them; two pods sharing a GPU
    keep only the shared namespace; a MIG instance carries its own pod."""
    snap = small_snapshot()
    procs = {UUID0: (AttributedProcess(UUID0, _proc(1, 1), _pod("ml", "train-0", "main")),)}
    data = parse(render_snapshot(dataclasses.replace(snap, processes=procs), COMPAT).body)
    util = [lb for n, lb, _ in data if n == "DCGM_FI_DEV_GPU_UTIL"]
    assert [(lb["pod"], lb["namespace"], lb["container"]) for lb in util] == [
        ("train-0", "ml", "main")]
    inst = [lb for n, lb, _ in data if n == "DCGM_FI_DEV_FB_USED"]
    assert [(lb["GPU_I_ID"], lb["pod"]) for lb in inst] == [("1", "train-0")]
    lost = [lb for n, lb, _ in data if n == XID_NAME and lb["gpu"] == "1"]
    assert "pod" not in lost[0]

    shared = {UUID0: (AttributedProcess(UUID0, _proc(1), _pod("ml", "a", "main")),
                      AttributedProcess(UUID0, _proc(2), _pod("ml", "b", "main")))}
    data = parse(render_snapshot(dataclasses.replace(snap, processes=shared), COMPAT).body)
    util = [lb for n, lb, _ in data if n == "DCGM_FI_DEV_GPU_UTIL"]
    assert util[0]["namespace"] == "ml" and "pod" not in util[0]
    assert "container" not in util[0]


def test_no_pod_labels_without_kubernetes() -> None:
    """Without Kubernetes attribution no pod, namespace or container label appears."""
    snap = dataclasses.replace(small_snapshot(), processes={})
    data = parse(render_snapshot(snap, COMPAT).body)
    assert not any({"pod", "namespace", "container"} & set(lb)
                   for n, lb, _ in data if n.startswith("DCGM_"))
