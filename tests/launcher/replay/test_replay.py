"""Replay through the real engine: the one-day trace orders the policies the way the
launcher promises, replays are deterministic, and the virtual jobs follow the preemption,
failure and leak protocols the engine expects (hand-made traces on a 1-GPU node)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import reasons as r
from launcher.config import LauncherCoreConfig
from launcher.constants import EXIT_PREEMPTED, EXIT_SIGKILL
from launcher.replay.demand import demand_ceiling
from launcher.replay.metrics import ReplayMetrics, max_min_fair, percentile
from launcher.replay.people import Person
from launcher.replay.report import write_report
from launcher.replay.run import POLICIES, ReplayRun, replay
from launcher.replay.trace import GIB, Trace, TraceHeader, TraceJob, load_trace

pytestmark = pytest.mark.timeout(120)

DAY = Path(__file__).resolve().parents[3] / "bench" / "traces" / "lab-day.jsonl"


@pytest.fixture(scope="module")
def day() -> dict[str, ReplayMetrics]:
    trace = load_trace(DAY)
    return {p: replay(trace, p).metrics for p in POLICIES}


def test_every_job_of_the_day_ends_under_every_policy(day: dict[str, ReplayMetrics]) -> None:
    for m in day.values():
        assert m.jobs_finished + m.jobs_failed == m.jobs
        assert m.jobs_unfinished == 0


def test_priority_uses_the_gpus_better_than_fifo(day: dict[str, ReplayMetrics]) -> None:
    """Busy GPU-time over the replay: packing fractions and backfilling beat strict
    whole-GPU FIFO, which also needs longer to get through the same work."""
    assert day["priority"].utilisation_overall > day["fifo-exclusive"].utilisation_overall
    assert day["priority"].makespan_s < day["fifo-exclusive"].makespan_s


def test_urgent_jobs_wait_less_under_priority(day: dict[str, ReplayMetrics]) -> None:
    p95 = {p: m.wait["urgent"].p95_s for p, m in day.items()}
    assert p95["priority"] < p95["fifo-exclusive"]
    assert p95["priority"] < p95["first-fit"]


def test_idle_reclaim_holds_fewer_gpus_idle_than_first_fit(
        day: dict[str, ReplayMetrics]) -> None:
    """Notebooks hold whole GPUs at 2 % under the baselines; the priority policy's idle
    reclaim shares their GPUs with fractional jobs, so fewer GPU-hours are held idle."""
    assert day["priority"].idle_held_gpu_hours < day["first-fit"].idle_held_gpu_hours
    assert day["priority"].idle_held_gpu_hours > 0  # the first 15 min of each notebook


def test_only_the_priority_policy_preempts(day: dict[str, ReplayMetrics]) -> None:
    assert day["priority"].preemptions > 0
    assert day["fifo-exclusive"].preemptions == day["first-fit"].preemptions == 0
    assert day["hand-launched"].preemptions == 0
    assert day["fifo-exclusive"].lost_preemption_gpu_hours == 0


def test_the_launcher_beats_people_launching_by_hand_on_the_day(
        day: dict[str, ReplayMetrics]) -> None:
    """The claim the replay exists for, on the CI trace: more of the GPUs' time used and
    more of the night's jobs done than when a job starts only while its owner is in."""
    hand, pri = day["hand-launched"], day["priority"]
    assert pri.utilisation_window > hand.utilisation_window
    assert pri.night_could > 0 and pri.night_completion > hand.night_completion
    assert 0 < pri.demand_ceiling <= 1 and pri.ceiling_share <= 1.0 + 1e-9
    assert all(m.demand_ceiling == pri.demand_ceiling for m in day.values())


def test_the_report_has_the_table_the_targets_and_a_plot(
        day: dict[str, ReplayMetrics], tmp_path: Path) -> None:
    """write_report: the metrics table with night completion, the issue's targets, the JSON
    and an SVG line per policy."""
    paths = write_report(tmp_path / "r", day, title="lab-day")
    md, data, plot = (p.read_text() for p in paths)
    assert "| night completion (could / did) |" in md and "## Targets" in md
    assert "utilisation >= 2.5x hand-launched" in md
    assert json.loads(data)["policies"].keys() == set(POLICIES)
    assert plot.startswith("<svg") and plot.count("<polyline") == len(POLICIES)


