"""Job specs: one job or a pipeline; every problem listed with its line; hostile YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_audit.errors import ConfigError
from launcher.spec import JobSpec, load_submission, parse_bytes


def test_one_job_with_sizes_urgency_and_defaults() -> None:
    (job,) = load_submission("""
name: train
command: python train.py --lr 3e-4
gpu_memory_bytes: 20GiB
urgency: high
preempt_signal: usr2
""")
    assert job.argv == ["python", "train.py", "--lr", "3e-4"]
    assert job.gpu_memory_bytes == 20 * 2**30 and job.urgency == "high"
    assert job.gpus == 1 and job.exclusive and job.project == "default"
    # no max_retries: the engine's default applies (a budget for checkpointing jobs)
    assert job.preempt_signal == "SIGUSR2" and job.max_retries is None


def test_pipeline_takes_top_level_defaults(tmp_path: Path) -> None:
    path = tmp_path / "pipe.yaml"
    path.write_text("""
user: alice
project: vision
urgency: low
jobs:
  - {name: prepare, command: [python, prep.py], gpus: 0}
  - {name: train, command: python train.py, after: [prepare], urgency: urgent}
  - {name: evaluate, command: python eval.py, gpu_fraction: 0.25, after: [train]}
""")
    jobs = load_submission(path)
    assert [j.name for j in jobs] == ["prepare", "train", "evaluate"]
    assert {j.project for j in jobs} == {"vision"} and jobs[0].urgency == "low"
    assert jobs[1].urgency == "urgent" and jobs[2].gpu_share == 0.25 and not jobs[2].exclusive
    assert load_submission(str(path)) == jobs  # a string naming a file is read too


def test_every_problem_is_listed_with_its_line() -> None:
    text = """jobs:
  - name: prepare
    command: python prep.py
    gpus: -1
    colour: blue
  - name: train
    command: ""
    urgency: 10
    gpu_memory_bytes: lots
    after: [prepare, nosuch]
  - name: eval
    command: x
    gpu_fraction: 1.5
    after: [report]
  - name: report
    command: x
    after: [eval]
    preempt_signal: SIGKILL
  - name: train
    command: y
"""
    with pytest.raises(ConfigError) as info:
        load_submission(text, source="pipe.yaml")
    problems = "\n".join(info.value.problems)
    for expected in (
        "line 4: jobs.0.gpus: Input should be greater than or equal to 0",
        "line 5: jobs.0.colour: unknown key",
        "line 7: jobs.1.command: the command is empty",
        "line 8: jobs.1.urgency: 10: urgency is the name of a level the launcher defines",
        "line 9: jobs.1.gpu_memory_bytes: 'lots' is not a size",
        "line 10: jobs.1.after.1: no job named 'nosuch' in this submission",
        "line 13: jobs.2.gpu_fraction: Input should be less than or equal to 1",
        "line 18: jobs.3.preempt_signal: 'SIGKILL' is not a signal a job can catch",
        "line 19: jobs.4.name: job name 'train' is used twice in this submission (first at jobs.1)",
    ):
        assert expected in problems, expected
    assert info.value.render().startswith("pipe.yaml: ")


def test_dependency_cycles_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_submission("""jobs:
  - {name: a, command: x, after: [c]}
  - {name: b, command: x, after: [a]}
  - {name: c, command: x, after: [b]}
  - {name: d, command: x}
