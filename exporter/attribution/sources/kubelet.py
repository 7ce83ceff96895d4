"""The `kubelet` attribution source: the kubelet's pod-resources map (GPU UUID -> pod),
refreshed on its own thread (exporter/attribution/kubelet.py). It must never block a
cycle on the kubelet, and it imports grpc only when built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from exporter.attribution.config import AttributionConfig
from exporter.attribution.sources.base import NO_ANSWER, Query
from gpu_audit.model.attribution import SOURCE_KUBELET

if TYPE_CHECKING:
    from exporter.attribution.kubelet import KubeletWatcher, PodRef


class KubeletSource:
    """The kubelet's pod-resources map, refreshed on its own thread."""

    name = SOURCE_KUBELET
    proc_needs: frozenset[str] = frozenset()

    def __init__(self, config: AttributionConfig, clock: Callable[[], float]) -> None:
        # grpc costs ~150 ms to import: only nodes that use the kubelet pay for it.
        from exporter.attribution import kubelet  # noqa: PLC0415

        self._fields_for = kubelet.fields_for
        self._watcher: KubeletWatcher = kubelet.KubeletWatcher(
            config.kubelet, clock=clock, max_value_length=config.environ_value_max_length
        )
        self._map: Mapping[str, tuple[PodRef, ...]] = {}
        self._watcher.start()

    def begin_cycle(self) -> int:
        generation, self._map = self._watcher.current()
        return generation

    def resolve(self, query: Query) -> Mapping[str, str]:
        for uuid in query.uuids:
            refs = self._map.get(uuid)
            if refs:
                return self._fields_for(refs)
        return NO_ANSWER

    def refresh(self) -> bool:
        """Refresh the map now (tests, start-up); False when the refresh failed."""
        return self._watcher.refresh()

    def stats(self) -> Mapping[str, int]:
        return {
            "kubelet_errors": self._watcher.errors,
            "kubelet_refreshes": self._watcher.refreshes,
        }

    def close(self) -> None:
        self._watcher.close()
