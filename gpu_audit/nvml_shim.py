"""The one door to NVML: loading the binding, classifying its errors, and calling the
functions that exist in several versions.

This is the only module that imports pynvml. The rest of the NVML backend receives the
binding from `load_binding()` (or a fake in tests) and asks this module what an error
means (`is_unsupported`, `error_kind`).

NVML grows versioned functions (`..._v2`, `..._v3`) whose structs must match the
driver; a binding/driver mismatch scrambles values. Every such function goes through one
mechanism, `VersionedCall`, the way nvitop's `libnvml` does it: try the newest version,
fall back on "not offered" errors, remember the version that answered, and log the
choice once. The versioned calls the backend makes are built here (`process_list_calls`,
`memory_info_call`, `clock_reasons_call`, `cuda_version_call`), so the version lists
live in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from gpu_audit.model.samples import ProcessType

log = logging.getLogger("gpu_audit.nvml")

# Errors that mean "this device or driver does not offer the call", never "GPU broken".
UNSUPPORTED_ERRORS: tuple[str, ...] = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
)
# A struct version the driver does not know shows up as one of these.
VERSION_MISMATCH_ERRORS: tuple[str, ...] = (
    "NVMLError_ArgumentVersionMismatch",
    "NVMLError_InvalidArgument",
)


def load_binding(override: Any = None) -> Any:
    """The pynvml module, or `override` (a fake binding in tests)."""
    return override if override is not None else pynvml


def error_name(err: BaseException) -> str:
    """The pynvml class name of an NVML error (NVMLError_GpuIsLost, ...)."""
    return type(err).__name__


def is_one_of(nvml: Any, err: BaseException, names: tuple[str, ...]) -> bool:
    """True when `err` is an instance of one of the binding's error classes `names`."""
    return any(isinstance(err, getattr(nvml, n)) for n in names if hasattr(nvml, n))


def is_unsupported(nvml: Any, err: BaseException) -> bool:
    """True when the error says the call is not offered, rather than the GPU failing."""
    if not isinstance(err, nvml.NVMLError):
        return False
    return is_one_of(nvml, err, UNSUPPORTED_ERRORS)


def error_kind(nvml: Any, err: BaseException) -> str:
    """The error kind a failed GPU is reported and counted under."""
    for cls_name, kind in (
        ("NVMLError_GpuIsLost", "gpu_lost"),
        ("NVMLError_Timeout", "timeout"),
        ("NVMLError_Unknown", "unknown"),
    ):
        cls = getattr(nvml, cls_name, None)
        if cls is not None and isinstance(err, cls):
            return kind
    return "nvml_error"


