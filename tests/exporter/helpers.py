"""Fakes shared by the sampler and watch tests."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.attribution.model import UNKNOWN, AttributedProcess
from exporter.model import GpuSample


class NoAttribution:
    """An attributor that leaves every process without an owner."""

    def attribute(self, gpus: Sequence[GpuSample]) -> dict[str, tuple[AttributedProcess, ...]]:
        return {g.uuid: tuple(AttributedProcess(g.uuid, p, UNKNOWN) for p in g.processes)
                for g in gpus}