def test_same_trace_same_metrics() -> None:
    trace = load_trace(DAY)
    a, b = replay(trace, "priority").metrics, replay(trace, "priority").metrics
    assert a.as_dict() == b.as_dict()


# ------------------------------------------------------------------ hand-made traces

def _trace(*jobs: TraceJob, gpus: int = 1, people: tuple[Person, ...] = (),
           window: float = 86400.0) -> Trace:
    return Trace(header=TraceHeader(trace="t", gpus=gpus, window_seconds=window),
                 jobs=tuple(jobs), people=people)


def _job(name: str, arrival: float, **kw: object) -> TraceJob:
    base: dict[str, object] = {"name": name, "arrival": arrival, "user": name,
                               "memory_bytes": 20 * GIB, "runtime": 3600.0}
    return TraceJob.model_validate(base | kw)


def _exits(run: ReplayRun, name: str) -> list[tuple[float, int]]:
    return next(t.exits for t in run.executor.truth.values() if t.trace.name == name)


def test_a_checkpointing_victim_commits_at_a_step_boundary_and_loses_nothing() -> None:
    trace = _trace(
        _job("train", 0, runtime=7200.0, checkpoint_interval=600.0, checkpoint_seconds=10.0,
             step_seconds=4.0),
        _job("eval", 1000.0, urgency="urgent", runtime=600.0))
    run = replay(trace, "priority")
    kinds = [e.kind for e in run.engine.store.events(kind="preempted")]
    assert kinds == ["preempted"]
    signal = run.engine.store.events(kind="preempt_signal")[0].time
    code_times = _exits(run, "train")
    assert code_times[0][1] == EXIT_PREEMPTED
    # the commit comes at the next 4 s step boundary plus the 10 s write: within 14 s
    assert signal < code_times[0][0] <= signal + 14.0
    assert code_times[-1][1] == 0
    m = run.metrics
    assert m.preemptions == 1 and m.lost_preemption_gpu_hours == 0
    # the resumed run did only the rest of the work: held time = work + pauses + 14 s
    assert m.delivered_gpu_hours * 3600 < 7200 + 600 + 12 * 10 + 14 + 1


def test_a_victim_that_never_checkpoints_is_killed_after_the_grace_and_loses_its_work(
) -> None:
    cfg = LauncherCoreConfig()
    grace = cfg.engine.preempt_grace_seconds
    trace = _trace(_job("nock", 0, runtime=7200.0),
                   _job("eval", 1000.0, urgency="urgent", runtime=600.0))
    run = replay(trace, "priority", config=cfg)
    signal = run.engine.store.events(kind="preempt_signal")[0].time
    first = _exits(run, "nock")[0]
    assert first[1] == EXIT_SIGKILL and first[0] == pytest.approx(signal + grace)
    assert run.metrics.lost_preemption_gpu_hours * 3600 == pytest.approx(first[0])
    assert _exits(run, "nock")[-1][1] == 0  # rerun from scratch, then done


def test_a_crash_loses_work_since_the_last_commit_and_the_retry_finishes() -> None:
    trace = _trace(_job("crash", 0, runtime=3600.0, checkpoint_interval=1000.0,
                        checkpoint_seconds=0.0, fails_at=0.5, max_retries=1))
    run = replay(trace, "priority")
    exits = _exits(run, "crash")
    assert [c for _, c in exits] == [1, 0]
    assert exits[0][0] == pytest.approx(1800.0)
    assert run.metrics.lost_failure_gpu_hours * 3600 == pytest.approx(800.0)
    assert run.metrics.jobs_finished == 1


