"""MIG billed by the slice: the profile-weight table and what
close_cycle makes of a GPU counted instance by instance."""

from __future__ import annotations

import pytest

from gpu_audit.audit.holders import (
    CHARGED,
    F_HELD,
    F_IDLE_HELD,
    UNATTRIBUTED,
    USED,
    GpuCycle,
    close_cycle,
)
from gpu_audit.model.mig import (
    instance_weights,
    mig_weight,
    process_weights,
    profile_slices,
    unowned_slices,
)
from gpu_audit.model.samples import GpuInfo, GpuSample, MigInstance, ProcessSample

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(("model", "profile", "weight"), [
    (A100, "1g.10gb", 1 / 7), (A100, "3g.40gb", 3 / 7), (A100, "7g.80gb", 1.0),
    ("NVIDIA A100-PCIE-40GB", "2g.10gb", 2 / 7), ("NVIDIA H100 80GB HBM3", "4g.40gb", 4 / 7),
    ("NVIDIA H200", "1g.18gb", 1 / 7), ("NVIDIA A30", "2g.12gb", 2 / 4),
    ("NVIDIA A30", "4g.24gb", 1.0), (A100, "1g.10gb+me", 1 / 7), (A100, "1c.3g.40gb", 3 / 7),
])
def test_weight_is_the_profiles_compute_slices_over_the_gpus(model: str, profile: str,
                                                              weight: float) -> None:
    """weight = the profile's compute slices / the GPU model's (documented table)."""
    assert mig_weight(model, profile) == pytest.approx(weight)


@pytest.mark.parametrize(("model", "profile"), [
    ("NVIDIA GeForce RTX 4090", "1g.10gb"),  # a model not in the table
    (A100, "mystery"), (A100, "8g.90gb"),  # a profile that does not parse, or too big
    ("NVIDIA A30", "7g.80gb"),
])
def test_unknown_weight_is_none_never_a_guess(model: str, profile: str) -> None:
    """No weight where the table does not know the model or the profile."""
    assert mig_weight(model, profile) is None
    assert profile_slices("x") is None


def _gpu(model: str, profiles: dict[int, str], procs: list[int | None]) -> GpuSample:
    return GpuSample(
        info=GpuInfo(uuid="GPU-1", index=0, name=model, mig_mode=True),
        mig=tuple(MigInstance(f"MIG-{gi}", gi, 0, p) for gi, p in profiles.items()),
        processes=tuple(ProcessSample(pid=100 + i, gpu_instance_id=gi)
                        for i, gi in enumerate(procs)))


def test_a_gpu_is_weighed_only_when_every_instance_and_process_is() -> None:
    """Weights for every instance, or None: a process outside the instances, an
    unknown profile or a GPU without MIG leave the whole GPU to the shared rule."""
    layout = {2: "3g.40gb", 3: "2g.20gb", 4: "2g.20gb"}
    assert process_weights(_gpu(A100, layout, [2, 3])) == pytest.approx(
        {2: 3 / 7, 3: 2 / 7, 4: 2 / 7})
    assert process_weights(_gpu(A100, layout, [2, None])) is None
    assert instance_weights(_gpu(A100, {2: "3g.40gb", 3: "weird"}, [2])) is None
    assert instance_weights(_gpu(A100, {}, [])) is None
    assert unowned_slices({2: 3 / 7, 3: 2 / 7}, [2], [2, 3, None]) == pytest.approx(2 / 7)


ALICE, BOB = ("alice", "p"), ("bob", "q")


