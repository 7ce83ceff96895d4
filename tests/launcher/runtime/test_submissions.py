"""Submissions read off the loop (launcher/submissions.py, launcher/parseworker.py): in
turn per uid, bounded, killed past their deadline, by an unprivileged worker."""

from __future__ import annotations

import os
import time
from pathlib import Path

from launcher.submissions import Parsed, SubmissionReader

SLOW = "name: slow\ncommand: [" + ", ".join(["x"] * 200_000) + "]\n"
QUICK = "{name: quick, command: [x], gpus: 0}"


def _wait(reader: SubmissionReader, n: int, timeout: float = 120) -> list[tuple[object,
                                                                              Parsed]]:
    got: list[tuple[object, Parsed]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} submissions read"
        got += reader.results()
        time.sleep(0.05)
    return got


def test_uids_are_read_in_turn_and_a_slow_one_is_cut_at_its_deadline() -> None:
    """uid 1 queues three submissions too slow to read, then uid 2 one quick one: uid 2's
    is read second (not fourth), the slow ones are refused at the deadline with the
    reason, and a ninth waiting submission of one uid is refused at once."""
    reader = SubmissionReader(timeout_seconds=1.0)
    try:
        for i in range(3):
            assert reader.submit(("a", i), 1, SLOW, "slow.yaml") is None
        assert reader.submit(("b", 0), 2, QUICK, "quick.yaml") is None
        got = _wait(reader, 4)
        order = [token for token, _ in got]
        assert order[1] == ("b", 0), order
        parsed = dict(got)
        assert parsed[("b", 0)].specs is not None and parsed[("b", 0)].specs[0].name == "quick"
        for i in range(3):
            assert parsed[("a", i)].specs is None
            assert "took more than 1 s to read" in parsed[("a", i)].problems[0]
        for i in range(8):
            assert reader.submit(("c", i), 3, QUICK, "q.yaml") is None
        refused = reader.submit(("c", 8), 3, QUICK, "q.yaml")
        assert refused is not None and "8 submissions of uid 3" in refused
        _wait(reader, 8)
    finally:
        reader.close()


def test_the_worker_reads_as_nobody_and_lists_every_problem() -> None:
    """The worker gave up root before reading anything (uid and gid nobody, no groups);
    a bad submission comes back with every problem, as load_submission lists them."""
    reader = SubmissionReader(timeout_seconds=30.0)
    try:
        reader.submit("t", 1, "{name: a, command: [x], gpu_fraction: 0.01, gpus: 99}", "a.yaml")
        ((_, parsed),) = _wait(reader, 1)
        assert parsed.specs is None and len(parsed.problems) == 2, parsed.problems
        worker = reader._worker
        assert worker is not None
        status = Path(f"/proc/{worker.pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        groups = next(line for line in status.splitlines() if line.startswith("Groups:"))
        if os.geteuid() == 0:
            assert uid_line.split()[1:] == ["65534"] * 4, uid_line
            assert groups.split()[1:] == [], groups
    finally:
        reader.close()
