"""The fixed metric families: everything the exporter publishes besides the catalogue.

The per-GPU fields live in `gpu_audit.model.fields`; the families here are the ones whose
shape the renderer decides (identity, supported-fields view, XID, MIG, per-process,
unattributed, allocation, self-metrics) plus the live families computed at scrape time.
The renderer takes names, types, HELP and label names from this list and
`python -m exporter.exposition.docs` documents it, so the two cannot drift apart. The
dcgm-exporter compatibility names are declared in exporter.compat.

This module is declarations only: it must never compute a value or do I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gpu_audit import selfmetrics as sm
from gpu_audit.model.fields import CATALOGUE, GPU_LABELS

FamilyType = Literal["gauge", "counter"]
Group = Literal["gpu", "process", "allocation", "self", "live"]

_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

# Identity labels of per-process series, in order; values come from Attribution fields.
PROCESS_IDENTITY_LABELS: tuple[tuple[str, str], ...] = (
    ("user", "user"),
    ("project", "project"),
    ("job", "job"),
    ("namespace", "k8s_namespace"),
    ("pod", "k8s_pod"),
    ("container", "k8s_container"),
    ("slurm_job", "slurm_job_id"),
)
_IDENT = tuple(label for label, _ in PROCESS_IDENTITY_LABELS)


@dataclass(frozen=True, slots=True)
class FamilyDef:
    """One metric family the renderer emits outside the catalogue."""

    name: str
    type: FamilyType
    help: str
    source: str
    labels: tuple[str, ...]
    group: Group
    unit: str = ""

    @property
    def full_help(self) -> str:
        return f"{self.help} Source: {self.source}." if self.source else self.help


# Table entries: _family builds a FamilyDef from positional fields.
def _family(name: str, type_: FamilyType, help_: str, source: str,  # noqa: PLR0917 - a table
            labels: tuple[str, ...], group: Group, unit: str = "") -> FamilyDef:
    return FamilyDef(name, type_, help_, source, labels, group, unit)


_SAMPLED = "the latest sampling cycle (sampled in the background, not at scrape time)"

GPU_UP = _family("gpu_up", "gauge",
                 "1 when the GPU was read in the latest cycle, 0 when it is down (lost, timed out,"
                 " any per-device error; retried with backoff) or no longer enumerated but"
                 " recorded in the exporter's GPU inventory (a GPU lost before a restart).",
                 _SAMPLED, GPU_LABELS, "gpu")
GPU_INFO = _family("gpu_info", "gauge",
                   "GPU identity and versions; always 1. simulated=\"true\" when the data comes"
                   " from the scenario simulator.",
                   "NVML nvmlDeviceGetName/Serial/PciInfo/VbiosVersion, nvmlSystemGetDriverVersion,"
                   " nvmlSystemGetCudaDriverVersion, nvmlDeviceGetMigMode",
                   (*GPU_LABELS, "name", "serial", "pci_bus_id", "driver_version", "cuda_version",
                    "vbios_version", "mig_mode", "backend", "simulated"), "gpu")
GPU_FIELD_SUPPORTED = _family("gpu_field_supported", "gauge",
                              "Supported-fields view: 1 when the field (metric name) was measured "
                              "on"
                              " this GPU in the latest cycle, 0 when the device does not support it"
                              " or it was not read.",
                              _SAMPLED, (*GPU_LABELS, "field"), "gpu")
GPU_XID_ERRORS = _family("gpu_xid_errors_total", "counter",
                         "XID errors reported by the driver, by XID code, since the GPU was "
                         "first recorded on this node (the GPU inventory carries the counts "
                         "across exporter restarts).",
                         "NVML nvmlEventSetWait (nvmlEventTypeXidCriticalError)",
                         (*GPU_LABELS, "xid"), "gpu")
GPU_XID_LAST = _family("gpu_xid_last_timestamp_seconds", "gauge",
                       "Unix time of the most recent XID error on this GPU.",
                       "NVML nvmlEventSetWait (nvmlEventTypeXidCriticalError)",
                       GPU_LABELS, "gpu", "seconds")
GPU_MIG_INFO = _family("gpu_mig_info", "gauge", "One MIG instance on the GPU; always 1.",
                       "NVML nvmlDeviceGetMigDeviceHandleByIndex, "
                       "nvmlDeviceGetGpuInstanceProfileInfo",
                       (*GPU_LABELS, "mig_uuid", "gpu_instance_id", "compute_instance_id",
                        "profile"),
                       "gpu")
GPU_MIG_MEMORY_TOTAL = _family("gpu_mig_memory_total_bytes", "gauge",
                               "Device memory of the MIG instance.",
                               "NVML nvmlDeviceGetMemoryInfo on the MIG device handle",
                               (*GPU_LABELS, "mig_uuid", "gpu_instance_id"), "gpu", "bytes")
GPU_MIG_MEMORY_USED = _family("gpu_mig_memory_used_bytes", "gauge",
                              "Device memory in use in the MIG instance.",
                              "NVML nvmlDeviceGetMemoryInfo on the MIG device handle",
                              (*GPU_LABELS, "mig_uuid", "gpu_instance_id"), "gpu", "bytes")

_PROC = (*GPU_LABELS, *_IDENT, "process_name")
_PROC_NOTE = (" Keyed by identity (user, project, job, pod, Slurm job, process name), not pid;"
              " processes sharing one identity are summed.")
PROCESS_MEMORY = _family("gpu_process_memory_used_bytes", "gauge",
                         "GPU memory used by the processes of this identity." + _PROC_NOTE,
                         "NVML nvmlDeviceGetComputeRunningProcesses (v3/v2/v1) + attribution",
                         _PROC, "process", "bytes")
PROCESS_SM = _family("gpu_process_sm_utilization_ratio", "gauge",
                     "SM utilisation of the processes of this identity (sum, capped at 1)."
                     + _PROC_NOTE,
                     "NVML nvmlDeviceGetProcessUtilization (smUtil) + attribution",
                     _PROC, "process", "ratio")
PROCESS_MEM_UTIL = _family("gpu_process_memory_utilization_ratio", "gauge",
                           "Memory-controller utilisation of the processes of this identity"
                           " (sum, capped at 1)." + _PROC_NOTE,
                           "NVML nvmlDeviceGetProcessUtilization (memUtil) + attribution",
                           _PROC, "process", "ratio")
PROCESS_ENC = _family("gpu_process_encoder_utilization_ratio", "gauge",
                      "Encoder utilisation of the processes of this identity (sum, capped at 1)."
                      + _PROC_NOTE,
                      "NVML nvmlDeviceGetProcessUtilization (encUtil) + attribution",
                      _PROC, "process", "ratio")
PROCESS_DEC = _family("gpu_process_decoder_utilization_ratio", "gauge",
                      "Decoder utilisation of the processes of this identity (sum, capped at 1)."
                      + _PROC_NOTE,
                      "NVML nvmlDeviceGetProcessUtilization (decUtil) + attribution",
                      _PROC, "process", "ratio")
# Named gpu_processes, not gpu_process_count: promtool rejects a "_count" suffix on
# anything but histograms and summaries.
PROCESS_COUNT = _family("gpu_processes", "gauge",
                        "Number of processes of this identity on the GPU." + _PROC_NOTE,
                        "NVML nvmlDeviceGetComputeRunningProcesses + attribution",
                        _PROC, "process")
PROCESS_MIG_WEIGHT = _family("gpu_process_mig_weight_ratio", "gauge",
                             "The share of the GPU the MIG instance these processes run in "
                             "counts for in a bill: its profile's compute slices / the "
                             "GPU's (docs/CHARGEBACK.md, \"MIG: billed by the slice\"). One "
                             "series per identity and instance, only on a GPU in MIG mode "
                             "whose instances all have a known weight.",
                             "NVML nvmlDeviceGetGpuInstanceProfileInfo + attribution",
                             (*_PROC, "gpu_instance_id"), "process", "ratio")
UNATTRIBUTED_MEMORY = _family("gpu_unattributed_memory_bytes", "gauge",
                              "GPU memory used that no attributed process explains (GPU memory used"
                              " minus the memory of attributed processes, floored at 0).",
                              "NVML nvmlDeviceGetMemoryInfo, nvmlDeviceGetComputeRunningProcesses"
                              " + attribution", GPU_LABELS, "process", "bytes")
UNATTRIBUTED_UTIL = _family("gpu_unattributed_utilization_ratio", "gauge",
                            "GPU utilisation that no attributed process explains (GPU utilisation"
                            " minus the SM utilisation of attributed processes, floored at 0).",
                            "NVML nvmlDeviceGetUtilizationRates, nvmlDeviceGetProcessUtilization"
                            " + attribution", GPU_LABELS, "process", "ratio")
ALLOCATION_INFO = _family("gpu_allocation_info", "gauge",
                          "Which job holds which GPU, and which attribution source said so"
                          " (source of the job, else of the user); always 1. Join on it instead"
                          " of copying job labels onto every series.",
                          "attribution of the processes on the GPU",
                          (*GPU_LABELS, "job", "user", "project", "namespace", "pod", "container",
                           "slurm_job", "source"), "allocation")
GPU_OWNER_INFO = _family("gpu_owner_info", "gauge",
                         "Who owns the GPU, for the owner labels of hardware alerts: the user,"
                         " project, job and Slurm job of the attributed processes on it now, or,"
                         " while it"
                         " is down, when it was last read (kept across restarts in the GPU"
                         " inventory); always 1. One series per GPU: several owners' distinct"
                         " values are sorted and comma-separated in each label. No series"
                         " while nobody holds the GPU.",
                         "attribution of the processes on the GPU; the GPU inventory",
                         (*GPU_LABELS, "user", "project", "job", "slurm_job"), "allocation")

# gpu-audit's own families that the exporter serves: declared once in core
# (gpu_audit.selfmetrics, with every other component's self-metrics), used here so the
# renderer and the HTTP endpoint keep taking names, types and HELP from this list.
def _self(m: sm.SelfMetric, group: Group) -> FamilyDef:
    assert m.type != "histogram", m.name
    return FamilyDef(m.name, m.type, m.help, m.source, m.labels, group, m.unit)


SAMPLE_DURATION = _self(sm.SAMPLE_DURATION, "self")
SNAPSHOT_TIMESTAMP = _self(sm.SNAPSHOT_TIMESTAMP, "self")
SAMPLE_ERRORS = _self(sm.SAMPLE_ERRORS, "self")
SERIES = _self(sm.SERIES, "self")

SNAPSHOT_AGE = _self(sm.SNAPSHOT_AGE, "live")
SCRAPES = _self(sm.SCRAPES, "live")
PROCESS_SERIES_DROPPED = _self(sm.PROCESS_SERIES_DROPPED, "live")

FAMILIES: tuple[FamilyDef, ...] = (
    GPU_UP, GPU_INFO, GPU_FIELD_SUPPORTED, GPU_XID_ERRORS, GPU_XID_LAST,
    GPU_MIG_INFO, GPU_MIG_MEMORY_TOTAL, GPU_MIG_MEMORY_USED,
    PROCESS_MEMORY, PROCESS_SM, PROCESS_MEM_UTIL, PROCESS_ENC, PROCESS_DEC, PROCESS_COUNT,
    PROCESS_MIG_WEIGHT, UNATTRIBUTED_MEMORY, UNATTRIBUTED_UTIL, ALLOCATION_INFO, GPU_OWNER_INFO,
    SAMPLE_DURATION, SNAPSHOT_TIMESTAMP, SAMPLE_ERRORS, SERIES,
    SNAPSHOT_AGE, SCRAPES, PROCESS_SERIES_DROPPED,
)


def valid_label_name(name: str) -> bool:
    """A Prometheus label name that is not reserved (no leading "__")."""
    return bool(_LABEL_RE.match(name)) and not name.startswith("__")


def _check() -> None:
    names = [f.name for f in FAMILIES] + [m.name for m in CATALOGUE]
    compat = [c.name for m in CATALOGUE for c in m.compat]
    if len(set(names + compat)) != len(names) + len(compat):
        raise AssertionError("a fixed family collides with another family")
    for f in FAMILIES:
        if not _NAME_RE.match(f.name) or not all(valid_label_name(lb) for lb in f.labels):
            raise AssertionError(f"{f.name}: invalid metric or label name")
        if (f.type == "counter") != f.name.endswith("_total"):
            raise AssertionError(f"{f.name}: counters and only counters end in _total")
    for m in CATALOGUE:
        if not all(valid_label_name(lb) for lb in (*GPU_LABELS, *m.labels)):
            raise AssertionError(f"{m.name}: invalid label name")


_check()
