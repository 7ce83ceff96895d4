"""The sampling loop: slow-tier cadence, elapsed time between snapshots, publishing, and
isolation of failing consumers and failing cycles."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

from exporter.exposition.render import RenderOptions
from exporter.sampler import Sampler
from gpu_audit.http.state import RenderedSnapshot
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample
from gpu_audit.model.snapshot import Snapshot
from tests.exporter.helpers import NoAttribution


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.slow_flags: list[bool] = []
        self.fail_next = False

    def open(self) -> BackendInfo:
        return BackendInfo(name="fake")

    def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("driver hiccup")
        self.slow_flags.append(slow)
        return (GpuSample(GpuInfo(uuid="GPU-1", index=0),
                          values={"utilization_gpu": {(): 0.5}}),)

    def error_counts(self) -> Mapping[str, int]:
        return {}

    def close(self) -> None:
        pass


def _sampler(backend: FakeBackend, clock: list[float], **kw: object) -> Sampler:
    return Sampler(backend, BackendInfo(name="fake"), NoAttribution(), host="h",
                   interval_seconds=5.0, slow_interval_seconds=20.0,
                   render_options=RenderOptions(), scenario_clock=lambda: clock[0],
                   **kw)  # type: ignore[arg-type]


def test_slow_tier_runs_on_the_first_cycle_and_every_slow_interval() -> None:
    """With a 5 s interval and a 20 s slow tier, cycles 0, 4, 8 are slow."""
    backend, clock = FakeBackend(), [1000.0]
    sampler = _sampler(backend, clock)
    for _ in range(9):
        sampler.run_cycle()
        clock[0] += 5.0
    assert [i for i, slow in enumerate(backend.slow_flags) if slow] == [0, 4, 8]


def test_snapshots_carry_elapsed_time_and_are_published() -> None:
    """The first snapshot accounts 0 s, the next the time since the previous; each is
    published with its rendered exposition."""
    backend, clock = FakeBackend(), [1000.0]
    published: list[tuple[Snapshot, RenderedSnapshot]] = []
    sampler = _sampler(backend, clock, publish=lambda s, r: published.append((s, r)))
    sampler.run_cycle()
    clock[0] += 7.5
    sampler.run_cycle()
    assert [s.elapsed_seconds for s, _ in published] == [0.0, 7.5]
    assert b"gpu_utilization_ratio" in published[-1][1].body
    latest = sampler.latest()
    assert latest is not None and latest.snapshot is published[-1][0]


def test_a_failing_listener_is_counted_and_never_stops_sampling() -> None:
    """A consumer that raises (say, a broken audit writer) is logged and counted; the
    other consumers still get the snapshot and the next cycle runs."""
    backend, clock = FakeBackend(), [1000.0]
    seen: list[int] = []

    def broken(_snap: Snapshot) -> None:
        raise ValueError("boom")

    sampler = _sampler(backend, clock, listeners=[broken, lambda s: seen.append(s.cycle)])
    sampler.run_cycle()
    sampler.run_cycle()
    assert seen == [0, 1]
    assert sampler.stats.listener_errors == 2


def test_a_failing_cycle_is_counted_and_the_loop_goes_on() -> None:
    """In the background loop, a cycle whose backend raises is counted and the loop keeps
    sampling on its interval."""
    backend = FakeBackend()
    sampler = Sampler(backend, BackendInfo(name="fake"), NoAttribution(), host="h",
                      interval_seconds=0.02, slow_interval_seconds=1.0,
                      render_options=RenderOptions())
    backend.fail_next = True
    sampler.start()
    deadline = time.monotonic() + 5
    while sampler.stats.cycles < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert sampler.stats.failed_cycles == 1
    assert sampler.stats.cycles >= 3


def test_the_before_render_hook_completes_the_snapshot_everyone_sees() -> None:
    """What `before_render` returns (the GPU inventory adds a GPU no longer enumerated)
    is what is rendered, published and handed to listeners."""
    backend = FakeBackend()
    gone = GpuSample(GpuInfo(uuid="GPU-2", index=1), up=False, error="missing")

    def add_gone(snap: Snapshot) -> Snapshot:
        return dataclasses.replace(snap, gpus=(*snap.gpus, gone))

    seen: list[Snapshot] = []
    published: list[tuple[Snapshot, RenderedSnapshot]] = []
    sampler = _sampler(backend, [100.0], before_render=add_gone, listeners=[seen.append],
                       publish=lambda s, r: published.append((s, r)))
    out = sampler.run_cycle()
    assert [g.uuid for g in out.snapshot.gpus] == ["GPU-1", "GPU-2"]
    assert seen[0] is out.snapshot and published[0][0] is out.snapshot
    assert b'gpu_up{gpu="1",uuid="GPU-2"} 0' in out.rendered.body


def test_the_sites_mig_weights_reach_the_snapshot_and_the_exposition() -> None:
    """exporter.mig_weights is put on the MIG instances as they are sampled, so the
    audit records (which weigh the snapshot) and gpu_process_mig_weight_ratio carry the
    site's weight, not the table's 3/7."""
    from gpu_audit.model.mig import process_weights
    from gpu_audit.model.samples import MigInstance, ProcessSample

    class MigBackend(FakeBackend):
        def sample(self, now: float, slow: bool) -> Sequence[GpuSample]:
            return (GpuSample(GpuInfo(uuid="GPU-1", index=0, name="NVIDIA A100-SXM4-80GB",
                                      mig_mode=True),
                              mig=(MigInstance("MIG-2", 2, 0, "3g.40gb"),),
                              processes=(ProcessSample(pid=4242, gpu_instance_id=2),)),)

    sampler = _sampler(MigBackend(), [1000.0], mig_weights={"3g.40gb": 0.5})
    published = sampler.run_cycle()
    assert process_weights(published.snapshot.gpus[0]) == {2: 0.5}
    text = published.rendered.body.decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("gpu_process_mig_weight_ratio")]
    assert lines and all(ln.endswith(" 0.5") for ln in lines), lines
