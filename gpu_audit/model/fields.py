"""The field catalogue: every per-GPU field a backend can measure and the exporter publish.

Backends fill `GpuSample.values[key]` with values in the base unit named here; the
exporter's renderer turns each entry into one metric family, the audit record builder
names record fields after it; `docs/METRICS.md` is generated from
this list (`python -m exporter.exposition.docs`) and a test fails when the two disagree.

Rules kept here so nothing downstream has to: base units (bytes, seconds, celsius,
joules, hertz, ratio 0..1), `_total` on counters, lower-case labels, and HELP that names
the NVML call or DCGM field behind the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter"]
Tier = Literal["fast", "slow"]

# Labels every per-GPU series carries, in this order.
GPU_LABELS: tuple[str, ...] = ("gpu", "uuid")


@dataclass(frozen=True, slots=True)
class CompatName:
    """A dcgm-exporter name for the same value, with the factor from our base unit."""

    name: str
    scale: float = 1.0
    help: str = ""


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One per-GPU field."""

    key: str
    name: str
    type: MetricType
    help: str
    source: str
    labels: tuple[str, ...] = ()
    tier: Tier = "fast"
    dcgm_only: bool = False
    compat: tuple[CompatName, ...] = ()

    @property
    def full_help(self) -> str:
        return f"{self.help} Sampled in the background; source: {self.source}."


# Table entries: _gauge builds a gauge entry, _counter a counter entry (its name must
# end in _total).
def _gauge(key: str, name: str, help_: str, source: str, **kw: object) -> MetricDef:
    return MetricDef(key=key, name=name, type="gauge", help=help_, source=source, **kw)  # type: ignore[arg-type]


def _counter(key: str, name: str, help_: str, source: str, **kw: object) -> MetricDef:
    assert name.endswith("_total"), name
    return MetricDef(key=key, name=name, type="counter", help=help_, source=source, **kw)  # type: ignore[arg-type]


MIB = 1.0 / (1024 * 1024)