def test_a_leak_holds_the_gpu_until_the_release_barrier_reaps_it() -> None:
    trace = _trace(_job("leaky", 0, runtime=600.0, leaks=True),
                   _job("next", 10.0, runtime=600.0))
    run = replay(trace, "first-fit")
    leak = run.engine.store.events(kind="leak")
    assert len(leak) == 1 and leak[0].time == pytest.approx(600.0)
    nxt = next(t for t in run.executor.truth.values() if t.trace.name == "next")
    assert nxt.starts[0] > 600.0  # not placed on the GPU while the leak held it
    leaked = [iv for iv in run.executor.intervals if iv.leak]
    assert leaked and run.metrics.idle_held_gpu_hours * 3600 >= sum(
        iv.t1 - iv.t0 for iv in leaked) - 1e-6


def test_max_min_fair_share_and_percentile() -> None:
    assert max_min_fair({"a": 10.0, "b": 100.0, "c": 100.0}, 90.0) == {
        "a": 10.0, "b": 40.0, "c": 40.0}
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0
    assert percentile(list(range(1, 101)), 95) == 95


def test_a_job_that_keeps_crashing_past_its_retries_counts_as_failed() -> None:
    trace = _trace(_job("bad", 0, runtime=600.0, fails_at=0.2, fail_attempts=5,
                        max_retries=1, oom=True),
                   _job("good", 0, runtime=600.0))
    run = replay(trace, "priority")
    assert [c for _, c in _exits(run, "bad")] == [1, 1]
    failed = run.engine.store.events(kind="failed")
    assert len(failed) == 1 and "out of GPU memory" in failed[0].data["reason"]
    assert (run.metrics.jobs_finished, run.metrics.jobs_failed,
            run.metrics.jobs_unfinished) == (1, 1, 0)


HOUR = 3600.0


def test_hand_launched_jobs_start_only_while_their_owner_is_in() -> None:
    """The baseline the seed's numbers were measured against: a pipeline's second step,
    ready at 02:00, waits for its owner to come in at 09:00; the launcher starts it at
    02:00. The waiting step says why."""
    ann = Person(person="ann", present=((17 * HOUR, 18 * HOUR), (33 * HOUR, 40 * HOUR)))
    trace = _trace(_job("train", 17 * HOUR, user="ann", runtime=9 * HOUR),
                   _job("eval", 17 * HOUR, user="ann", runtime=HOUR, after=("train",)),
                   people=(ann,), window=2 * 86400.0)
    hand = replay(trace, "hand-launched", tick_seconds=60)
    starts = {t.trace.name: t.starts[0] for t in hand.executor.truth.values()}
    assert starts["train"] == pytest.approx(17 * HOUR, abs=60)
    assert starts["eval"] == pytest.approx(33 * HOUR, abs=60)
    away = [e for e in hand.engine.store.decisions() if e[2] == "start"]
    assert len(away) == 2
    launcher = replay(trace, "priority", tick_seconds=60)
    starts = {t.trace.name: t.starts[0] for t in launcher.executor.truth.values()}
    assert starts["eval"] == pytest.approx(26 * HOUR, abs=60)
    # night completion: both submitted at 17:00 could end by 09:00 (03:00); by hand the
    # eval ends at 10:00
    assert (hand.metrics.night_could, hand.metrics.night_did) == (2, 1)
    assert (launcher.metrics.night_could, launcher.metrics.night_did) == (2, 2)


def test_the_owner_away_reason_names_when_they_are_back() -> None:
    """Under hand-launched a job whose owner is away waits as owner_away, saying when they
    are back."""
    ann = Person(person="ann", present=((0.0, 60.0), (10 * HOUR, 12 * HOUR)))
    trace = _trace(_job("a", 0, user="ann", runtime=HOUR),
                   _job("b", 0, user="ann", runtime=HOUR), people=(ann,))
    run = replay(trace, "hand-launched", tick_seconds=60, horizon_windows=0.2)
    waiting = [j for j in run.engine.store.jobs() if j.state == "queued"]
    assert [j.wait_reason for j in waiting] == [r.OWNER_AWAY]
    assert waiting[0].wait_detail == "ann is away until Mon 10:00: nobody is there to start it"


