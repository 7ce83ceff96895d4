"""The kubelet pod-resources source against a real gRPC server on a unix socket."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from exporter.attribution._podresources import api_pb2, api_pb2_grpc
from exporter.attribution.config import KubeletConfig
from exporter.attribution.kubelet import KubeletWatcher, PodRef, device_uuid
from tests.exporter.attribution.helpers import (
    GPU0,
    GPU1,
    config,
    gpu,
    make_tree,
    only,
    proc,
    resolver,
)

POD_UID = "fbc202d3-da21-11e8-ab5e-42010a80014b"
CID = "0a1b22ec1361a97c3511db37a4bae932d41b22264e5b97611748f8b662312574"


@dataclass
class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """A PodResourcesLister that answers List() with `pods` (ns, pod, container, resource,
    device ids) and can be told to fail."""

    pods: list[tuple[str, str, str, str, list[str]]] = field(default_factory=list)
    fail: grpc.StatusCode | None = None
    calls: int = 0

    def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.fail is not None:
            context.abort(self.fail, "injected")
        response = api_pb2.ListPodResourcesResponse()
        for ns, name, container, resource, ids in self.pods:
            pod = response.pod_resources.add(name=name, namespace=ns)
            c = pod.containers.add(name=container)
            c.devices.add(resource_name=resource, device_ids=ids)
        return response


@pytest.fixture
def kubelet() -> Iterator[tuple[FakeKubelet, Path]]:
    # A short directory: unix socket paths are limited to 107 bytes.
    directory = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    socket = directory / "kubelet.sock"
    servicer = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield servicer, socket
    finally:
        server.stop(grace=None)
        shutil.rmtree(directory, ignore_errors=True)


def test_device_uuid_strips_time_slicing_replica_suffix() -> None:
    """`UUID::n` (time-sliced replica ids) become the GPU UUID."""
    assert device_uuid(f"{GPU0}::3") == GPU0 and device_uuid(GPU0) == GPU0


def test_list_maps_gpus_to_pods_and_drops_terminated_pods(
    kubelet: tuple[FakeKubelet, Path],
) -> None:
    """After a refresh each GPU maps to its pod; a pod the kubelet stops listing is
    gone after the next refresh; other resources are ignored."""
    servicer, socket = kubelet
    servicer.pods = [
        ("ml", "train-0", "main", "nvidia.com/gpu", [GPU0]),
        ("ml", "cpu-only", "main", "example.com/fpga", [GPU1]),
    ]
    w = KubeletWatcher(KubeletConfig(socket=socket), clock=time.monotonic)
    try:
        assert w.refresh()
        gen, m = w.current()
        assert m == {GPU0: (PodRef("ml", "train-0", "main"),)}
        servicer.pods = []
        assert w.refresh()
        gen2, m2 = w.current()
        assert m2 == {} and gen2 > gen
    finally:
        w.close()


def test_time_sliced_gpu_shared_by_pods_gives_only_common_fields(
    kubelet: tuple[FakeKubelet, Path], tmp_path: Path
) -> None:
    """Two pods sharing one GPU (`UUID::0`, `UUID::1`): the kubelet alone gives only the
    namespace; the pod comes from the process's cgroup pod UID."""
    servicer, socket = kubelet
    servicer.pods = [
        ("ml", "a", "main", "nvidia.com/gpu", [f"{GPU0}::0"]),
        ("ml", "b", "main", "nvidia.com/gpu", [f"{GPU0}::1"]),
    ]
    p = proc(5, cgroup="0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                       f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope")
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path, sources=("cgroup", "kubelet"),
                 kubelet={"enabled": True, "socket": socket, "refresh_seconds": 60})
    r = resolver(cfg)
    try:
        assert r.refresh_kubelet()
        a = only(r.attribute([gpu(GPU0, p)]))
        assert (a.k8s_namespace, a.k8s_pod, a.k8s_pod_uid) == ("ml", "", POD_UID)
        assert a.sources["k8s_namespace"] == "kubelet" and a.sources["k8s_pod_uid"] == "cgroup"
    finally:
        r.close()


def test_background_timer_refreshes_without_attribute_calls(
    kubelet: tuple[FakeKubelet, Path], tmp_path: Path
) -> None:
    """The map is refreshed on the watcher's own thread: attribute() sees a new pod
    without calling the kubelet itself."""
    servicer, socket = kubelet
    servicer.pods = [("ml", "first", "c", "nvidia.com/gpu", [GPU0])]
    p = proc(6)
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path, sources=("kubelet",),
                 kubelet={"enabled": True, "socket": socket, "refresh_seconds": 0.05})
    r = resolver(cfg)
    try:
        deadline = time.monotonic() + 10
        while only(r.attribute([gpu(GPU0, p)])).k8s_pod != "first":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        servicer.pods = [("ml", "second", "c", "nvidia.com/gpu", [GPU0])]
        calls_before = servicer.calls
        while only(r.attribute([gpu(GPU0, p)])).k8s_pod != "second":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert servicer.calls > calls_before
    finally:
        r.close()


def test_errors_counted_logged_once_and_stale_map_dropped(
    kubelet: tuple[FakeKubelet, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Failed List() calls are counted and logged once per kind; once the last good map
    is three refresh periods old it is no longer used."""
    servicer, socket = kubelet
    servicer.pods = [("ml", "p", "c", "nvidia.com/gpu", [GPU0])]
    now = [0.0]
    w = KubeletWatcher(KubeletConfig(socket=socket, refresh_seconds=10), clock=lambda: now[0])
    try:
        assert w.refresh()
        servicer.fail = grpc.StatusCode.UNAVAILABLE
        assert not w.refresh() and not w.refresh()
        assert w.errors == 2
        assert len([r for r in caplog.records if "grpc_unavailable" in r.getMessage()]) == 1
        now[0] = 25.0
        assert w.current()[1] == {GPU0: (PodRef("ml", "p", "c"),)}
        now[0] = 31.0
        assert w.current() == (-1, {})
    finally:
        w.close()


def test_missing_socket_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """No kubelet socket: refresh fails, is counted, and attribution carries on."""
    p = proc(7)
    make_tree(tmp_path / "proc", p)
    cfg = config(tmp_path, kubelet={"enabled": True, "socket": tmp_path / "none.sock",
                                    "refresh_seconds": 60, "timeout_seconds": 0.5})
    r = resolver(cfg)
    try:
        assert not r.refresh_kubelet()
        a = only(r.attribute([gpu(GPU0, p)]))
        assert a.user == "alice"
        assert r.stats()["kubelet_errors"] >= 1
    finally:
        r.close()
