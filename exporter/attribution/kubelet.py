"""GPU -> Kubernetes pod, from the kubelet's pod-resources v1 API on its unix socket.

List() says which pod and container each allocated device belongs to (by name, not by
pod UID). It is called on this module's own timer thread, never on the attribution path:
attribute() only reads the latest map, swapped in whole after each successful refresh,
so pods the kubelet no longer lists are gone after the next refresh. If refreshes keep
failing the map is dropped once it is three refresh periods old, rather than attributing
GPUs to pods that may have ended. Errors are counted and logged once per kind. This
module must never block or raise on the caller's thread.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import grpc

from exporter.attribution.config import KubeletConfig
from exporter.attribution.sanitize import clean_text

log = logging.getLogger(__name__)

# Generated code (see _podresources/api.proto) is untyped; importing it by name keeps
# mypy from checking it while the objects are used as Any.
api_pb2: Any = importlib.import_module("exporter.attribution._podresources.api_pb2")
api_pb2_grpc: Any = importlib.import_module("exporter.attribution._podresources.api_pb2_grpc")


@dataclass(frozen=True, slots=True)
class PodRef:
    """One container that holds a device."""

    namespace: str
    pod: str
    container: str


def device_uuid(device_id: str) -> str:
    """The GPU UUID inside a device-plugin id: time-sliced replicas are `UUID::n`."""
    return device_id.split("::", 1)[0].strip()


def build_map(
    response: Any, resource_prefixes: tuple[str, ...], max_length: int
) -> dict[str, tuple[PodRef, ...]]:
    """GPU UUID -> the containers it is allocated to, from a ListPodResourcesResponse."""
    out: dict[str, list[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(
                clean_text(pod.namespace, max_length),
                clean_text(pod.name, max_length),
                clean_text(container.name, max_length),
            )
            for devices in container.devices:
                if not devices.resource_name.startswith(resource_prefixes):
                    continue
                for device_id in devices.device_ids:
                    uuid = device_uuid(device_id)
                    refs = out.setdefault(uuid, [])
                    if uuid and ref not in refs:
                        refs.append(ref)
    return {uuid: tuple(refs) for uuid, refs in out.items() if uuid}


def fields_for(refs: tuple[PodRef, ...]) -> dict[str, str]:
    """The identity fields a GPU's allocation gives a process on it.

    One container: namespace, pod and container. Several (time-slicing, MPS): only what
    they all share, since only the process's cgroup can tell which pod it belongs to.
    """
    if not refs:
        return {}
    first = refs[0]
    out: dict[str, str] = {}
    if all(r.namespace == first.namespace for r in refs):
        out["k8s_namespace"] = first.namespace
        if all(r.pod == first.pod for r in refs):
            out["k8s_pod"] = first.pod
            if all(r.container == first.container for r in refs):
                out["k8s_container"] = first.container
    return {k: v for k, v in out.items() if v}


_EMPTY: Mapping[str, tuple[PodRef, ...]] = MappingProxyType({})


class KubeletWatcher:
    """Keeps a GPU -> pod map fresh from the kubelet on a background thread."""

    def __init__(
        self,
        config: KubeletConfig,
        *,
        clock: Callable[[], float],
        max_value_length: int = 128,
    ) -> None:
        self._config = config
        self._clock = clock
        self._max_length = max_value_length
        self._map: Mapping[str, tuple[PodRef, ...]] = _EMPTY
        self._last_success: float | None = None
        self._lock = threading.Lock()  # guards the channel and the counters
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._logged_kinds: set[str] = set()
        self.errors = 0
        self.refreshes = 0
        self.generation = 0

    def start(self) -> None:
        """Refresh now and then every refresh_seconds, on a daemon thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name="gpu-audit-kubelet", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._config.refresh_seconds)

    def _connect(self) -> Any:
        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self._config.socket}")
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def refresh(self) -> bool:
        """One List() call; on success the map is replaced whole. Never raises."""
        with self._lock:
            try:
                stub = self._connect()
                response = stub.List(
                    api_pb2.ListPodResourcesRequest(), timeout=self._config.timeout_seconds
                )
                new_map = build_map(
                    response, tuple(self._config.resource_prefixes), self._max_length
                )
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                self._failed(f"grpc_{code.name.lower()}" if code is not None else "grpc")
                return False
            except Exception as exc:  # noqa: BLE001 - a bad reply must not kill the thread
                self._failed(type(exc).__name__)
                return False
            if dict(self._map) != new_map:
                # Publish the map before the generation that names it.
                self._map = MappingProxyType(new_map)
                self.generation += 1
            self._last_success = self._clock()
            self.refreshes += 1
            if self._logged_kinds:
                log.info("kubelet pod-resources API reachable again")
                self._logged_kinds.clear()
            return True

    def _failed(self, kind: str) -> None:
        self.errors += 1
        if kind not in self._logged_kinds:
            self._logged_kinds.add(kind)
            log.warning(
                "kubelet pod-resources List() on %s failed (%s); GPU->pod attribution "
                "from the kubelet is paused until it answers",
                self._config.socket,
                kind,
            )

    def current(self) -> tuple[int, Mapping[str, tuple[PodRef, ...]]]:
        """(generation, map) of the latest refresh; the map is empty (generation -1)
        once it is older than three refresh periods. Reads only; never waits on a refresh.
        """
        last = self._last_success
        if last is not None and self._clock() - last > 3 * self._config.refresh_seconds:
            return -1, _EMPTY
        return self.generation, self._map

    def close(self) -> None:
        """Stop the thread and close the channel."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._config.timeout_seconds + 1)
            self._thread = None
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
                self._stub = None
