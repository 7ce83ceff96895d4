"""How far a job is and what it runs: the throughput window and the environment fingerprint.

Throughput is steps per second over a sliding window of the last reports (one slow step,
a checkpoint commit or a validation pass moves it a little, not to zero). The environment
fingerprint names the exact Python and, where the training script already loaded them,
torch with the CUDA, cuDNN and NCCL versions it was built with and runs, plus numpy,
lightning and transformers. It must never import a framework (it looks in sys.modules
only) and never initialise CUDA (torch.cuda.* calls here read build constants or the
cuDNN/NCCL libraries' own version functions, none of which creates a context).
"""

from __future__ import annotations

import platform
import sys
from collections import deque
from typing import Any

# Reports kept for the throughput window: enough to smooth a step's jitter, few enough
# that a change of speed (another job on the GPU) shows within seconds.
WINDOW = 32


class Throughput:
    """Steps per second over the last WINDOW reports; None until two reports apart in time."""

    def __init__(self, window: int = WINDOW) -> None:
        self._points: deque[tuple[float, int]] = deque(maxlen=window)

    def observe(self, now: float, step: int) -> float | None:
        points = self._points
        if points and step < points[-1][1]:
            points.clear()  # a resume from an earlier checkpoint: a new run of steps
        points.append((now, step))
        t0, s0 = points[0]
        if now <= t0 or step <= s0:
            return None
        return (step - s0) / (now - t0)


def _version(module: Any) -> str | None:
    v = getattr(module, "__version__", None)
    return None if v is None else str(v)


def _torch_fields(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": _version(torch)}
    version = getattr(torch, "version", None)
    out["cuda"] = getattr(version, "cuda", None)  # the CUDA torch was built for; None on CPU
    out["hip"] = getattr(version, "hip", None)
    try:
        out["cudnn"] = torch.backends.cudnn.version()  # None where torch has no cuDNN
    except Exception:  # noqa: BLE001 - a broken install must not stop training
        out["cudnn"] = None
    nccl = None
    try:
        if out["cuda"]:  # a CPU build has no NCCL to ask
            raw = torch.cuda.nccl.version()
            nccl = ".".join(str(p) for p in raw) if isinstance(raw, tuple) else str(raw)
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL; some raise, some return 0
        nccl = None
    out["nccl"] = nccl
    return out


def environment() -> dict[str, Any]:
    """The job's software as the `environment` event's fields (docs/CHECKPOINT.md)."""
    doc: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": sys.platform,
    }
    mods = sys.modules
    torch = mods.get("torch")
    if torch is not None:
        doc.update(_torch_fields(torch))
    for name, key in (("numpy", "numpy"), ("lightning", "lightning"),
                      ("pytorch_lightning", "pytorch_lightning"),
                      ("transformers", "transformers"), ("accelerate", "accelerate")):
        mod = mods.get(name)
        if mod is not None:
            doc[key] = _version(mod)
    return doc
