"""The users-and-projects dashboard over 30 days x 64 GPUs, with
the recording rules against the raw expressions they stand for.

1. Writes 30 days of synthetic per-GPU and per-identity series for 64 GPUs (8 nodes x 8)
   at a 60 s step as OpenMetrics and backfills them with
   `promtool tsdb create-blocks-from openmetrics`.
2. Starts Prometheus on those blocks and backfills the production recording rules
   (alerts/rules/recording.yaml) over the same month with
   `promtool tsdb create-blocks-from rules`, one pass per dependency level (promtool
   cannot see a rule's output in the same pass), restarting Prometheus after each.
3. Times every query of the users-and-projects dashboard (variables at All, range 30d):
   as built (on the rules) and with every rule inlined as the expression it records
   (a subquery at the rule's 1 m interval where a range is taken), which is what the
   dashboard would have to run without the rules. Instant queries as Grafana runs
   table/stat panels; range queries at a 30 min step for the time-series panels.

    python bench/bench_dashboard_rules.py [--days 30] [--gpus 64] [--repeat 3] [--keep DIR]

Prints a table and writes bench/results/dashboard_rules.{txt,json}.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboards import build  # noqa: E402
from tests.dashboards import queries  # noqa: E402
from tests.netutil import free_port, http_get  # noqa: E402
from tests.polling import wait_for  # noqa: E402

RULES = ROOT / "alerts" / "rules" / "recording.yaml"
STEP_S = 60
USERS = [f"user{i:02d}" for i in range(20)]
PROJECTS = ["llm", "vision", "speech", "rl", "bio", "infra"]


# --- synthetic month --------------------------------------------------------------


def _job(gpu_global: int, day: int) -> tuple[str, str, str, float, float]:
    """Who holds this GPU on this day: user, project, job, SM utilisation, memory."""
    seed = (gpu_global * 7919 + day * 104729) % 1000
    user = USERS[seed % len(USERS)]
    project = PROJECTS[(seed // 7) % len(PROJECTS)]
    job = f"job-{day:02d}-{gpu_global // 4:02d}"  # 4 GPUs per job
    util = 0.01 if seed % 9 == 0 else 0.3 + (seed % 60) / 100  # every 9th job idles
    memory = float((20 + seed % 60) * 2**30)
    return user, project, job, util, memory


WINDOW_S = 2 * 3600  # promtool 2.42 makes 2 h blocks, re-reading its input for each


def _window_lines(start: int, lo: int, hi: int, gpus: int) -> str:
    """OpenMetrics families (each contiguous) for samples in [lo, hi). Each GPU runs one
    job a day for 22 hours and is free for 2 (series come and go, as real jobs do)."""
    held_s = 22 * 3600
    steps = range(lo, hi, STEP_S)
    out: list[str] = []
    for family in ("gpu_up", "gpu_utilization_ratio", "gpu_power_usage_watts"):
        out.append(f"# TYPE {family} gauge\n")
        for g in range(gpus):
            labels = f'instance="node{g // 8:02d}:9945",gpu="{g % 8}",uuid="GPU-{g:04d}"'
            for t in steps:
                day, second = divmod(t - start, 86400)
                util = _job(g, day)[3] if second < held_s else 0.0
                value = (1 if family == "gpu_up" else util
                         if family == "gpu_utilization_ratio" else round(70 + 600 * util, 1))
                out.append(f"{family}{{{labels}}} {value} {t}\n")
    for family in ("gpu_process_memory_used_bytes", "gpu_process_sm_utilization_ratio"):
        out.append(f"# TYPE {family} gauge\n")
        for g in range(gpus):
            base = f'instance="node{g // 8:02d}:9945",gpu="{g % 8}",uuid="GPU-{g:04d}"'
            for t in steps:
                day, second = divmod(t - start, 86400)
                if second >= held_s:
                    continue
                user, project, job, util, memory = _job(g, day)
                value = memory if family == "gpu_process_memory_used_bytes" else util
                out.append(f'{family}{{{base},user="{user}",project="{project}",job="{job}",'
                           f'process_name="python"}} {value} {t}\n')
    out.append("# EOF\n")
    return "".join(out)


def backfill_openmetrics(work: Path, data: Path, days: int, gpus: int, end: int
                         ) -> tuple[int, int, float, float]:
    """The month as one OpenMetrics file per 2 h window, each backfilled with promtool
    (one file for the month would be re-read for each of its 360 blocks).
    Returns samples, bytes, seconds generating, seconds in promtool."""
    start = end - days * 86400
    samples = size = 0
    gen_s = tool_s = 0.0
    om = work / "window.om"
    for lo in range(start, end, WINDOW_S):
        t0 = time.perf_counter()
        text = _window_lines(start, lo, min(lo + WINDOW_S, end), gpus)
        om.write_text(text)
        gen_s += time.perf_counter() - t0
        samples += text.count("\n") - text.count("# ")
        size += len(text)
        tool_s += _run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                        str(om), str(data)])
    om.unlink()
    return samples, size, gen_s, tool_s


# --- Prometheus and promtool --------------------------------------------------------


class Prom:
    def __init__(self, data: Path, log: Path) -> None:
        self.data, self.log = data, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        cfg = self.data.parent / "prometheus.yml"
        cfg.write_text("global: {scrape_interval: 1m, evaluation_interval: 1m}\n")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.data}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 "--storage.tsdb.retention.time=10y", "--query.timeout=10m",
                 "--query.max-samples=500000000"], stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: http_get(self.url + "/-/ready")[0] == 200, 300, "prometheus ready")

    def _metric(self, name: str) -> float:
        _, body = http_get(self.url + "/metrics", timeout=30)
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def wait_compacted(self, quiet_s: float = 20.0, limit_s: float = 1800.0) -> None:
        """Wait until the TSDB stops compacting the backfilled blocks (a compaction
        running beside the timed queries would slow either form at random)."""
        deadline = time.monotonic() + limit_s
        last, since = -1.0, time.monotonic()
        while time.monotonic() < deadline:
            now = (self._metric("prometheus_tsdb_compactions_total")
                   + self._metric("prometheus_tsdb_blocks_loaded") * 1e6)
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(2)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(120)
            self.proc = None

    def query(self, expr: str, end: int, range_s: int | None = None
              ) -> tuple[float, int, float]:
        """Wall seconds of one query, the number of series it returned and the sum of
        all their values, to check that both forms agree."""
        if range_s is None:
            params = {"query": expr, "time": str(end)}
            path = "query"
        else:
            params = {"query": expr, "start": str(end - range_s), "end": str(end),
                      "step": "1800"}
            path = "query_range"
        data = urllib.parse.urlencode(params).encode()
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", data, timeout=900) as resp:
            body = json.loads(resp.read())
        elapsed = time.perf_counter() - t0
        if body["status"] != "success":
            raise RuntimeError(f"{expr}: {body}")
        result = body["data"]["result"]
        total = sum(float(v) for s in result
                    for _, v in ([s["value"]] if "value" in s else s["values"]))
        return elapsed, len(result), total


def _run(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


def rule_levels(rules: dict[str, str]) -> list[list[str]]:
    """Recording rules grouped so each group only reads raw series or earlier groups."""
    deps = {name: {other for other in rules if other != name and re.search(
        rf"(?<![\w:]){re.escape(other)}(?![\w:])", expr)} for name, expr in rules.items()}
    levels: list[list[str]] = []
    done: set[str] = set()
    while len(done) < len(rules):
        level = [n for n in rules if n not in done and deps[n] <= done]
        if not level:
            raise ValueError(f"cyclic recording rules: {set(rules) - done}")
        levels.append(level)
        done.update(level)
    return levels


def load_rules(path: Path) -> tuple[dict[str, str], str]:
    doc = yaml.safe_load(path.read_text())
    (group,) = doc["groups"]
    return {r["record"]: r["expr"] for r in group["rules"]}, group.get("interval", "1m")


def backfill_rules(prom: Prom, rules: dict[str, str], interval: str, window: tuple[int, int],
                   work: Path) -> list[tuple[list[str], float]]:
    start, end = window
    timings = []
    for i, level in enumerate(rule_levels(rules)):
        rule_file = work / f"level{i}.yaml"
        rule_file.write_text(yaml.safe_dump({"groups": [{
            "name": f"level{i}", "interval": interval,
            "rules": [{"record": n, "expr": rules[n]} for n in level]}]}))
        out = work / f"rule-blocks-{i}"
        secs = _run(["promtool", "tsdb", "create-blocks-from", "rules",
                     f"--start={start}", f"--end={end}", f"--url={prom.url}",
                     f"--eval-interval={interval}", f"--output-dir={out}", str(rule_file)])
        timings.append((level, secs))
        prom.stop()
        for block in out.iterdir():
            shutil.move(str(block), prom.data / block.name)
        prom.start()
    return timings


# --- the dashboard's queries, with and without the rules ----------------------------


def inline_rules(expr: str, rules: dict[str, str], interval: str) -> str:
    """Replace each rule name by the expression it records: `RULE[R]` by a subquery
    `(EXPR)[R:interval]`, a bare `RULE` by `(EXPR)`. Matchers on the rule must be
    no-ops (`=~".*"`, the dashboard's All), since they cannot be pushed inside."""
    names = sorted(rules, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w:])(" + "|".join(re.escape(n) for n in names) +
                         r")(\{[^}]*\})?(\[[^\]]+\])?")

    def one(m: re.Match[str]) -> str:
        name, matchers, rng = m.group(1), m.group(2) or "", m.group(3) or ""
        for matcher in filter(None, (s.strip() for s in matchers.strip("{}").split(","))):
            if not matcher.endswith('=~".*"'):
                raise ValueError(f"cannot inline {name} with matcher {matcher}")
        inner = inline_rules(rules[name], rules, interval)
        return f"({inner}){rng[:-1]}:{interval}]" if rng else f"({inner})"

    return pattern.sub(one, expr)


