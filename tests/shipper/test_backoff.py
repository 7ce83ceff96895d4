"""Retry delays: capped exponential ceiling, full jitter, Retry-After as a bounded floor."""

from __future__ import annotations

import random
import statistics

from shipper.delivery.backoff import Backoff


def test_full_jitter_stays_within_the_capped_exponential_ceiling() -> None:
    """Each delay is uniform in [0, min(cap, base * 2**attempt)]: it spreads over the whole
    range (not a fixed value) and never passes the cap, even after very many attempts."""
    b = Backoff(base=0.5, cap=60.0, rng=random.Random(1))
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (3, 4.0), (6, 32.0), (7, 60.0), (5000, 60.0)]:
        assert b.ceiling(attempt) == ceiling
        draws = [b.delay(attempt) for _ in range(2000)]
        assert all(0.0 <= d <= ceiling for d in draws)
        assert min(draws) < 0.05 * ceiling  # full jitter reaches down to ~0
        assert max(draws) > 0.95 * ceiling  # ... and up to the ceiling
        assert abs(statistics.mean(draws) - ceiling / 2) < 0.05 * ceiling


def test_retry_after_is_a_floor_bounded_by_its_maximum() -> None:
    """A server's Retry-After is never undercut, and a huge one is cut to retry_after_max."""
    b = Backoff(base=0.5, cap=1.0, retry_after_max=600.0, rng=random.Random(2))
    assert all(b.delay(0, retry_after=7.0) == 7.0 for _ in range(100))
    assert b.delay(0, retry_after=86400.0) == 600.0
    big = Backoff(base=100.0, cap=100.0, rng=random.Random(3))
    draws = [big.delay(0, retry_after=1.0) for _ in range(200)]
    assert all(d >= 1.0 for d in draws) and max(draws) > 50  # the larger of the two
    assert 0.0 <= b.delay(0, retry_after=0.0) <= 0.5  # "Retry-After: 0" is no floor
