"""The simulated Kubernetes node: scenarios declare pods, the simulator serves them over
the kubelet's pod-resources gRPC API, and the exporter's real kubelet source reads them."""

from __future__ import annotations

import time

from exporter.attribution.config import KubeletConfig
from exporter.attribution.kubelet import KubeletWatcher, PodRef
from exporter.sim.kubelet import SimKubelet
from exporter.sim.scenario import PodAllocation, load_scenario


def test_busy_and_mig_declare_their_pods() -> None:
    """busy's inference process runs in pod serving/triton-search-0 on GPU 2; each of
    mig's MIG pods holds its own instance under the nvidia.com/mig-<profile> resource."""
    busy = load_scenario("busy")
    gpu2 = busy.gpus[2].info.uuid
    assert busy.pod_allocations() == [
        PodAllocation("serving", "triton-search-0", "tritonserver", "nvidia.com/gpu", (gpu2,))]
    mig = load_scenario("mig")
    allocs = {(a.namespace, a.pod): (a.resource, a.device_ids) for a in mig.pod_allocations()}
    instances = {m.gpu_instance_id: m for m in mig.gpus[0].mig}
    assert allocs[("fraud", "train-fd-12-0")] == ("nvidia.com/mig-3g.40gb",
                                                   (instances[2].uuid,))
    assert allocs[("ocr", "ocr-batch-2")] == ("nvidia.com/mig-2g.20gb", (instances[4].uuid,))
    assert len(allocs) == 3


def test_sim_kubelet_answers_the_real_kubelet_source() -> None:
    """The exporter's KubeletWatcher, pointed at the simulated kubelet's socket, maps
    busy's GPU 2 to its pod as it would with a real kubelet."""
    scenario = load_scenario("busy")
    kubelet = SimKubelet(scenario.pod_allocations())
    watcher = KubeletWatcher(KubeletConfig(enabled=True, socket=kubelet.socket),
                             clock=time.monotonic)
    try:
        assert watcher.refresh()
        _, pods = watcher.current()
        assert dict(pods) == {scenario.gpus[2].info.uuid: (
            PodRef("serving", "triton-search-0", "tritonserver"),)}
    finally:
        watcher.close()
        kubelet.stop()
    assert not kubelet.socket.exists()