""")
    (problem,) = info.value.problems
    assert "dependency cycle: " in problem
    assert set(problem.split(": ")[-1].split(" -> ")) == {"a", "b", "c"}


def test_fraction_needs_one_gpu_and_self_dependency() -> None:
    with pytest.raises(ConfigError) as info:
        load_submission("{name: a, command: x, gpus: 2, gpu_fraction: 0.5, after: [a]}")
    text = "\n".join(info.value.problems)
    assert "gpu_fraction is a share of ONE GPU" in text


# each level ten aliases of the one before: 10^6 values from a few hundred bytes
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 10)}]\n" for p, n in zip("abcde", "bcdef", strict=True))


@pytest.mark.parametrize("text", [
    "!!python/object/apply:os.system ['true']",
    "name: !!python/name:os.system x\ncommand: x",
    ALIAS_BOMB,
    "name: a\nname: b\ncommand: x",
    "- just a list",
])
def test_hostile_or_malformed_yaml_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        load_submission(text)


def test_sizes() -> None:
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1.5GB") == 1_500_000_000
    assert parse_bytes(1024) == 1024
    for bad in ("20 parsecs", True, "-1GiB"):
        with pytest.raises(ValueError, match="size"):
            parse_bytes(bad)


def test_spec_round_trips_through_json() -> None:
    (job,) = load_submission("{name: a, command: [x, y], env: {A: '1'}, gpu_memory_bytes: 1GiB}")
    assert JobSpec.model_validate_json(job.model_dump_json()) == job


@pytest.mark.parametrize(("key", "value", "says"), [
    ("gpu_fraction", "1e-300", "greater than or equal to 0.1"),
    ("gpu_fraction", "0.05", "greater than or equal to 0.1"),
    ("gpu_fraction", ".nan", "finite"),
    ("max_runtime_seconds", "1e308", "less than or equal to 31622400"),
    ("max_runtime_seconds", ".inf", "finite"),
    ("max_runtime_seconds", "-1", "greater than 0"),
    ("gpu_memory_bytes", "1000000000000000000000000000000", "less than or equal to"),
    ("gpu_memory_bytes", "'1" + "0" * 400 + "GiB'", "more than any GPU has"),
    ("max_retries", "100000", "less than or equal to 100"),
    ("gpus", "65", "less than or equal to 64"),
    ("urgency", "11", "not a number"),
    ("urgency", "'" + "u" * 40 + "'", "is the name of a level"),
    ("project", "''", "at least 1"),
    ("project", "'" + "p" * 200 + "'", "at most 128"),
    ("cwd", "'" + "d" * 5000 + "'", "at most 4096"),
])
def test_every_number_and_size_in_a_spec_is_bounded(key: str, value: str, says: str) -> None:
    """Out-of-range, infinite and NaN values are refused with the bound they broke (the
    smallest GPU share is 0.1: 1e-300 of a GPU would pack any number of jobs on one)."""
    with pytest.raises(ConfigError) as info:
        load_submission(f"{{name: a, command: [x], {key}: {value}}}")
    (problem,) = info.value.problems
    assert f"{key}: " in problem and says in problem, problem
    assert len(problem) < 300, "a problem echoes the whole value back"


def test_a_whole_fraction_is_a_whole_gpu_and_sizes_are_in_range() -> None:
    """gpu_fraction: 1 is one whole GPU (an exclusive job); 0.1 is the smallest share."""
    (whole,) = load_submission("{name: a, command: [x], gpu_fraction: 1}")
    assert whole.exclusive and whole.gpus == 1 and whole.gpu_fraction is None
    (tenth,) = load_submission("{name: a, command: [x], gpu_fraction: 0.1}")
    assert tenth.gpu_fraction == 0.1 and not tenth.exclusive


def test_counts_and_nul_bytes_are_bounded() -> None:
    """More jobs than a submission may hold, env variables past the cap and NUL bytes in
    a command, path or environment value are each refused by name."""
    jobs = "".join(f"  - {{name: j{i}, command: [x]}}\n" for i in range(1001))
    with pytest.raises(ConfigError) as info:
        load_submission("jobs:\n" + jobs)
    assert any("1001 jobs in one submission; at most 1000" in p for p in info.value.problems)
    env = ", ".join(f"V{i}: x" for i in range(257))
    with pytest.raises(ConfigError) as info:
        load_submission(f'{{name: a, command: ["a\\0b"], cwd: "c\\0d", env: {{{env}}}}}')
    text = "\n".join(info.value.problems)
    for where in ("command: the command contains a NUL", "cwd: the value contains a NUL",
                  "env: Dictionary should have at most 256 items"):
        assert where in text, (where, text)


def test_an_unknown_urgency_level_is_listed_with_the_other_problems() -> None:
    """The daemon hands its levels to the reader, so a level it lacks is one more problem
    of the same answer, not a second round trip."""
    with pytest.raises(ConfigError) as info:
        load_submission("jobs:\n  - {name: a, command: x, urgency: sometime, gpus: -1}\n"
                        "  - {name: b, command: x, urgency: asap}\n",
                        levels=["low", "normal"])
    assert info.value.problems == [
        "line 2: jobs.0.gpus: Input should be greater than or equal to 0",
        "line 2: jobs.0.urgency: 'sometime' is not a level here (one of low, normal)",
        "line 3: jobs.1.urgency: 'asap' is not a level here (one of low, normal)"]
