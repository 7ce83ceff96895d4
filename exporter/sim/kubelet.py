"""A simulated Kubernetes node: the kubelet's pod-resources API, answering List() with
the pods a scenario declares (`pod:` on its processes).

It speaks the real gRPC wire protocol on a unix socket, so the exporter's own kubelet
source (exporter.attribution.kubelet) reads it exactly as it reads a real kubelet, and
pod/namespace/container attribution, and the dcgm-exporter compat profile's pod labels,
are exercised end to end without a cluster. Started only under the simulator
(`--backend sim`) when the scenario declares pods and no kubelet is configured.

This module must never be used with a real backend, and must never serve anything but
the scenario's declared pods.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from exporter.sim.scenario import PodAllocation

# Generated code is untyped; imported by name as exporter.attribution.kubelet does.
api_pb2: Any = importlib.import_module("exporter.attribution._podresources.api_pb2")
api_pb2_grpc: Any = importlib.import_module("exporter.attribution._podresources.api_pb2_grpc")


class _Lister(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, allocations: Sequence[PodAllocation]) -> None:
        self._allocations = tuple(allocations)

    def List(self, request: Any, context: Any) -> Any:
        response = api_pb2.ListPodResourcesResponse()
        pods: dict[tuple[str, str], Any] = {}
        containers: dict[tuple[str, str, str], Any] = {}
        for a in self._allocations:
            pod = pods.get((a.namespace, a.pod))
            if pod is None:
                pod = pods[(a.namespace, a.pod)] = response.pod_resources.add(
                    name=a.pod, namespace=a.namespace)
            c = containers.get((a.namespace, a.pod, a.container))
            if c is None:
                c = containers[(a.namespace, a.pod, a.container)] = pod.containers.add(
                    name=a.container)
            c.devices.add(resource_name=a.resource, device_ids=list(a.device_ids))
        return response


class SimKubelet:
    """The pod-resources server on a unix socket in its own temporary directory."""

    def __init__(self, allocations: Sequence[PodAllocation]) -> None:
        # A short directory under /tmp: unix socket paths are limited to 107 bytes.
        self._dir = Path(tempfile.mkdtemp(prefix="gpu-audit-kl-", dir="/tmp"))
        self.socket = self._dir / "kubelet.sock"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(allocations),
                                                              self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None)
        shutil.rmtree(self._dir, ignore_errors=True)
