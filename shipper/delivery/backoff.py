"""Retry delays: capped exponential backoff with full jitter, honouring Retry-After.

Full jitter (a uniform draw between 0 and the capped exponential) spreads the retries of
many shippers hitting one recovering backend instead of synchronising them. A server's
Retry-After is a floor: we never come back sooner than it asked, and never later than
`retry_after_max` however long it asked for (a broken header must not park a sink for a
day). This module only computes numbers; it never sleeps and never decides to give up:
the engine retries transient errors without limit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delay before retry number `attempt` (0 = the first retry)."""

    base: float = 0.5
    cap: float = 60.0
    retry_after_max: float = 600.0
    rng: random.Random = field(default_factory=random.Random)

    def ceiling(self, attempt: int) -> float:
        """The upper bound of the jittered delay for this attempt: min(cap, base * 2**n)."""
        # the exponent is clamped so a sink down for days cannot overflow the float
        return min(self.cap, self.base * (2.0 ** min(attempt, 62)))

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait: uniform(0, ceiling(attempt)), at least the server's Retry-After."""
        jittered = self.rng.uniform(0.0, self.ceiling(attempt))
        if retry_after is None or retry_after <= 0:
            return jittered
        return max(jittered, min(retry_after, self.retry_after_max))