def dashboard_queries(range_s: int) -> list[tuple[str, str, bool]]:
    """(panel/ref, expr with variables at All, is a range query) of the users dashboard."""
    model = build.build_all()["users"]
    values = {**queries.all_values(model), **queries.builtin_values(range_s)}
    return [(f"{t.panel}/{t.ref_id}", queries.substitute(t.expr, values), not t.instant)
            for t in queries.targets(model)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="Timings per query (median).")
    parser.add_argument("--raw-repeat", type=int,
                        help="Timings per raw query (default: --repeat); raw ones are slow.")
    parser.add_argument("--reuse", action="store_true",
                        help="Time only: --keep DIR already holds the backfilled month.")
    parser.add_argument("--keep", type=Path, help="Work directory to keep (default: temp).")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-dash-"))
    work.mkdir(parents=True, exist_ok=True)
    end = (int(time.time()) // 3600) * 3600 - 3600
    start = end - args.days * 86400
    range_s = args.days * 86400
    out: dict[str, Any] = {"days": args.days, "gpus": args.gpus, "step_s": STEP_S}

    data = work / "data"
    previous = work / "result.json"
    rules, interval = load_rules(RULES)
    if args.reuse:
        # the month was backfilled by an earlier run ending at the time it recorded
        kept = json.loads(previous.read_text())
        end = kept["end"]
        for key in ("samples", "openmetrics_bytes", "generate_s", "backfill_openmetrics_s",
                    "backfill_rules"):
            out[key] = kept[key]
        levels = [(lv["rules"], lv["seconds"]) for lv in kept["backfill_rules"]]
    else:
        (out["samples"], out["openmetrics_bytes"], out["generate_s"],
         out["backfill_openmetrics_s"]) = backfill_openmetrics(work, data, args.days,
                                                               args.gpus, end)
        print(f"backfilled {out['samples']:,} samples in {out['backfill_openmetrics_s']:.0f} s",
              flush=True)
    out["end"] = end
    prom = Prom(data, work / "prometheus.log")
    prom.start()
    try:
        if not args.reuse:
            levels = backfill_rules(prom, rules, interval, (start, end), work)
            out["backfill_rules"] = [{"rules": lv, "seconds": s} for lv, s in levels]
            print(f"backfilled the rules in {sum(s for _, s in levels):.0f} s", flush=True)
            previous.write_text(json.dumps(out))
        prom.wait_compacted()
        rows = []
        for key, expr, is_range in dashboard_queries(range_s):
            raw = inline_rules(expr, rules, interval)
            row: dict[str, Any] = {"query": key, "range": is_range}
            for label, text in (("rules", expr), ("raw", raw)):
                times, series, total = [], 0, 0.0
                repeat = args.repeat if label == "rules" else (args.raw_repeat or args.repeat)
                for _ in range(repeat):
                    secs, series, total = prom.query(text, end, range_s if is_range else None)
                    times.append(secs)
                row[label] = {"median_s": statistics.median(times), "series": series,
                              "value_sum": total, "expr": text}
            rows.append(row)
            fast, slow = row["rules"]["median_s"], row["raw"]["median_s"]
            print(f"{key:50s} rules {fast:8.3f}s raw {slow:8.3f}s x{slow / fast:7.1f}  "
                  f"values {row['rules']['value_sum']:.6g} / {row['raw']['value_sum']:.6g}",
                  flush=True)
        out["queries"] = rows
        total_rules = sum(r["rules"]["median_s"] for r in rows)
        total_raw = sum(r["raw"]["median_s"] for r in rows)
        out["total"] = {"rules_s": total_rules, "raw_s": total_raw,
                        "ratio": total_raw / total_rules}
    finally:
        prom.stop()
    summary = (f"users-and-projects dashboard, {args.days} d x {args.gpus} GPUs at {STEP_S} s "
               f"({out['samples']:,} raw samples): {len(out['queries'])} queries, "
               f"median of {args.repeat} (raw: {args.raw_repeat or args.repeat}): "
               f"rules {total_rules:.2f} s, raw {total_raw:.2f} s, "
               f"ratio {total_raw / total_rules:.1f}x; backfill openmetrics "
               f"{out['backfill_openmetrics_s']:.0f} s, rules "
               f"{sum(s for _, s in levels):.0f} s ({len(levels)} passes)")
    print(summary)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / "dashboard_rules.json").write_text(json.dumps(out, indent=2) + "\n")
    (results / "dashboard_rules.txt").write_text(summary + "\n")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
