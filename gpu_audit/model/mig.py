"""How much of its GPU a MIG instance is: the weight a bill counts its time by
(docs/CHARGEBACK.md, "MIG: billed by the slice").

The measure is compute slices: a GPU instance profile `Ng.XXgb` holds N of the GPU's
compute slices (its streaming multiprocessors, in sevenths of an A100/H100/H200 or
quarters of an A30), so weight = N / the GPU's slices: 1g.10gb = 1/7, 3g.40gb = 3/7,
7g.80gb = 1 on an A100-80GB. Compute, not memory, because it is what an instance takes
from everyone else (a 4g.40gb holds 4/7 of the SMs with 1/2 of the memory; no other
instance can use those SMs) and because the slices of every valid layout add up to at
most the whole GPU, so tenants never pay for more than one GPU.

Only models listed in `GPU_SLICES` are weighed; a GPU in MIG mode of another model, or
an instance whose profile does not parse, leaves the whole GPU's time to the rule for
shared GPUs (1 / holders), never a guess. A site overrides the table with
`exporter.mig_weights` (`with_site_weights`: the weight rides on the sample, so the
exporter's series and the audit records carry the same one). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from gpu_audit.model.samples import GpuSample

# GPU model (a pattern on the name NVML reports) -> its compute slices.
GPU_SLICES: tuple[tuple[str, int], ...] = (
    (r"\bA100\b", 7),  # A100-SXM4/PCIe 40GB and 80GB: 1g.5gb/1g.10gb .. 7g.40gb/7g.80gb
    (r"\bA800\b", 7),
    (r"\bH100\b", 7),  # H100 80GB/94GB/96GB: 1g.10gb .. 7g.80gb
    (r"\bH800\b", 7),
    (r"\bH200\b", 7),  # H200 141GB (GH200 too): 1g.18gb .. 7g.141gb
    (r"\bB200\b", 7),
    (r"\bA30\b", 4),  # A30 24GB: 1g.6gb, 2g.12gb, 4g.24gb
)
_PROFILE = re.compile(r"^(?:\d+c\.)?(\d+)g\.\d+gb(?:\+[a-z0-9]+)*$")


def gpu_slices(model: str) -> int | None:
    """The compute slices of a GPU model, None when the model is not in the table."""
    for pattern, slices in GPU_SLICES:
        if re.search(pattern, model):
            return slices
    return None


def profile_slices(profile: str) -> int | None:
    """N of a GPU instance profile `Ng.XXgb` (also `Nc.Mg.XXgb`, `+me` suffixes)."""
    m = _PROFILE.match(profile.strip().lower())
    return int(m.group(1)) if m else None


def mig_weight(model: str, profile: str) -> float | None:
    """The share of the GPU an instance of `profile` counts for, None when unknown."""
    total, n = gpu_slices(model), profile_slices(profile)
    if total is None or n is None or not 0 < n <= total:
        return None
    return n / total


def instance_weights(gpu: GpuSample) -> dict[int, float] | None:
    """gpu_instance_id -> weight of every MIG instance of the GPU; None when the GPU has
    no MIG instances or any of them has no known weight (then nothing is weighed)."""
    if not gpu.mig:
        return None
    out: dict[int, float] = {}
    for mi in gpu.mig:
        w = mi.weight if mi.weight is not None else mig_weight(gpu.info.name, mi.profile)
        if w is None:
            return None
        out[mi.gpu_instance_id] = w
    return out


def site_weight(overrides: Mapping[str, float], model: str, profile: str) -> float | None:
    """The site's weight for an instance: a `MODEL/PROFILE` key whose MODEL is part of
    the GPU's name first, then a bare `PROFILE` key; None when neither is set."""
    p = profile.strip().lower()
    for key, w in overrides.items():
        m, sep, kp = key.rpartition("/")
        if sep and kp.strip().lower() == p and m.strip().lower() in model.lower():
            return w
    return overrides.get(p)


def check_site_key(key: str) -> str | None:
    """What is wrong with a key of exporter.mig_weights, None when nothing."""
    model, _sep, profile = key.rpartition("/")
    if profile_slices(profile) is None:
        return f"{profile!r} is not a MIG profile (Ng.XXgb, e.g. 3g.40gb)"
    if _sep and not model.strip():
        return "MODEL/PROFILE needs a model (part of the GPU's name, e.g. A100)"
    return None


def with_site_weights(gpus: Sequence[GpuSample],
                      overrides: Mapping[str, float]) -> tuple[GpuSample, ...]:
    """The GPUs with the site's weights on the MIG instances they name (the others keep
    the table's)."""
    out = []
    for g in gpus:
        mig = tuple(replace(mi, weight=w) if (w := site_weight(
            overrides, g.info.name, mi.profile)) is not None else mi for mi in g.mig)
        out.append(replace(g, mig=mig) if mig != g.mig else g)
    return tuple(out)


def process_weights(gpu: GpuSample) -> dict[int, float] | None:
    """`instance_weights(gpu)` when every process on the GPU runs in one of those
    instances (the GPU's time is then counted slice by slice), else None."""
    weights = instance_weights(gpu)
    if weights is None:
        return None
    if any(p.gpu_instance_id not in weights for p in gpu.processes):
        return None
    return weights


def unowned_slices(weights: Mapping[int, float], owned: Iterable[int | None],
                   unowned: Iterable[int | None]) -> float:
    """The share of the GPU held only by processes nobody owns: the weights of the
    instances they run in that no owned process runs in."""
    mine = set(owned)
    return sum(weights.get(gi, 0.0) for gi in set(unowned) if gi is not None and gi not in mine)
