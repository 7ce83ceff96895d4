"""chargeback.slurm.ended's rules for the run that just ended, without Slurm: which
attempt it was, and when the exporter's trail covers its end."""

from __future__ import annotations

import pytest

from chargeback.slurm.ended import RunTimes, attempt_of, trail_covers


@pytest.mark.parametrize(("restart_count", "run", "env", "expected"), [
    (2, RunTimes(None, True, 5), "7", 2),  # the prolog's count wins
    (None, RunTimes(None, False, 3), "", 3),  # slurmctld's record of this run
    (None, RunTimes(None, True, 3), "", 2),  # the record already counts the requeue
    (True, RunTimes(None, False, None), "4", 4),  # a bool is no count: the environment's
    (-1, RunTimes(None, True, None), "0", 0),  # never below 0
    (None, RunTimes(None, False, None), "x", 0),
])
def test_the_attempt_is_the_prologs_else_slurms_less_a_requeue(
        restart_count: object, run: RunTimes, env: str, expected: int) -> None:
    assert attempt_of(restart_count, run, env) == expected


def test_the_trail_covers_the_end_at_the_next_interval_boundary() -> None:
    """Usage is written at the first sample past each multiple of the audit interval
    (UTC-aligned): a run ending at 130 s is covered by the record due at 180 s (60 s
    intervals), one ending on a boundary by that boundary's."""
    assert trail_covers(130.0, 60.0) == 180.0
    assert trail_covers(120.0, 60.0) == 120.0
    assert trail_covers(1.0, 300.0) == 300.0
