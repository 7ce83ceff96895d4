"""Chargeback from Prometheus, or any engine that speaks its HTTP query API
(VictoriaMetrics, Thanos, Mimir), through the recording rules of alerts/.

What is read, per GPU (instance, uuid) and owner (user, project), for each UTC day of
the period (one `query_range` with a one-day step for the whole days, one instant query
per partial day at either end):

- used: `sum_over_time(gpu:gpu_held:weight[d])` x rule interval (recording rule: 1
  while held, on a MIG GPU the weights of the instances held);
- idle while held: `sum_over_time(gpu:gpu_idle_held:bool[d])` x interval (rule);
- allocated: `sum_over_time(gpu:gpu_allocated:weight[d])` x interval (rule: 1 while
  `gpu_allocation_info` says so, the instances' weights on a MIG GPU; not through the
  utilisation, which a MIG parent does not report);
- charged: `sum_over_time(gpu:gpu_held:share[d])` x interval (rule: 1 / holders; on
  a MIG GPU each instance's weight / its holders);
- busy: `sum_over_time(gpu:gpu_busy:sum[d])` x interval (rule: SM utilisation);
- power share: `sum_over_time(gpu:gpu_power_watts:share[d])` x interval (rule: the
  split of `user_project_job:gpu_power_watts:sum`, kept per GPU for its model);
- up / down: sums and counts of `gpu:gpu_up:max` (rule: 1 up, 0 down);
- GPU busy and power: sums of `gpu:gpu_utilization_ratio:max`, `gpu:gpu_power_watts:max`;
- GPU idle while held: a subquery of `max by (instance, uuid) (gpu:gpu_idle_held:bool)`;
- energy: `max by (instance, uuid) (increase(gpu_energy_joules_total[d]))` (raw;
  `increase` handles counter resets, `max by` counts the copies of one counter on a MIG
  GPU's instances once);
- GPU model: `gpu_info`'s `name`, joined in Python.

GPU-seconds are sums of 0/1 rule samples x the rule group's evaluation interval, read from
`/api/v1/rules` (the group holding `gpu:gpu_held:bool`), else 60 s (the shipped rules'
interval, said in the notes). Subqueries (the idle-held one, and every rule in raw mode)
step at that interval, so they count what the rules would. Sum windows are one
millisecond shorter than the day, so a sample at midnight is counted in the day it
ends, not in both (Prometheus 2 ranges are closed);
the energy window is the whole day, so `increase` starts from the midnight reading.

An owner's energy is its integrated power share on each GPU scaled to that GPU's
counter energy (counter / integrated power of the GPU), so owners' energies add up to
the counter while held. Owners are (user, project); the `job` label is summed over.

Simulated series (`simulated="true"`) are left out by the recording rules themselves.
With `--include-simulated` the rules cannot be used: every rule is replaced by its
expression (a subquery at the rule interval) without the `simulated` filter ("raw"
mode, also what `bench/bench_chargeback_prom.py` compares the rules against).
"""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from chargeback.model import UNATTRIBUTED, Fleet, Owner, Request, SourceData, Usage
from gpu_audit.errors import GpuAuditError
from gpu_audit.rules import bill_rules

DEFAULT_INTERVAL = 60.0
_SEL = '{simulated!="true"}'
_DAY = 86400.0

# The recording rules this source reads: gpu_audit.rules' expressions, the ones
# alerts/rules/recording.yaml renders (one definition; with the production parameters the
# shipped file holds exactly these). `{S}` is the simulated filter, filled in per query;
# used verbatim in raw mode.
RULES: dict[str, str] = bill_rules("{S}")