CATALOGUE: tuple[MetricDef, ...] = (
    # --- utilisation -------------------------------------------------------------------
    _gauge("utilization_gpu", "gpu_utilization_ratio",
           "Fraction of the last sample period in which one or more kernels ran on the GPU.",
           "NVML nvmlDeviceGetUtilizationRates().gpu",
           compat=(CompatName("DCGM_FI_DEV_GPU_UTIL", 100.0, "GPU utilization (in %)."),)),
    _gauge("utilization_memory", "gpu_memory_controller_utilization_ratio",
           "Fraction of the last sample period in which device memory was read or written.",
           "NVML nvmlDeviceGetUtilizationRates().memory",
           compat=(CompatName("DCGM_FI_DEV_MEM_COPY_UTIL", 100.0, "Memory utilization (in %)."),)),
    _gauge("utilization_encoder", "gpu_encoder_utilization_ratio",
           "Video encoder utilisation.", "NVML nvmlDeviceGetEncoderUtilization",
           compat=(CompatName("DCGM_FI_DEV_ENC_UTIL", 100.0, "Encoder utilization (in %)."),)),
    _gauge("utilization_decoder", "gpu_decoder_utilization_ratio",
           "Video decoder utilisation.", "NVML nvmlDeviceGetDecoderUtilization",
           compat=(CompatName("DCGM_FI_DEV_DEC_UTIL", 100.0, "Decoder utilization (in %)."),)),
    # --- memory --------------------------------------------------------------------------
    _gauge("memory_total", "gpu_memory_total_bytes", "Total device memory.",
           "NVML nvmlDeviceGetMemoryInfo (v2 where the driver has it)",
           compat=(CompatName("DCGM_FI_DEV_FB_TOTAL", MIB, "Framebuffer memory total (in MiB)."),)),
    _gauge("memory_used", "gpu_memory_used_bytes",
           "Device memory in use by processes (excludes driver-reserved memory on the v2 call).",
           "NVML nvmlDeviceGetMemoryInfo (v2 where the driver has it)",
           compat=(CompatName("DCGM_FI_DEV_FB_USED", MIB, "Framebuffer memory used (in MiB)."),)),
    _gauge("memory_free", "gpu_memory_free_bytes", "Device memory free.",
           "NVML nvmlDeviceGetMemoryInfo (v2 where the driver has it)",
           compat=(CompatName("DCGM_FI_DEV_FB_FREE", MIB, "Framebuffer memory free (in MiB)."),)),
    _gauge("memory_reserved", "gpu_memory_reserved_bytes", "Device memory reserved by the driver.",
           "NVML nvmlDeviceGetMemoryInfo_v2().reserved",
           compat=(CompatName("DCGM_FI_DEV_FB_RESERVED", MIB,
                              "Framebuffer memory reserved (in MiB)."),)),
    # --- thermals and power ------------------------------------------------------------
    _gauge("temperature_gpu", "gpu_temperature_celsius", "GPU core temperature.",
           "NVML nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
           compat=(CompatName("DCGM_FI_DEV_GPU_TEMP", 1.0, "GPU temperature (in C)."),)),
    _gauge("temperature_memory", "gpu_memory_temperature_celsius", "HBM memory temperature.",
           "NVML nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
           compat=(CompatName("DCGM_FI_DEV_MEMORY_TEMP", 1.0, "Memory temperature (in C)."),)),
    _gauge("power_usage", "gpu_power_usage_watts", "Power draw of the board.",
           "NVML nvmlDeviceGetPowerUsage (milliwatts / 1000)",
           compat=(CompatName("DCGM_FI_DEV_POWER_USAGE", 1.0, "Power draw (in W)."),)),
    _gauge("power_limit", "gpu_power_limit_watts", "Enforced power limit.",
           "NVML nvmlDeviceGetEnforcedPowerLimit (milliwatts / 1000)", tier="slow"),
    _counter("energy", "gpu_energy_joules_total",
             "Energy consumed since the driver was last loaded.",
             "NVML nvmlDeviceGetTotalEnergyConsumption (millijoules / 1000)",
             compat=(CompatName("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0,
                                "Total energy consumption since boot (in mJ)."),)),
    # --- clocks, fans, performance state ------------------------------------------------
    _gauge("clock_sm", "gpu_sm_clock_hertz", "Current SM clock.",
           "NVML nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz * 1e6)",
           compat=(CompatName("DCGM_FI_DEV_SM_CLOCK", 1e-6, "SM clock frequency (in MHz)."),)),
    _gauge("clock_memory", "gpu_memory_clock_hertz", "Current memory clock.",
           "NVML nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) (MHz * 1e6)",
           compat=(CompatName("DCGM_FI_DEV_MEM_CLOCK", 1e-6, "Memory clock frequency (in MHz)."),)),
    _gauge("fan_speed", "gpu_fan_speed_ratio", "Intended fan speed as a fraction of the maximum.",
           "NVML nvmlDeviceGetFanSpeed (percent / 100)"),
    _gauge("performance_state", "gpu_performance_state",
           "Performance state P0 (maximum) to P15 (minimum).",
           "NVML nvmlDeviceGetPerformanceState"),
    _gauge("clock_event_reason", "gpu_clock_event_reason_active",
           "1 while the named clock event (throttle) reason holds the clocks down, else 0.",
           "NVML nvmlDeviceGetCurrentClocksEventReasons", labels=("reason",)),
    _counter("violation_time", "gpu_clock_violation_seconds_total",
             "Time the clocks were held below the requested clocks by the named policy (power,"
             " thermal), since the driver was loaded.",
             "NVML nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER/THERMAL)"
             " (nanoseconds / 1e9)", labels=("policy",)),
    # --- errors and health ---------------------------------------------------------------
    _counter("ecc_errors", "gpu_ecc_errors_total",
             "ECC errors by kind (corrected/uncorrected) and counter (volatile since driver load,"
             " aggregate over the board's lifetime).",
             "NVML nvmlDeviceGetTotalEccErrors", labels=("error_type", "counter"), tier="slow"),
    _gauge("retired_pages", "gpu_retired_pages",
           "Device memory pages retired, by cause (single_bit_ecc / double_bit_ecc).",
           "NVML nvmlDeviceGetRetiredPages", labels=("cause",), tier="slow"),
    _gauge("retired_pages_pending", "gpu_retired_pages_pending",
           "1 when page retirement waits for a reboot, else 0.",
           "NVML nvmlDeviceGetRetiredPagesPendingStatus", tier="slow"),
    _gauge("remapped_rows", "gpu_remapped_rows",
           "Memory rows remapped, by cause (correctable / uncorrectable).",
           "NVML nvmlDeviceGetRemappedRows", labels=("cause",), tier="slow",
           compat=()),
    _gauge("remapped_rows_pending", "gpu_remapped_rows_pending",
           "1 when a row remap waits for a GPU reset, else 0.",
           "NVML nvmlDeviceGetRemappedRows", tier="slow",
           compat=(CompatName("DCGM_FI_DEV_ROW_REMAP_PENDING", 1.0,
                              "Whether remapping of rows is pending (a GPU reset applies it)."),)),
    _gauge("remapped_rows_failure", "gpu_remapped_rows_failure",
           "1 when a row remap failed (the GPU needs service), else 0.",
           "NVML nvmlDeviceGetRemappedRows", tier="slow",
           compat=(CompatName("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0,
                              "Whether remapping of rows has failed."),)),
    _counter("pcie_replay", "gpu_pcie_replay_errors_total", "PCIe replay counter.",
             "NVML nvmlDeviceGetPcieReplayCounter",
             compat=(CompatName("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0,
                                "Total number of PCIe retries."),)),
    # --- NVLink --------------------------------------------------------------------------
    _gauge("nvlink_up", "gpu_nvlink_up", "1 when the NVLink link is active, else 0.",
           "NVML nvmlDeviceGetNvLinkState", labels=("link",), tier="slow"),
    _counter("nvlink_errors", "gpu_nvlink_errors_total",
             "NVLink error counters by link and type (replay, recovery, crc_flit, crc_data).",
             "NVML nvmlDeviceGetNvLinkErrorCounter", labels=("link", "type"), tier="slow"),
    _counter("nvlink_bytes", "gpu_nvlink_data_bytes_total",
             "NVLink payload bytes by link and direction (transmit / receive).",
             "NVML nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX) (KiB * 1024)",
             labels=("link", "direction")),
    # --- DCGM profiling fields (present only with the DCGM backend) --------------------
    _gauge("prof_gr_engine_active", "gpu_graphics_engine_active_ratio",
           "Fraction of time the graphics or compute engine was active.",
           "DCGM DCGM_FI_PROF_GR_ENGINE_ACTIVE (1001)", dcgm_only=True,
           compat=(CompatName("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0,
                              "Ratio of time the graphics engine is active."),)),
    _gauge("prof_sm_active", "gpu_sm_active_ratio",
           "Fraction of time at least one warp was active on an SM, averaged over SMs.",
           "DCGM DCGM_FI_PROF_SM_ACTIVE (1002)", dcgm_only=True),
    _gauge("prof_sm_occupancy", "gpu_sm_occupancy_ratio",
           "Resident warps as a fraction of the maximum, averaged over SMs.",
           "DCGM DCGM_FI_PROF_SM_OCCUPANCY (1003)", dcgm_only=True),
    _gauge("prof_pipe_tensor_active", "gpu_tensor_pipe_active_ratio",
           "Fraction of cycles the tensor pipe was active.",
           "DCGM DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (1004)", dcgm_only=True,
           compat=(CompatName("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0,
                              "Ratio of cycles the tensor (HMMA) pipe is active."),)),
    _gauge("prof_dram_active", "gpu_dram_active_ratio",
           "Fraction of cycles the device memory interface was active.",
           "DCGM DCGM_FI_PROF_DRAM_ACTIVE (1005)", dcgm_only=True,
           compat=(CompatName("DCGM_FI_PROF_DRAM_ACTIVE", 1.0,
                              "Ratio of cycles the device memory interface is active."),)),
    _gauge("prof_pipe_fp64_active", "gpu_fp64_pipe_active_ratio",
           "Fraction of cycles the FP64 pipe was active.",
           "DCGM DCGM_FI_PROF_PIPE_FP64_ACTIVE (1006)", dcgm_only=True),
    _gauge("prof_pipe_fp32_active", "gpu_fp32_pipe_active_ratio",
           "Fraction of cycles the FP32 pipe was active.",
           "DCGM DCGM_FI_PROF_PIPE_FP32_ACTIVE (1007)", dcgm_only=True),
    _gauge("prof_pipe_fp16_active", "gpu_fp16_pipe_active_ratio",
           "Fraction of cycles the FP16 pipe was active.",
           "DCGM DCGM_FI_PROF_PIPE_FP16_ACTIVE (1008)", dcgm_only=True),
    _gauge("prof_pcie_tx_bytes", "gpu_pcie_transmit_bytes_per_second",
           "PCIe bytes transmitted per second (header and payload).",
           "DCGM DCGM_FI_PROF_PCIE_TX_BYTES (1009)", dcgm_only=True,
           compat=(CompatName("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0,
                              "The rate of data transmitted over the PCIe bus."),)),
    _gauge("prof_pcie_rx_bytes", "gpu_pcie_receive_bytes_per_second",
           "PCIe bytes received per second (header and payload).",
           "DCGM DCGM_FI_PROF_PCIE_RX_BYTES (1010)", dcgm_only=True,
           compat=(CompatName("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0,
                              "The rate of data received over the PCIe bus."),)),
)

