"""Every runtime estimate with its source, through the real daemon: `queue` and `status`
(text and --json) show what each job is estimated to need and where that comes from
(spec, history:name, progress, max_runtime, none), and `submit` prints the estimated
start and finish in the daemon's current queue, not only on an empty node."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.launcher.runtime.daemon import REPO, LauncherDaemon, wait_for
from tests.launcher.runtime.test_progress import TRAIN  # over an hour left by progress
from tests.launcher.runtime.users import ALICE, BOB, job_python

PY = job_python()


@pytest.fixture
def daemon(home: Path) -> Iterator[LauncherDaemon]:
    d = LauncherDaemon(home, gpus=1).start()
    yield d
    d.stop()
    d.kill_jobs()


def _submit(daemon: LauncherDaemon, home: Path, name: str, spec: dict[str, object],
            ) -> dict[str, object]:
    (home / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **spec}))
    r = daemon.client(ALICE, "submit", "--json", f"{name}.yaml")
    assert r.returncode == 0, r.stderr
    answer: dict[str, object] = json.loads(r.stdout)
    return answer


def test_estimates_and_their_sources_in_queue_status_and_submit(
        daemon: LauncherDaemon, home: Path) -> None:
    # history: a finished run of the same name is what the next one is estimated at
    quick = _submit(daemon, home, "quick", {"command": [PY, "-c", "import time; "
                                                                  "time.sleep(0.5)"]})
    (first,) = quick["ids"]  # type: ignore[misc]
    daemon.wait_state(first, {"succeeded"}, timeout=60)

    (home / "train.py").write_text(TRAIN)
    stop = home / "stop"
    train = _submit(daemon, home, "train", {
        "env": {"PYTHONPATH": str(REPO)}, "expected_runtime": "2h",
        "command": [PY, str(home / "train.py"), str(home / "ck"), str(stop)]})
    (t_id,) = train["ids"]  # type: ignore[misc]
    assert train["timing"][0]["estimate_source"] == "spec"  # type: ignore[index]
    daemon.wait_state(t_id, {"running"}, timeout=60)

    def from_progress() -> dict[str, object] | None:
        e = daemon.job(t_id).get("estimate")
        return e if e and e["source"] == "progress" else None

    est = wait_for(from_progress, 60, "the running job's estimate from its progress")
    # 100000 steps at tens per second: over an hour, and not the 2 h the spec said
    assert 3600 < float(est["remaining_seconds"]) < 7200 - 60  # type: ignore[arg-type]

    # the GPU is held: the next job starts when the running one is estimated to end
    before = time.time()
    again = _submit(daemon, home, "quick", {"command": [PY, "-c", "pass"]})
    (timing,) = again["timing"]  # type: ignore[misc]
    assert timing["estimate_source"] == "history:name"
    assert 0 < timing["estimate_seconds"] < 60
    left = float(daemon.job(t_id)["estimate"]["remaining_seconds"])  # type: ignore[index]
    # (the running job's throughput, so its estimate, moves a little between reads)
    assert timing["estimated_start"] == pytest.approx(before + left, rel=0.2)
    assert timing["estimated_finish"] == pytest.approx(
        timing["estimated_start"] + timing["estimate_seconds"])
    limited = _submit(daemon, home, "limited", {"command": [PY, "-c", "pass"],
                                                "max_runtime_seconds": 600})
    (lt,) = limited["timing"]  # type: ignore[misc]
    assert lt["estimate_source"] == "max_runtime"
    (text_yaml := home / "text.yaml").write_text(yaml.safe_dump(
        {"name": "quick", "command": [PY, "-c", "pass"]}))
    printed = daemon.client(ALICE, "submit", str(text_yaml.name)).stdout
    assert "estimated start" in printed and "in the current queue" in printed, printed
    assert "source history:name" in printed
    bare = _submit(daemon, home, "bare", {"command": [PY, "-c", "pass"]})
    (bt,) = bare["timing"]  # type: ignore[misc]
    assert bt["estimate_source"] == "none" and bt["estimate_seconds"] is None
    # nothing bounds when a job without an estimate or a limit ends: said, not guessed
    (home / "after.yaml").write_text(yaml.safe_dump(
        {"name": "after", "command": [PY, "-c", "pass"], "expected_runtime": 60}))
    printed = daemon.client(ALICE, "submit", "after.yaml").stdout
    assert "estimated start unknown" in printed, printed

    # the queue (public) and status, text and JSON, say each estimate's source
    q = json.loads(daemon.client(BOB, "queue", "--json").stdout)
    sources = {j["name"]: j["estimate"]["source"] for j in q["jobs"]}  # type: ignore[index]
    assert sources == {"train": "progress", "quick": "history:name",
                       "limited": "max_runtime", "bare": "none", "after": "spec"}
    running = next(j for j in q["jobs"] if j["id"] == t_id)
    assert running["estimated_end"] > time.time() + 3600
    # one snapshot, in submission order (the same priority): each starts when the one
    # before is estimated to end, from the running job's estimated end; nothing is
    # bounded behind the job with no estimate
    waiting = sorted((j for j in q["jobs"] if j["state"] == "queued"), key=lambda j: j["id"])
    assert [j["name"] for j in waiting] == ["quick", "limited", "quick", "bare", "after"]
    quick_s = waiting[0]["estimate"]["total_seconds"]
    starts = [j["estimated_start"] for j in waiting]
    assert starts[0] == pytest.approx(running["estimated_end"], abs=5)
    assert starts[1] == pytest.approx(starts[0] + quick_s, abs=5)
    assert starts[2] == pytest.approx(starts[1] + 600, abs=5)
    assert starts[3] == pytest.approx(starts[2] + quick_s, abs=5)
    assert starts[4] is None
    queue = daemon.client(BOB, "queue").stdout
    assert "ESTIMATE" in queue and " progress" in queue and "history:name" in queue
    assert "max_runtime" in queue and "- none" in queue
    table = daemon.client(ALICE, "status").stdout
    assert "ESTIMATE" in table and "history:name" in table and "progress" in table
    detail = daemon.client(ALICE, "status", str(t_id)).stdout
    assert "runtime estimate:" in detail and "(source: progress)" in detail
    stop.write_text("")
    stop.chmod(0o644)
    daemon.wait_state(t_id, {"succeeded"}, timeout=60)
