"""Fakes shared by the sampler and watch tests."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_audit.model.attribution import UNKNOWN, AttributedProcess
from gpu_audit.model.samples import GpuSample


class NoAttribution:
    """An attributor that leaves every process without an owner."""

    def attribute(self, gpus: Sequence[GpuSample]) -> dict[str, tuple[AttributedProcess, ...]]:
        return {g.uuid: tuple(AttributedProcess(g.uuid, p, UNKNOWN) for p in g.processes)
                for g in gpus}
