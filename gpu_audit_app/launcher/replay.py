"""`gpu-audit launcher replay TRACE`: a lab's job trace through the launcher's own engine
and scheduler in virtual time, once per policy, with the report that says whether the
launcher earns its keep on that lab (docs/REPLAY.md).

    gpu-audit launcher replay bench/traces/lab-week.jsonl --report /tmp/week
    gpu-audit launcher replay my-lab.jsonl --policy priority --policy hand-launched \\
        --config /etc/gpu-audit/launcher.yaml

`--config` takes a daemon configuration file and replays with its `core` (policy
weights, urgency levels, quotas, timings), so an admin can try a change on their own
lab's week before the daemon runs it. Exit codes: 0 done; 2 a bad trace, configuration
or option (every problem listed). Nothing here runs a job or touches the daemon's state.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_audit.errors import EXIT_OK, EXIT_USAGE, ConfigError

if TYPE_CHECKING:
    from launcher.config import LauncherCoreConfig


def add_replay_arguments(lsub: Any) -> None:
    # the policy names from the configuration model: building the parser (every client
    # command does) must not load the engine
    from typing import get_args

    from launcher.config import PolicyName

    policies = get_args(PolicyName)
    r = lsub.add_parser(
        "replay", help="Replay a job trace through the launcher's scheduler, per policy.",
        description="Replay a lab's job trace (JSON Lines, docs/REPLAY.md) through the "
        "launcher's own engine and scheduler on simulated GPUs in virtual time, once per "
        "policy, and report utilisation, its share of what the jobs allow at best, night "
        "completion, idle-held GPU-hours, waits, fairness and preemption loss, with the "
        "targets the launcher is held to.")
    r.add_argument("trace", type=Path, metavar="TRACE",
                   help="The trace file (JSON Lines; docs/REPLAY.md).")
    r.add_argument("--policy", action="append", choices=policies, metavar="POLICY",
                   help=f"a policy to replay ({', '.join(policies)}); repeat for several; "
                   "default: all")
    r.add_argument("--report", type=Path, metavar="DIR",
                   help="write report.md, metrics.json and utilisation.svg there")
    r.add_argument("--config", type=Path, metavar="FILE",
                   help="a launcher daemon configuration whose `core` section to replay "
                   "with (default: the built-in defaults)")
    r.add_argument("--tick", type=float, default=60.0, metavar="SECONDS",
                   help="the engine's tick in virtual seconds (default 60)")
    r.add_argument("--json", action="store_true", help="print the metrics as JSON")
    r.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a core setting on top of the configuration, e.g. "
                   "policy.evening_deadline=09:00 or policy.w_age=0 (repeatable)")
    r.add_argument("--assume-present", action="store_true",
                   help="replay the hand-launched baseline even on a trace without presence "
                   "windows, everyone counted as always at the desk (it then equals "
                   "first-fit on whole GPUs; said on every run)")


def with_settings(core: LauncherCoreConfig, settings: list[str]) -> LauncherCoreConfig:
    """`core` with `section.key=value` settings (YAML values) applied; ConfigError naming
    every bad one."""
    import yaml
    from pydantic import ValidationError

    from launcher.config import LauncherCoreConfig

    data = core.model_dump()
    problems = []
    for item in settings:
        key, eq, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in data or not isinstance(data[section], dict):
            problems.append(f"--set {item[:60]!r}: expected SECTION.KEY=VALUE with a "
                            f"section of {', '.join(sorted(data))}")
            continue
        try:
            data[section][name] = yaml.safe_load(value)
        except yaml.YAMLError:
            problems.append(f"--set {item[:60]!r}: the value is not YAML")
    try:
        checked = LauncherCoreConfig.model_validate(data)
    except ValidationError as exc:
        problems += [f"--set: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                     for e in exc.errors()]
    if problems:
        raise ConfigError("--set", problems)
    return checked


def replay_command(args: argparse.Namespace,
                   load_core: Callable[[Path], LauncherCoreConfig]) -> int:
    """Run the command; `load_core` reads a daemon configuration file's `core` (the
    daemon's own loader, handed in by launcher.main so the two modules stay apart)."""
    from launcher.config import LauncherCoreConfig
    from launcher.replay.report import clean, table, targets, targets_table, write_report
    from launcher.replay.run import POLICIES, presence_assumption, replay
    from launcher.replay.trace import load_trace

    if not 1.0 <= args.tick <= 3600.0:
        print("gpu-audit launcher replay: --tick must be 1..3600 seconds", file=sys.stderr)
        return EXIT_USAGE
    try:
        trace = load_trace(args.trace)
        core = LauncherCoreConfig()
        if args.config is not None:
            core = load_core(args.config)
        if args.set:
            core = with_settings(core, args.set)
        unknown = sorted({j.urgency for j in trace.jobs} - set(core.policy.urgency_levels))
        if unknown:
            raise ConfigError(str(args.trace), [
                f"urgency {u!r} of the trace is not a level of the configuration "
                f"({', '.join(core.policy.urgency_levels)})" for u in unknown])
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    policies = list(dict.fromkeys(args.policy or POLICIES))
    assumed = presence_assumption(trace)
    if "hand-launched" in policies and assumed is not None:
        if not trace.people and not args.assume_present:
            if args.policy:  # asked for by name: refuse, do not hand back a fake baseline
                print(f"gpu-audit launcher replay: cannot replay hand-launched: {assumed}; "
                      "add `person` lines (docs/REPLAY.md) or pass --assume-present",
                      file=sys.stderr)
                return EXIT_USAGE
            policies.remove("hand-launched")
            print(f"WARNING: hand-launched baseline SKIPPED: {assumed}. Add `person` lines "
                  "(docs/REPLAY.md), or --assume-present to replay it anyway.",
                  file=sys.stderr)
        else:
            print(f"WARNING: hand-launched baseline ASSUMES: {assumed}", file=sys.stderr)
    h = trace.header
    print(f"trace {h.trace}: {len(trace.jobs)} jobs, {len(trace.people)} people, "
          f"{h.gpus} x {h.gpu_memory_bytes / 2**30:.0f} GiB GPUs, window "
          f"{h.window_seconds / 86400:g} d", file=sys.stderr)
    metrics = {}
    walls = {}
    for policy in policies:
        run = replay(trace, policy, config=core, tick_seconds=args.tick,
                     assume_present=args.assume_present)
        metrics[policy] = run.metrics
        walls[policy] = round(run.wall_seconds, 2)
        print(f"  {policy}: {run.wall_seconds:.1f} s ({run.metrics.ticks} ticks"
              + (f", {len(run.refused)} jobs refused" if run.refused else "") + ")",
              file=sys.stderr)
    checked = targets(metrics)
    if args.json:
        print(json.dumps(clean({"trace": h.trace, "targets": checked,
                                "policies": {p: m.as_dict() for p, m in metrics.items()}}),
                         indent=1))
    else:
        print(table(metrics))
        print()
        print(targets_table(checked))
    if args.report is not None:
        try:
            paths = write_report(args.report, metrics, title=f"{h.trace}: replay",
                                 extra={"trace": str(args.trace), "tick_seconds": args.tick,
                                        "wall_seconds": walls}, start=h.start)
        except OSError as exc:
            print(f"gpu-audit launcher replay: cannot write the report to {args.report}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {', '.join(str(p) for p in paths)}", file=sys.stderr)
    return EXIT_OK