BY_KEY: dict[str, MetricDef] = {m.key: m for m in CATALOGUE}

# Clock event (throttle) reasons, from nvml.h's nvmlClocksEventReason* bits, by the
# label value we publish. Backends map their bit masks through this table.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# XIDs that report a memory error (48 double-bit ECC, 63/64 row remapping pending or
# failed, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC): when one
# arrives, the slow-tier memory-error fields are read again at once instead of up to a
# slow interval later, so the ECC and row-remap alerts follow the XID within one cycle.
MEMORY_ERROR_XIDS: frozenset[int] = frozenset({48, 63, 64, 92, 94, 95})
MEMORY_ERROR_KEYS: frozenset[str] = frozenset({
    "ecc_errors", "retired_pages", "retired_pages_pending", "remapped_rows",
    "remapped_rows_pending", "remapped_rows_failure",
})

# Violation policies published as `policy` label values of gpu_clock_violation_seconds_total,
# with nvml.h's nvmlPerfPolicyType_t value each is read with.
VIOLATION_POLICIES: dict[str, int] = {"power": 0, "thermal": 1}


def _check_catalogue() -> None:
    keys = [m.key for m in CATALOGUE]
    names = [m.name for m in CATALOGUE]
    if len(set(keys)) != len(keys) or len(set(names)) != len(names):
        raise AssertionError("metric catalogue has a duplicate key or name")
    for m in CATALOGUE:
        if m.type == "gauge" and m.name.endswith("_total"):
            raise AssertionError(f"gauge {m.name} must not end in _total")
        if m.name != m.name.lower() or any(lbl != lbl.lower() for lbl in m.labels):
            raise AssertionError(f"{m.name}: names and labels are lower case")


_check_catalogue()