def test_the_demand_ceiling_is_what_the_jobs_allow_at_best() -> None:
    """Half-busy work fills a quarter of a two-hour window; two jobs wanting the one GPU
    at once cap at the GPU; a pipeline step cannot start before the step it follows."""
    half = _trace(_job("a", 0, runtime=HOUR, util=0.5), window=2 * HOUR)
    assert demand_ceiling(half) == pytest.approx(0.25)
    both = _trace(_job("a", 0, runtime=HOUR, util=1.0), _job("b", 0, runtime=HOUR, util=1.0),
                  window=HOUR)
    assert demand_ceiling(both) == pytest.approx(1.0)
    late = _trace(_job("a", 0, runtime=HOUR, util=1.0, gpus=2),
                  _job("b", 0, user="a", runtime=HOUR, util=1.0, after=("a",)),
                  gpus=4, window=HOUR)
    assert demand_ceiling(late) == pytest.approx(0.5)


def test_an_unknown_urgency_is_refused_by_the_replay_not_skipped(tmp_path: Path) -> None:
    """A trace naming a level the configuration lacks: the command says so (exit 2); with
    a daemon configuration that defines it (`--config`), it replays."""
    from gpu_audit_app.cli import main

    path = tmp_path / "t.jsonl"
    path.write_text('{"trace": "t"}\n{"name": "a", "arrival": 0, "user": "u", '
                    '"memory_bytes": 1, "runtime": 60, "urgency": "asap"}\n')
    assert main(["launcher", "replay", str(path)]) == 2
    config = tmp_path / "launcher.yaml"
    config.write_text("core:\n  policy:\n    urgency_levels:\n      normal: {points: 0}\n"
                      "      asap: {points: 9000}\n")
    assert main(["launcher", "replay", str(path), "--config", str(config),
                 "--policy", "priority"]) == 0