_OWNER = "instance, uuid, user, project"
# name -> (query template, per-owner?); {R} sum window, {RE} energy window, {I} interval
QUERIES: dict[str, tuple[str, bool]] = {
    "used": (f"sum by ({_OWNER}) (sum_over_time(gpu:gpu_held:weight[{{R}}]))", True),
    "idle_held": (f"sum by ({_OWNER}) (sum_over_time(gpu:gpu_idle_held:bool[{{R}}]))", True),
    "allocated": (f"sum by ({_OWNER}) (sum_over_time(gpu:gpu_allocated:weight[{{R}}]))",
                  True),
    "charged": (f"sum by ({_OWNER}) (sum_over_time(gpu:gpu_held:share[{{R}}]))", True),
    "busy": (f"sum by ({_OWNER}) (sum_over_time(gpu:gpu_busy:sum[{{R}}]))", True),
    "power_share": (f"sum by ({_OWNER}) (sum_over_time(gpu:gpu_power_watts:share[{{R}}]))",
                    True),
    "gpu_up": ("sum by (instance, uuid) (sum_over_time(gpu:gpu_up:max[{R}]))", False),
    "gpu_down": ("sum by (instance, uuid) (count_over_time(gpu:gpu_up:max[{R}]))"
                 " - sum by (instance, uuid) (sum_over_time(gpu:gpu_up:max[{R}]))", False),
    "gpu_busy": ("sum by (instance, uuid) (sum_over_time(gpu:gpu_utilization_ratio:max[{R}]))",
                 False),
    "gpu_idle_held": ("sum_over_time((max by (instance, uuid) (gpu:gpu_idle_held:bool))"
                      "[{R}:{I}])", False),
    "gpu_power": ("sum by (instance, uuid) (sum_over_time(gpu:gpu_power_watts:max[{R}]))",
                  False),
    "gpu_energy": ("max by (instance, uuid) (increase(gpu_energy_joules_total{S}[{RE}]))",
                   False),
}


