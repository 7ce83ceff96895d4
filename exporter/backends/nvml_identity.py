"""GPU identity and MIG instances through NVML: read on slow cycles, reused between.

Identity getters the device does not offer leave their field blank (or None), never a
placeholder; MIG instances are enumerated on slow cycles and their memory read on every
cycle. NVML errors other than "not offered" are raised to the backend, which marks the
GPU down; this module never decides GPU health.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_audit.model.samples import GpuInfo, MigInstance
from gpu_audit.nvml_shim import call_optional, is_unsupported, text


def mig_profile(name: str) -> str:
    """The MIG profile ("1g.5gb") from a MIG device name ("NVIDIA A100 MIG 1g.5gb")."""
    _head, sep, tail = name.rpartition(" MIG ")
    return tail.strip() if sep else name


def read_identity(nvml: Any, handle: Any, known: GpuInfo) -> GpuInfo:
    """The GPU's identity; uuid, index and versions are carried over from `known`."""
    name = call_optional(nvml, "nvmlDeviceGetName", handle)
    serial = call_optional(nvml, "nvmlDeviceGetSerial", handle)
    pci = call_optional(nvml, "nvmlDeviceGetPciInfo", handle)
    vbios = call_optional(nvml, "nvmlDeviceGetVbiosVersion", handle)
    minor = call_optional(nvml, "nvmlDeviceGetMinorNumber", handle)
    mig_mode = call_optional(nvml, "nvmlDeviceGetMigMode", handle)
    enabled = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
    return GpuInfo(
        uuid=known.uuid,
        index=known.index,
        name=text(name) if name is not None else "",
        serial=text(serial) if serial is not None else "",
        pci_bus_id=text(pci.busId) if pci is not None else "",
        driver_version=known.driver_version,
        cuda_version=known.cuda_version,
        vbios_version=text(vbios) if vbios is not None else "",
        minor_number=int(minor) if minor is not None else None,
        mig_mode=bool(mig_mode is not None and mig_mode[0] == enabled),
    )


@dataclass(slots=True)
class MigSlot:
    """One MIG device: its handle and its identity."""

    handle: Any
    instance: MigInstance


def enumerate_mig(nvml: Any, handle: Any) -> list[MigSlot]:
    """Every MIG device of the GPU, skipping empty slots."""
    count = call_optional(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    slots: list[MigSlot] = []
    for i in range(int(count)):
        try:
            mig_handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            continue  # an empty slot: not every index holds a MIG device
        name = call_optional(nvml, "nvmlDeviceGetName", mig_handle)
        slots.append(MigSlot(mig_handle, MigInstance(
            uuid=text(nvml.nvmlDeviceGetUUID(mig_handle)),
            gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(mig_handle)),
            compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig_handle)),
            profile=mig_profile(text(name)) if name is not None else "",
        )))
    return slots


def read_mig(nvml: Any, slots: list[MigSlot]) -> tuple[MigInstance, ...]:
    """The MIG instances with this cycle's memory (None where not offered)."""
    out: list[MigInstance] = []
    for slot in slots:
        total = used = None
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(slot.handle)
            total, used = int(memory.total), int(memory.used)
        except nvml.NVMLError as err:
            if not is_unsupported(nvml, err):
                raise
        inst = slot.instance
        out.append(MigInstance(
            uuid=inst.uuid, gpu_instance_id=inst.gpu_instance_id,
            compute_instance_id=inst.compute_instance_id, profile=inst.profile,
            memory_total_bytes=total, memory_used_bytes=used,
        ))
    return tuple(out)
