"""Curve shapes, sizes and noise behave as the scenario README documents."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from exporter.sim.curves import compile_curve, curve_bounds, unit_noise
from exporter.sim.schema import CurveSpec, ProcessSpec, parse_quantity

GiB = 1024**3


def curve(raw: object) -> CurveSpec:
    """A curve as a scenario would write it (via the process model's `memory` field)."""
    return ProcessSpec.model_validate({"name": "p", "pid": 1, "gpu": 0, "memory": raw}).memory


@pytest.mark.parametrize(("text", "expected"), [
    ("80GiB", 80 * GiB), ("512 MiB", 512 * 1024**2), ("30GB", 30e9), ("1.5TiB", 1.5 * 1024**4),
    ("12", 12.0), (7, 7.0), (0.25, 0.25),
])
def test_sizes_are_converted_to_bytes(text: object, expected: float) -> None:
    """Binary and decimal size units and plain numbers all parse to base units."""
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("bad", ["lots", "12 parsecs", "GiB", "-3GiB"])
def test_bad_sizes_are_rejected(bad: str) -> None:
    """Text that is not a number with a known unit is an error naming the units."""
    with pytest.raises(ValueError, match="not a number or a size"):
        parse_quantity(bad)


def test_bare_value_is_a_constant() -> None:
    """`memory: 30GiB` is a constant curve."""
    c = compile_curve(curve("30GiB"), key=1)
    assert c.constant == 30 * GiB and c.at(0) == c.at(1e6) == 30 * GiB


def test_linear_rate_per_minute_with_max() -> None:
    """A linear curve grows by `rate` per `per` and stops at `max`."""
    spec = curve({"start": "1GiB", "rate": "60MiB", "per": "minute", "max": "2GiB"})
    c = compile_curve(spec, key=1)
    assert c.at(0) == GiB
    assert c.at(60) == GiB + 60 * 1024**2
    assert c.at(10**6) == 2 * GiB
    assert curve_bounds(spec, None) == (GiB, 2 * GiB)


def test_steps_hold_and_ramp_interpolates() -> None:
    """Steps hold each value until the next point; a ramp draws straight lines."""
    steps = compile_curve(curve({"steps": [[0, 1], [10, 5]]}), key=1)
    ramp = compile_curve(curve({"ramp": [[0, 1], [10, 5]]}), key=1)
    assert [steps.at(t) for t in (-1, 0, 9.9, 10, 99)] == [1, 1, 1, 5, 5]
    assert [ramp.at(t) for t in (-1, 0, 5, 10, 99)] == [1, 1, 3, 5, 5]


@pytest.mark.parametrize("raw", [
    {"value": 1, "rate": 2}, {}, {"ramp": []}, {"steps": [[5, 1], [1, 2]]},
])
def test_curve_needs_exactly_one_valid_shape(raw: dict[str, object]) -> None:
    """Zero or two shapes, empty or unordered point lists are refused."""
    with pytest.raises(ValidationError):
        curve(raw)


def test_unbounded_growth_is_visible_in_bounds() -> None:
    """A growing curve without max has an infinite peak unless its span is known."""
    spec = curve({"start": 0, "rate": 1})
    assert math.isinf(curve_bounds(spec, None)[1])
    assert curve_bounds(spec, 100) == (0, 100)


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=-10**9,
                                                                   max_value=10**9))
def test_noise_is_in_range_and_a_pure_function(key: int, bucket: int) -> None:
    """Noise is in [-1, 1) and the same for the same key and time bucket."""
    v = unit_noise(key, bucket)
    assert -1.0 <= v < 1.0
    assert unit_noise(key, bucket) == v


def test_noise_is_clamped_to_the_curve_range() -> None:
    """A ratio near 0 with noise never goes below 0 (or above 1)."""
    c = compile_curve(curve({"value": 0.0, "noise": 0.5}), key=7, lo=0.0, hi=1.0)
    values = [c.at(t) for t in range(500)]
    assert min(values) == 0.0 and 0.0 < max(values) <= 0.5
    assert len(set(values)) > 100, "noise varies from second to second"