def test_the_replay_command_writes_its_report(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`gpu-audit launcher replay TRACE --policy ... --report DIR`."""
    from gpu_audit_app.cli import main

    path = tmp_path / "t.jsonl"
    trace = _trace(_job("a", 0, runtime=HOUR), _job("b", 60, runtime=HOUR, urgency="urgent"))
    from launcher.replay.trace import dump_trace

    path.write_bytes(dump_trace(trace.header, trace.jobs,
                                [Person(person="a", present=((0.0, 86400.0),)),
                                 Person(person="b", present=((0.0, 86400.0),))]))
    code = main(["launcher", "replay", str(path), "--policy", "priority", "--policy",
                 "hand-launched", "--report", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0 and "| metric | priority | hand-launched |" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "metrics.json", "report.md", "utilisation.svg"]
    assert main(["launcher", "replay", str(tmp_path / "missing.jsonl")]) == 2


def test_a_daemon_refuses_the_hand_launched_baseline() -> None:
    """`hand-launched` is people at their desks, not a policy to run a node with."""
    from pydantic import ValidationError

    from gpu_audit_app.launcher.main import LauncherConfig

    with pytest.raises(ValidationError, match="replay baseline"):
        LauncherConfig.model_validate({"core": {"policy": {"name": "hand-launched"}}})


def test_a_trace_without_presence_refuses_the_hand_launched_baseline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trap: a version-1 trace (no people) replayed by hand with everyone always
    present is first-fit on whole GPUs, not a lab launching by hand. The replay refuses
    it, the command skips it loudly (all policies) or refuses it (named), and replays it
    only when told to assume presence, saying so."""
    from gpu_audit.errors import ConfigError
    from gpu_audit_app.cli import main
    from launcher.replay.trace import dump_trace

    trace = _trace(_job("a", 0, runtime=HOUR), _job("b", 60, runtime=HOUR))
    with pytest.raises(ConfigError, match="no presence windows"):
        replay(trace, "hand-launched")
    assert replay(trace, "hand-launched", assume_present=True).metrics.jobs_finished == 2
    path = tmp_path / "t.jsonl"
    path.write_bytes(dump_trace(trace.header, trace.jobs))
    capsys.readouterr()
    assert main(["launcher", "replay", str(path)]) == 0
    got = capsys.readouterr()
    assert "hand-launched baseline SKIPPED" in got.err and "always at the desk" in got.err
    assert "| metric | priority | first-fit | fifo-exclusive |" in got.out
    assert main(["launcher", "replay", str(path), "--policy", "hand-launched"]) == 2
    assert "no presence windows" in capsys.readouterr().err
    assert main(["launcher", "replay", str(path), "--policy", "hand-launched",
                 "--assume-present"]) == 0
    assert "ASSUMES" in capsys.readouterr().err


def test_a_person_at_the_desk_takes_the_next_free_gpu_for_urgent_work() -> None:
    """By hand, someone with urgent work does not queue behind other people's older
    jobs: when the running job ends, the urgent one (submitted last) starts first."""
    everyone = tuple(Person(person=u, present=((0.0, 86400.0),))
                     for u in ("run", "old1", "old2", "hot"))
    trace = _trace(_job("run", 0, runtime=HOUR), _job("old1", 60, runtime=HOUR),
                   _job("old2", 120, runtime=HOUR),
                   _job("hot", 600, runtime=600.0, urgency="urgent"), people=everyone)
    hand = replay(trace, "hand-launched", tick_seconds=60)
    starts = {t.trace.name: t.starts[0] for t in hand.executor.truth.values()}
    assert starts["hot"] == pytest.approx(HOUR, abs=120)
    assert starts["old1"] > starts["hot"]


def test_verdicts_compare_what_the_report_prints() -> None:
    """"57.5 % vs 57.5 %" is not a miss: values that print the same are equal; a strict
    bound ("< 10 min") is not met by a value that prints as the bound."""
    from launcher.replay.report import _pct, verdict

    assert verdict(0.57496, 0.575, True, _pct)
    assert not verdict(0.5740, 0.575, True, _pct)
    from launcher.replay.report import targets

    m = replay(_trace(_job("a", 0, runtime=HOUR), _job("b", 0, runtime=HOUR)),
               "first-fit").metrics
    worse = m.__class__(**{**m.__dict__, "policy": "priority",
                           "utilisation_window": m.utilisation_window - 1e-6})
    rows = targets({"priority": worse, "first-fit": m})
    row = next(r for r in rows if r["target"].startswith("priority at least as good as first"))
    assert row["met"], row


def test_deadline_jobs_are_counted_apart_from_short_ones_against_the_joint_ceiling(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two 3-hour trainings due at 04:00 on a 1-GPU node: each could make it alone, only
    one can with the other; the short job is counted on its own line. The report shows
    the joint ceiling beside the figure and puts the definitions first."""
    trace = _trace(_job("t1", 0, runtime=3 * HOUR, deadline=4 * HOUR),
                   _job("t2", 1, runtime=3 * HOUR, deadline=4 * HOUR),
                   _job("dbg", 2, runtime=600.0, deadline=8 * HOUR), gpus=1)
    m = replay(trace, "first-fit").metrics
    assert (m.deadline_long.jobs, m.deadline_long.alone, m.deadline_long.jointly,
            m.deadline_long.met) == (2, 2, 1, 1)
    assert (m.deadline_short.jobs, m.deadline_short.met) == (1, 1)
    assert m.deadline_long.share_of_joint == 1.0
    paths = write_report(tmp_path, {"first-fit": m}, title="t")
    md = paths[0].read_text()
    assert md.index("## Definitions") < md.index("| metric |")
    assert "| deadline trainings met / jointly feasible (alone, all) | 1 / 1 = 100.0 % (2, 2) |" \
        in md


def test_the_replay_command_applies_the_evening_deadline_to_a_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_audit_app.cli import main
    from launcher.replay.trace import dump_trace

    trace = _trace(_job("night", 20 * HOUR, runtime=3 * HOUR), _job("day", 10 * HOUR,
                                                                   runtime=HOUR))
    path = tmp_path / "t.jsonl"
    path.write_bytes(dump_trace(trace.header, trace.jobs))
    assert main(["launcher", "replay", str(path), "--policy", "priority", "--json",
                 "--set", "policy.evening_deadline=09:00"]) == 0
    data = json.loads(capsys.readouterr().out)["policies"]["priority"]
    assert data["deadline_long"]["jobs"] == 1 and data["deadline_long"]["met"] == 1
    assert main(["launcher", "replay", str(path), "--set", "policy.nope=1",
                 "--set", "bad"]) == 2
    err = capsys.readouterr().err
    assert "policy.nope" in err and "'bad'" in err
