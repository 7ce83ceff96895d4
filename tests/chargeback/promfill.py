"""A real Prometheus holding a backfilled month: the raw series from OpenMetrics
(`promtool tsdb create-blocks-from openmetrics`) and the recording rules of alerts/
evaluated over the same month (`promtool tsdb create-blocks-from rules`).

promtool's rule backfill reads what the running Prometheus already has, so rules that
read other rules (gpu:gpu_idle_held:bool reads gpu:gpu_held:bool) are backfilled in
rounds, one dependency level at a time, restarting Prometheus between rounds so it
loads the new blocks. Used by tests/chargeback and bench/bench_chargeback_prom.py.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.chargeback.month import Month, write_openmetrics_file
from tests.netutil import free_port, http_get
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "rules" / "recording.yaml"


@dataclass
class Backfilled:
    url: str
    samples: int
    timings: dict[str, float]


def _levels(rules: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rules grouped so that each only reads rules of earlier groups."""
    names = {r["record"] for r in rules}
    level: dict[str, int] = {}
    for r in rules:  # the file is in evaluation order: dependencies come first
        deps = [level[n] for n in names if n in level and n in r["expr"]]
        level[r["record"]] = 1 + max(deps, default=-1)
    out: list[list[dict[str, Any]]] = [[] for _ in range(max(level.values()) + 1)]
    for r in rules:
        out[level[r["record"]]].append(r)
    return out


def _needed(rules: list[dict[str, Any]], records: set[str]) -> list[dict[str, Any]]:
    """The rules named and, transitively, the rules they read, in file order."""
    by_name = {r["record"]: r for r in rules}
    want = set(records)
    while True:
        more = {n for n in by_name for w in want if n != w and n in by_name[w]["expr"]}
        if more <= want:
            break
        want |= more
    return [r for r in rules if r["record"] in want]


def _start(binary: str, root: Path, rule_file: Path, lookback: str, log: Path,
           ) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = root / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"evaluation_interval": "1h"},
                                   "rule_files": [str(rule_file)]}))
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={root / 'tsdb'}",
             "--storage.tsdb.retention.time=100y", f"--query.lookback-delta={lookback}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_get(url + "/-/ready")[0] == 200, 120, "prometheus ready")
    return proc, url


def _stop(proc: subprocess.Popen[bytes]) -> None:
    from tests.promstack import stop
    stop(proc)


@contextmanager
def backfilled_prometheus(tmp: Path, month: Month, rule_interval: int | None = None,
                          records: set[str] | None = None,
                          writer: Callable[[Path], int] | None = None, *,
                          rule_file_in: Path = RULES) -> Iterator[Backfilled]:
    """Prometheus on loopback with the month and its recording rules backfilled.

    rule_interval: the rules' evaluation interval (default the month's step, which
    must divide it). records: backfill only these rules (and the rules they read);
    default all of alerts/rules/recording.yaml. The lookback of the Prometheus
    yielded is one interval less a second: backfilled series carry no staleness
    markers, so a series that stopped must drop out at once. writer: writes the raw
    series as OpenMetrics to the path it is given and returns the sample count
    (default: the month's); `month` then needs only `start`, `end` and `step`.
    rule_file_in: the recording rule file (default the shipped production rules).
    """
    from tests.promstack import need
    prometheus, promtool = need("prometheus"), need("promtool")
    interval = rule_interval or month.step
    root = tmp / "prom"
    (root / "tsdb").mkdir(parents=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    om = tmp / "month.om"
    samples = writer(om) if writer is not None else write_openmetrics_file(month, om)
    timings["write_openmetrics"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q",
                    "--max-block-duration=744h", str(om), str(root / "tsdb")],
                   check=True, timeout=1800, capture_output=True)
    om.unlink()
    timings["backfill_raw"] = time.perf_counter() - t0

    group = yaml.safe_load(rule_file_in.read_text())["groups"][0]
    if records is not None:
        group["rules"] = _needed(group["rules"], records)
    rule_file = root / "rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [dict(group, interval=f"{interval}s")]}))
    # promtool evaluates rules at an offset o in [0, interval) within each interval (a
    # hash of the group name and file path, so of the temporary directory). While rules
    # are backfilled, a lookback of one interval less a millisecond sees the latest raw
    # sample whatever o is and never one a whole interval old. One interval less a
    # second (what the bill's queries are served with, so a series that stopped drops
    # out at once) missed every sample when o fell in the last second, about one
    # temporary path in ten at 10 s, and left the period without rule samples.
    backfill_lookback, lookback = f"{interval * 1000 - 1}ms", f"{interval - 1}s"
    # one query_range per block and rule: at most 11,000 points per series
    block_h = max(24, min(744, (10_000 * interval // 3600) // 24 * 24))
    log = root / "log.txt"
    proc, url = _start(prometheus, root, rule_file, backfill_lookback, log)
    t0 = time.perf_counter()
    try:
        levels = _levels(group["rules"])
        for k, rules in enumerate(levels):
            # one path and group name for every round: promtool offsets evaluations
            # by a hash of them, and a rule must read the rules below at its own instants
            level_file = root / "level.yaml"
            level_file.write_text(yaml.safe_dump({"groups": [
                {"name": "backfill", "interval": f"{interval}s", "rules": rules}]}))
            out = root / f"rules{k}"
            subprocess.run(
                [promtool, "tsdb", "create-blocks-from", "rules", "-q",
                 f"--start={int(month.start.timestamp())}",
                 f"--end={int(month.end.timestamp())}", f"--url={url}",
                 f"--output-dir={out}", f"--eval-interval={interval}s",
                 f"--max-block-duration={block_h}h", str(level_file)],
                check=True, timeout=1800, capture_output=True)
            for block in out.iterdir():
                shutil.move(str(block), root / "tsdb" / block.name)
            _stop(proc)
            last = k == len(levels) - 1
            proc, url = _start(prometheus, root, rule_file,
                               lookback if last else backfill_lookback, log)
        timings["backfill_rules"] = time.perf_counter() - t0
        yield Backfilled(url, samples, timings)
    finally:
        _stop(proc)