def text(value: Any) -> str:
    """An NVML string (bytes on old bindings) as str."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def call_optional(nvml: Any, function: str, *args: Any) -> Any:
    """Call `function`; None when the device does not offer it. Other errors raise."""
    try:
        return getattr(nvml, function)(*args)
    except nvml.NVMLError as err:
        if is_unsupported(nvml, err):
            return None
        raise


@dataclass(frozen=True, slots=True)
class Variant:
    """One version of an NVML function.

    `function` is the binding attribute called; `name` is what the log says (it differs
    when one binding function takes the version as an argument); `keywords` builds
    extra keyword arguments from the binding (an AttributeError there means this
    binding lacks the version); `mismatch_falls_back`: a version-mismatch error also
    means "try the next version".
    """

    name: str
    function: str = ""
    keywords: Callable[[Any], Mapping[str, Any]] | None = None
    mismatch_falls_back: bool = False

    def resolve(self, nvml: Any) -> Callable[..., Any] | None:
        """The bound call, or None when the binding lacks this version."""
        fn = getattr(nvml, self.function or self.name, None)
        if fn is None:
            return None
        if self.keywords is None:
            return fn  # type: ignore[no-any-return]
        try:
            kwargs = dict(self.keywords(nvml))
        except AttributeError:
            return None

        def call(*args: Any) -> Any:
            return fn(*args, **kwargs)

        return call


class VersionedCall:
    """One NVML function that exists in several versions, newest first.

    The first call tries each version in turn: a version the binding lacks, or one that
    answers with a "not offered" error (or, where the variant says so, a version
    mismatch), is skipped. The version that answers is remembered and logged once;
    later calls go straight to it and its errors propagate. When no version answers,
    the call is switched off (`exhausted`): the last error is raised, and every later
    call raises NVMLError_FunctionNotFound without asking NVML again.
    """

    __slots__ = ("chosen", "exhausted", "label", "variants")

    def __init__(self, label: str, variants: tuple[Variant, ...]) -> None:
        self.label = label
        self.variants = variants
        self.chosen: Variant | None = None
        self.exhausted = False

    def __call__(self, nvml: Any, *args: Any) -> Any:
        if self.chosen is not None:
            # Looked up on every call, as a plain call would be (and a fake counts).
            fn = self.chosen.resolve(nvml)
            if fn is None:
                raise nvml.NVMLError_FunctionNotFound()
            return fn(*args)
        if self.exhausted:
            raise nvml.NVMLError_FunctionNotFound()
        tried: list[str] = []
        last_error: BaseException | None = None
        for variant in self.variants:
            fn = variant.resolve(nvml)
            if fn is None:
                tried.append(f"{variant.name} (absent from the binding)")
                continue
            try:
                result = fn(*args)
            except nvml.NVMLError as err:
                falls_back = is_unsupported(nvml, err) or (
                    variant.mismatch_falls_back and is_one_of(nvml, err, VERSION_MISMATCH_ERRORS)
                )
                if not falls_back:
                    raise
                tried.append(f"{variant.name} ({error_name(err)})")
                last_error = err
                continue
            self.chosen = variant
            skipped = f" after {', '.join(tried)}" if tried else ""
            log.info("NVML %s: using %s%s", self.label, variant.name, skipped)
            return result
        self.exhausted = True
        log.info("NVML %s not available: %s", self.label, ", ".join(tried))
        raise last_error if last_error is not None else nvml.NVMLError_FunctionNotFound()


def _versions(base: str, suffixes: tuple[str, ...]) -> tuple[Variant, ...]:
    return tuple(Variant(base + suffix) for suffix in suffixes)


def process_list_calls() -> dict[ProcessType, VersionedCall]:
    """The running-process list calls (compute, graphics, MPS), v3 then v2 then plain.

    The plain name is the oldest API on old bindings; on current bindings it is an alias
    of v3, which is harmless as a last resort.
    """
    suffixes = ("_v3", "_v2", "")
    return {
        "compute": VersionedCall("compute process list",
                                 _versions("nvmlDeviceGetComputeRunningProcesses", suffixes)),
        "graphics": VersionedCall("graphics process list",
                                  _versions("nvmlDeviceGetGraphicsRunningProcesses", suffixes)),
        "mps": VersionedCall("mps process list",
                             _versions("nvmlDeviceGetMPSComputeRunningProcesses", suffixes)),
    }


def memory_info_call(device: str) -> VersionedCall:
    """Memory info: v2 separates driver-reserved memory from "used" (driver >= 510)."""
    return VersionedCall(f"{device} memory info", (
        Variant("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo",
                keywords=lambda nvml: {"version": nvml.nvmlMemory_v2},
                mismatch_falls_back=True),
        Variant("nvmlDeviceGetMemoryInfo"),
    ))


def clock_reasons_call(device: str) -> VersionedCall:
    """ClocksEventReasons replaced ClocksThrottleReasons (driver 535); same bit layout."""
    return VersionedCall(f"{device} clock event reasons", (
        Variant("nvmlDeviceGetCurrentClocksEventReasons"),
        Variant("nvmlDeviceGetCurrentClocksThrottleReasons"),
    ))


def cuda_version_call() -> VersionedCall:
    """The CUDA driver version as NVML's integer (12040)."""
    return VersionedCall("CUDA driver version",
                         _versions("nvmlSystemGetCudaDriverVersion", ("_v2", "")))


def format_cuda_version(v: int) -> str:
    """NVML's integer CUDA driver version (12040) as "12.4"."""
    return f"{v // 1000}.{(v % 1000) // 10}"