def test_close_cycle_bills_each_owner_its_slices() -> None:
    """On a sliced GPU: used = the instances' weights x the interval; charged = each
    instance's weighted time split among the owners in it; unowned slices go to the
    unattributed holder; held = the held slices, the rest stays idle."""
    c = GpuCycle(elapsed=60.0, up=True, gpu_seconds=60.0, utilization=0.01,
                 owners={ALICE: [60.0, 0.0, 0.0], BOB: [60.0, 0.0, 0.0]},
                 slices={ALICE: {2: 3 / 7, 3: 1 / 7}, BOB: {3: 1 / 7}},
                 unowned_processes=1, un_seen=True, un_seconds=60.0 * 2 / 7)
    holders, fleet = close_cycle(c)
    assert holders[ALICE][USED] == pytest.approx(60 * 4 / 7)
    assert holders[ALICE][CHARGED] == pytest.approx(60 * (3 / 7 + 1 / 14))
    assert holders[BOB][USED] == pytest.approx(60 / 7)
    assert holders[BOB][CHARGED] == pytest.approx(60 / 14)
    assert holders[UNATTRIBUTED][CHARGED] == pytest.approx(60 * 2 / 7)
    assert fleet[F_HELD] == pytest.approx(60 * 6 / 7)
    assert fleet[F_IDLE_HELD] == pytest.approx(60 * 6 / 7)
    assert sum(h[CHARGED] for h in holders.values()) == pytest.approx(fleet[F_HELD])


def test_close_cycle_whole_gpu_when_a_process_had_no_weight() -> None:
    """`whole` (a process record without a slice weight) falls back to 1 / holders."""
    c = GpuCycle(elapsed=60.0, up=True, gpu_seconds=60.0,
                 owners={ALICE: [60.0, 0.0, 0.0], BOB: [60.0, 0.0, 0.0]},
                 slices={ALICE: {2: 3 / 7}}, whole=True)
    holders, fleet = close_cycle(c)
    assert holders[ALICE][CHARGED] == holders[BOB][CHARGED] == 30.0
    assert holders[ALICE][USED] == 60.0
    assert fleet[F_HELD] == 60.0


def test_a_site_overrides_the_table_per_profile_or_per_model() -> None:
    """exporter.mig_weights: a `MODEL/PROFILE` key beats a bare `PROFILE` key, both beat
    the table, and a model the table does not know is weighed once the site says how
    (before, the table was the only source: a site could not change a weight)."""
    from gpu_audit.model.mig import with_site_weights

    layout = {2: "3g.40gb", 3: "2g.20gb"}
    site = {"3g.40gb": 0.5, "A100/2g.20gb": 0.25}
    (g,) = with_site_weights([_gpu(A100, layout, [2, 3])], site)
    assert process_weights(g) == pytest.approx({2: 0.5, 3: 0.25})
    (h,) = with_site_weights([_gpu("NVIDIA H100 80GB HBM3", layout, [2, 3])], site)
    assert process_weights(h) == pytest.approx({2: 0.5, 3: 2 / 7})  # H100: table for 2g
    unknown = _gpu("NVIDIA L40S", {1: "2g.20gb"}, [1])
    assert process_weights(unknown) is None
    (u,) = with_site_weights([unknown], {"L40S/2g.20gb": 0.5})
    assert process_weights(u) == pytest.approx({1: 0.5})
    plain = _gpu(A100, {}, [])
    assert with_site_weights([plain], site) == (plain,)


@pytest.mark.parametrize(("weights", "wrong"), [
    ({"weird": 0.5}, "weird"), ({"3g.40gb": 0.0}, "3g.40gb"), ({"3g.40gb": 1.5}, "3g.40gb"),
    ({"/3g.40gb": 0.5}, "/3g.40gb"), ({"2g.20gb": float("nan")}, "2g.20gb"),
])
def test_bad_site_weights_are_configuration_errors_naming_the_key(
        weights: dict[str, float], wrong: str) -> None:
    """A key that is not a profile, or a weight outside (0, 1], refuses the
    configuration and names the key."""
    from gpu_audit.errors import ConfigError
    from gpu_audit_app.config import load_settings

    with pytest.raises(ConfigError) as exc:
        load_settings(None, {("exporter", "mig_weights"): weights}, environ={})
    assert "exporter.mig_weights" in str(exc.value) and wrong in str(exc.value)
    ok = load_settings(None, {("exporter", "mig_weights"): {"3G.40GB": 0.5}}, environ={})
    assert ok.exporter.mig_weights == {"3g.40gb": 0.5}