class PrometheusError(GpuAuditError, RuntimeError):
    """The query API could not be reached or refused a query (the message names the URL)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def day_chunks(start: datetime, end: datetime) -> list[Chunk]:
    """[start, end) cut at UTC midnights."""
    chunks = []
    t = start
    while t < end:
        midnight = datetime(t.year, t.month, t.day, tzinfo=UTC) + timedelta(days=1)
        nxt = min(midnight, end)
        chunks.append(Chunk(t, nxt))
        t = nxt
    return chunks


def _fmt_ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def expand_rules(expr: str, sel: str) -> str:
    """Raw mode: every recording rule in expr replaced by its expression (a range over a
    rule becomes a subquery at the rule interval, written `{I}` for the caller)."""
    for _ in range(5):  # rules reading rules: expand until none is left
        before = expr
        for name, rule in RULES.items():
            body = "(" + rule.replace("{S}", sel) + ")"
            expr = re.sub(re.escape(name) + r"\[\{R\}\]", body + "[{R}:{I}]", expr)
            expr = expr.replace(name, body)
        if expr == before:
            break
    return expr


def render_query(name: str, *, raw: bool, include_simulated: bool) -> str:
    sel = "" if include_simulated else _SEL
    template = QUERIES[name][0]
    if raw:
        template = expand_rules(template, sel)
    return template.replace("{S}", sel)


class Client:
    """The query API over urllib: POST form bodies, JSON answers."""

    def __init__(self, url: str, timeout: float = 300.0) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise PrometheusError(f"{url}: not an http(s) URL")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, path: str, params: dict[str, str] | None) -> Any:
        url = f"{self.url}{path}"
        data = urllib.parse.urlencode(params).encode() if params is not None else None
        # http(s) only: checked in __init__
        req = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
        if data:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                body = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode("utf-8", "replace")
            raise PrometheusError(f"{url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"{url}: cannot reach the query API: {reason}") from None
        try:
            answer = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{url}: answer is not JSON") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"{url}: {answer.get('errorType')}: {answer.get('error')}")
        return answer.get("data")

    def query(self, expr: str, at: datetime) -> list[dict[str, Any]]:
        data = self._call("/api/v1/query", {"query": expr, "time": _ts(at)})
        return list(data.get("result", []))

    def query_range(self, expr: str, start: datetime, end: datetime,
                    step: float) -> list[dict[str, Any]]:
        data = self._call("/api/v1/query_range", {
            "query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"})
        return list(data.get("result", []))

    def rule_interval(self, record: str) -> float | None:
        """The evaluation interval of the rule group recording `record`, when the engine
        serves /api/v1/rules and has it (a rule-less engine answers 404)."""
        try:
            data = self._call("/api/v1/rules", None)
        except PrometheusError:
            return None
        for group in data.get("groups", []) if isinstance(data, dict) else []:
            if any(r.get("name") == record for r in group.get("rules", [])):
                return float(group.get("interval") or DEFAULT_INTERVAL)
        return None


def _ts(t: datetime) -> str:
    return f"{t.timestamp():.3f}"


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _owner(metric: dict[str, str]) -> Owner:
    user = metric.get("user") or None
    project = metric.get("project") or None
    return (user, project) if (user or project) else UNATTRIBUTED


@dataclass
class _Plan:
    """What to ask: the full days in one query_range, the partial ones one by one."""

    full: list[Chunk]
    partial: list[Chunk]


def _plan(start: datetime, end: datetime) -> _Plan:
    chunks = day_chunks(start, end)
    full = [c for c in chunks if c.seconds == _DAY]
    return _Plan(full, [c for c in chunks if c.seconds != _DAY])


def _rules_count_simulated(client: Client, period: float, req: Request,
                           log: Callable[[str], None]) -> bool:
    """Whether the recording rules hold series of simulated GPUs in the period (the
    simulated rule `gpu:gpu_up:max` keeps a GPU's instance and uuid)."""
    q = (f"count(last_over_time(gpu:gpu_up:max[{_fmt_ms(period)}]) and on (instance, uuid) "
         f'group by (instance, uuid) (last_over_time({{__name__=~"gpu_.+",simulated="true"}}'
         f"[{_fmt_ms(period)}])))")
    log(f"query time={_iso(req.end)} {q}")
    res = client.query(q, req.end)
    return bool(res) and float(res[0]["value"][1]) > 0


def read_prometheus(req: Request, progress: bool = False, *, raw: bool = False,
                    client: Client | None = None) -> SourceData:
    """Read the period [req.start, req.end) from req.prometheus_url.

    raw: query the raw series instead of the recording rules (forced by
    req.include_simulated, since the rules drop simulated series).
    """
    if client is None:
        if not req.prometheus_url:
            raise PrometheusError("no Prometheus URL (--prometheus-url, or "
                                  "chargeback.prometheus_url in --config)")
        client = Client(req.prometheus_url)
    data = SourceData("prometheus", req.start, req.end,
                      simulated_included=req.include_simulated)
    data.inputs["prometheus_url"] = client.url
    raw = raw or req.include_simulated
    interval = client.rule_interval("gpu:gpu_held:bool")
    if interval is None:
        interval = DEFAULT_INTERVAL
        data.notes.append(f"rule evaluation interval not served by {client.url}/api/v1/rules:"
                          f" taken as {DEFAULT_INTERVAL:g} s (the shipped rules' interval)")
    data.inputs["rule_interval_seconds"] = f"{interval:g}"
    data.inputs["mode"] = "raw series" if raw else "recording rules"
    if raw:
        data.notes.append("read from raw series (recording rules expanded into subqueries)"
                          + (" because --include-simulated" if req.include_simulated else ""))
    plan = _plan(req.start, req.end)
    period = (req.end - req.start).total_seconds()
    sel = "" if req.include_simulated else _SEL

    def log(text: str) -> None:
        data.queries.append(text)

    if not raw and not req.include_simulated and _rules_count_simulated(client, period, req,
                                                                        log):
        # rules rendered with include_simulated (alerts/params/fast.yaml) keep simulated
        # series in: their sums would bill them, while the raw energy query leaves them
        # out. The raw series, with the filter, are what this bill may count.
        raw = True
        data.inputs["mode"] = "raw series"
        data.notes.append(
            "read from raw series (recording rules expanded into subqueries): the recording "
            "rules served count simulated series (rendered with include_simulated), which "
            "this bill leaves out (--include-simulated bills them)")

    # the GPU model of every GPU seen in the period
    info_q = f"max by (instance, uuid, name) (last_over_time(gpu_info{sel}[{_fmt_ms(period)}]))"
    log(f"query time={_iso(req.end)} {info_q}")
    models: dict[tuple[str, str], str] = {}
    for s in client.query(info_q, req.end):
        m = s["metric"]
        models[(m.get("instance", ""), m.get("uuid", ""))] = m.get("name") or "unknown"
    if not req.include_simulated:
        sim_q = (f'count(last_over_time({{__name__=~"gpu_.+",simulated="true"}}'
                 f"[{_fmt_ms(period)}]))")
        log(f"query time={_iso(req.end)} {sim_q}")
        res = client.query(sim_q, req.end)
        data.simulated_excluded = int(float(res[0]["value"][1])) if res else 0

    # per day: quantity -> {(instance, uuid, owner or None): value}
    days: dict[str, dict[str, dict[tuple[str, str, Owner | None], float]]] = {}
    tasks = list(_tasks(plan))
    with _Progress(progress, len(tasks) * len(QUERIES)) as advance:
        for chunks, run in tasks:
            length = chunks[0].seconds
            for name, (_, per_owner) in QUERIES.items():
                expr = (render_query(name, raw=raw, include_simulated=req.include_simulated)
                        .replace("{R}", _fmt_ms(length - 0.001))
                        .replace("{RE}", _fmt_ms(length))
                        .replace("{I}", f"{interval:g}s"))
                for day, series in run(client, expr, log):
                    slot = days.setdefault(day, {}).setdefault(name, {})
                    for metric, value in series:
                        key = (metric.get("instance", ""), metric.get("uuid", ""),
                               _owner(metric) if per_owner else None)
                        slot[key] = slot.get(key, 0.0) + value
                advance()
    _assemble(data, days, models, interval)
    if not raw and not any(f.gpu_seconds or f.down_gpu_seconds for f in data.fleet.values()):
        _rules_missing(client, req, sel, period, log)
    return data


def _rules_missing(client: Client, req: Request, sel: str, period: float,
                   log: Callable[[str], None]) -> None:
    """Nothing from the rules: say so when the raw series do have the period (rules not
    loaded or not backfilled) rather than let it read as "no data"."""
    q = f"count(count_over_time(gpu_up{sel}[{_fmt_ms(period)}]))"
    log(f"query time={_iso(req.end)} {q}")
    res = client.query(q, req.end)
    if res and float(res[0]["value"][1]) > 0:
        raise PrometheusError(
            f"{client.url}: gpu_up has data for the period but the recording rules "
            "(gpu:gpu_up:max, gpu:gpu_held:bool, ...) have none: load "
            "alerts/rules/recording.yaml into its rule evaluation, or backfill them "
            "with `promtool tsdb create-blocks-from rules`")


Runner = Callable[[Client, str, Callable[[str], None]],
                  Iterator[tuple[str, list[tuple[dict[str, str], float]]]]]


def _tasks(plan: _Plan) -> Iterator[tuple[list[Chunk], Runner]]:
    if plan.full:
        full = plan.full

        def run_full(client: Client, expr: str, log: Callable[[str], None],
                     ) -> Iterator[tuple[str, list[tuple[dict[str, str], float]]]]:
            first, last = full[0].end, full[-1].end
            log(f"query_range start={_iso(first)} end={_iso(last)} step=86400s {expr}")
            per_day: dict[str, list[tuple[dict[str, str], float]]] = {}
            for s in client.query_range(expr, first, last, _DAY):
                for ts, v in s.get("values", []):
                    day_end = datetime.fromtimestamp(float(ts), UTC)
                    day = (day_end - timedelta(days=1)).strftime("%Y-%m-%d")
                    per_day.setdefault(day, []).append((s["metric"], float(v)))
            yield from sorted(per_day.items())

        yield full, run_full
    for chunk in plan.partial:
        def run_one(client: Client, expr: str, log: Callable[[str], None], c: Chunk = chunk,
                    ) -> Iterator[tuple[str, list[tuple[dict[str, str], float]]]]:
            log(f"query time={_iso(c.end)} {expr}")
            yield (c.start.strftime("%Y-%m-%d"),
                   [(s["metric"], float(s["value"][1])) for s in client.query(expr, c.end)])

        yield [chunk], run_one


class _Progress:
    """A rich progress bar on stderr when asked for and stderr is a terminal."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.total = total
        self._bar: Any = None

    def __enter__(self) -> Callable[[], None]:
        if not self.enabled:
            return lambda: None
        from rich.progress import Progress  # noqa: PLC0415 - only on a terminal

        self._bar = Progress(transient=True)
        self._bar.start()
        task = self._bar.add_task("querying", total=self.total)
        return lambda: self._bar.advance(task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _assemble(data: SourceData,
              days: dict[str, dict[str, dict[tuple[str, str, Owner | None], float]]],
              models: dict[tuple[str, str], str], interval: float) -> None:
    for day in sorted(days):
        q = days[day]
        day_usage: dict[Owner, Usage] = {}
        day_fleet = Fleet()

        def get(name: str, key: tuple[str, str, Owner | None], q: Any = q) -> float:
            return float(q.get(name, {}).get(key, 0.0))

        gpus = {(inst, uid) for name in q for (inst, uid, _) in q[name]}
        owners_by_gpu: dict[tuple[str, str], set[Owner]] = {}
        for name, (_, per_owner) in QUERIES.items():
            if per_owner:
                for inst, uid, o in q.get(name, {}):
                    assert o is not None
                    owners_by_gpu.setdefault((inst, uid), set()).add(o)
        for gpu in sorted(gpus):
            model = models.get(gpu, "unknown")
            g = (gpu[0], gpu[1], None)
            power_j = get("gpu_power", g) * interval
            counter_j = get("gpu_energy", g)
            scale = counter_j / power_j if power_j > 0 else 0.0
            f = Fleet(gpu_seconds=get("gpu_up", g) * interval,
                      down_gpu_seconds=get("gpu_down", g) * interval,
                      busy_gpu_seconds=get("gpu_busy", g) * interval,
                      idle_held_gpu_seconds=get("gpu_idle_held", g) * interval,
                      energy_joules=counter_j, power_energy_joules=power_j)
            for owner in sorted(owners_by_gpu.get(gpu, ()), key=lambda o: (str(o[0]), str(o[1]))):
                k = (gpu[0], gpu[1], owner)
                share_j = get("power_share", k) * interval
                u = Usage(allocated_gpu_seconds=get("allocated", k) * interval,
                          used_gpu_seconds=get("used", k) * interval,
                          charged_gpu_seconds=get("charged", k) * interval,
                          busy_gpu_seconds=get("busy", k) * interval,
                          idle_held_gpu_seconds=get("idle_held", k) * interval,
                          energy_joules=share_j * scale, power_energy_joules=share_j)
                f.held_gpu_seconds += u.charged_gpu_seconds
                data.usage.setdefault((owner, model), Usage()).add(u)
                day_usage.setdefault(owner, Usage()).add(u)
            data.fleet.setdefault(model, Fleet()).add(f)
            day_fleet.add(f)
        data.days[day] = (day_usage, day_fleet)
