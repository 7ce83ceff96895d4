"""From bins and waits to the capacity figures, the forecast and the finance sentence.

Every figure is a sum or a percentile of the inputs, no smoothing: the formulas are in
docs/CAPACITY.md and a test with a crafted trail reproduces each one exactly. This
module reads nothing (no source, no queue, no clock) and never imports launcher.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import NormalDist

from chargeback.capacity.model import (
    ALL,
    Bin,
    Capacity,
    Figures,
    Forecast,
    ModelMonth,
    Wait,
    WaitSummary,
    WhatIf,
)
from chargeback.model import Fleet, SourceData

H = 3600.0
DAY = 86400.0
BUSY_LINE = 0.90  # "hours at >= 90 % allocated"
MIN_FORECAST_DAYS = 14  # fewer daily points say nothing about a trend
SEASONAL_DAYS = 28  # four of each weekday before a weekday term is fitted
LEVEL = 0.90  # the intervals stated (two-sided)
SATURATED = 0.95  # the last week's allocation at this share of installed: at capacity


def figures_of(data: SourceData) -> dict[str, Figures]:
    """Per GPU model, what one source read for one bin. Allocated is the owners'
    allocated GPU time where the source knows allocation (Prometheus), else the time a
    process held the GPU (the archive, the search sinks: records carry no allocation)."""
    alloc: dict[str, float] = defaultdict(float)
    if data.allocation_known:
        for (_owner, model), u in data.usage.items():
            alloc[model] += u.allocated_gpu_seconds
    out: dict[str, Figures] = {}
    for model, f in data.fleet.items():
        allocated = min(alloc[model], f.gpu_seconds) if data.allocation_known else (
            f.held_gpu_seconds)
        out[model] = figures_from_fleet(f, allocated)
    return out


def figures_from_fleet(f: Fleet, allocated: float) -> Figures:
    return Figures(installed=f.gpu_seconds + f.down_gpu_seconds, down=f.down_gpu_seconds,
                   allocated=allocated, busy=f.busy_gpu_seconds,
                   held_idle=f.idle_held_gpu_seconds)


def basis(data: SourceData) -> str:
    return ("allocated: GPU time allocated to jobs (the source knows allocation)"
            if data.allocation_known else
            "allocated: GPU time a job's process held the GPU (the audit records carry no "
            "reservations: a GPU reserved with no process on it counts as free)")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _row(month: str, model: str, bins: list[tuple[float, Figures]]) -> ModelMonth:
    """bins: (seconds, figures) of one model with data."""
    total = Figures()
    for _, f in bins:
        total.add(f)
    secs = sum(s for s, _ in bins)
    alloc_gpus = [f.allocated / s for s, f in bins if s > 0]
    alloc_share = [_ratio(f.allocated, f.installed) for s, f in bins if f.installed > 0]
    at90 = sum(s for s, f in bins if f.installed > 0 and f.allocated >= BUSY_LINE * f.installed)
    return ModelMonth(
        month=month, model=model, hours=secs / H,
        installed_gpu_hours=total.installed / H, down_gpu_hours=total.down / H,
        allocated_gpu_hours=total.allocated / H, busy_gpu_hours=total.busy / H,
        held_idle_gpu_hours=total.held_idle / H, free_gpu_hours=total.free / H,
        installed_gpus=_ratio(total.installed, secs),
        allocated_gpus_mean=_ratio(total.allocated, secs),
        allocated_gpus_p95=percentile(alloc_gpus, 95),
        allocated_gpus_p99=percentile(alloc_gpus, 99),
        hours_at_90pct=at90 / H,
        allocated_pct=100 * _ratio(total.allocated, total.installed),
        allocated_pct_p95=100 * percentile(alloc_share, 95),
        busy_pct=100 * _ratio(total.busy, total.installed),
        held_idle_pct=100 * _ratio(total.held_idle, total.installed),
        down_pct=100 * _ratio(total.down, total.installed))


def rows(bins: Sequence[Bin]) -> list[ModelMonth]:
    """Per month and model, then ALL models per month, then the whole period ("period")
    per model and ALL."""
    groups: dict[tuple[str, str], list[tuple[float, Figures]]] = defaultdict(list)
    for b in bins:
        if b.models is None:
            continue
        month = b.start.strftime("%Y-%m")
        site = Figures()
        for model, f in b.models.items():
            groups[month, model].append((b.seconds, f))
            groups["period", model].append((b.seconds, f))
            site.add(f)
        if b.models:
            groups[month, ALL].append((b.seconds, site))
            groups["period", ALL].append((b.seconds, site))
    keys = sorted(groups, key=lambda k: (k[0] == "period", k[0], k[1] == ALL, k[1]))
    return [_row(month, model, groups[month, model]) for month, model in keys]


def site_series(bins: Sequence[Bin]) -> list[tuple[str, float, float, float, float, float]]:
    out = []
    for b in bins:
        if b.models is None:
            continue
        s = Figures()
        for f in b.models.values():
            s.add(f)
        n = b.seconds
        out.append((b.start.isoformat().replace("+00:00", "Z"), s.installed / n,
                    s.down / n, s.allocated / n, s.busy / n, s.held_idle / n))
    return out


def daily(bins: Sequence[Bin]) -> list[tuple[str, float, float]]:
    """(UTC day, mean allocated GPUs, mean installed GPUs) over the bins with data."""
    acc: dict[str, list[float]] = {}
    for b in bins:
        if b.models is None:
            continue
        a = acc.setdefault(b.start.strftime("%Y-%m-%d"), [0.0, 0.0, 0.0])
        a[0] += sum(f.allocated for f in b.models.values())
        a[1] += sum(f.installed for f in b.models.values())
        a[2] += b.seconds
    return [(d, a[0] / a[2], a[1] / a[2]) for d, a in sorted(acc.items()) if a[2] > 0]


def hour_profile(bins: Sequence[Bin]) -> list[float]:
    """Mean allocated GPUs (site total) per UTC hour of day, minus the mean of the 24;
    empty unless every hour of the day has a bin with data."""
    acc = [[0.0, 0.0] for _ in range(24)]
    for b in bins:
        if b.models is None or b.seconds <= 0:
            continue
        a = acc[b.start.hour]
        a[0] += sum(f.allocated for f in b.models.values()) / b.seconds
        a[1] += 1
    if any(n == 0 for _, n in acc):
        return []
    means = [v / n for v, n in acc]
    mean = sum(means) / 24
    return [m - mean for m in means]


def waits_summary(waits: Sequence[Wait], sources: list[str], start: dt.datetime,
                  end: dt.datetime, bins: Sequence[Bin]) -> WaitSummary:
    """Queued demand in [start, end): GPUs asked for x time waited inside the period;
    the wait of each job that started in the period (or its wait so far, at the
    period's end, for one that had not); and the part of the queued demand that GPUs
    held idle at the same time could have served: per bin, min(mean GPUs queued, mean
    GPUs held idle) x the bin's length."""
    if not sources:
        return WaitSummary(known=False, sources=[], note=(
            "queue waits not known: no queue was read (pass --launcher-state for the "
            "launcher's store, --slurm for sacct's pending times)"))
    lo, hi = start.timestamp(), end.timestamp()
    # the bins' edges (they need not be equal: a period starting mid-day has a short
    # first day bin); a wait is spread over the bins it overlaps
    starts = [b.start.timestamp() for b in bins]
    ends = [t + b.seconds for t, b in zip(starts, bins, strict=True)]
    queued: dict[int, float] = defaultdict(float)  # bin index -> queued GPU-seconds
    total = 0.0
    durations: list[float] = []
    never = jobs = 0
    for w in waits:
        a = max(w.queued, lo)
        z = min(w.started if w.started is not None else hi, hi)
        if z <= a:
            continue
        jobs += 1
        total += w.gpus * (z - a)
        if w.started is not None and w.started < hi:
            durations.append(w.started - w.queued)
        else:
            never += 1
            durations.append(hi - w.queued)
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(bins) and starts[i] < z:
            overlap = min(z, ends[i]) - max(a, starts[i])
            if overlap > 0:
                queued[i] += w.gpus * overlap
            i += 1
    matched = 0.0
    for i, q in queued.items():
        b = bins[i]
        if b.models is None:
            continue
        idle = sum(f.held_idle for f in b.models.values())
        matched += min(q, idle)
    return WaitSummary(
        known=True, sources=sources, jobs=jobs, never_started=never,
        queued_gpu_hours=total / H, p50_wait_h=percentile(durations, 50) / H,
        p95_wait_h=percentile(durations, 95) / H, while_idle_gpu_hours=matched / H,
        while_idle_share=_ratio(matched, total),
        note="" if jobs else "no job waited in the period")


# ------------------------------------------------------------------------- forecast

# Student's t 0.95 quantiles for the few degrees of freedom the expansion gets wrong
_T95 = {1: 6.3138, 2: 2.9200, 3: 2.3534, 4: 2.1318}


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: a table for df < 5 at p 0.95 (the forecast's), else a
    Cornish-Fisher expansion around the normal (within 2e-3 for df >= 5)."""
    if p == 0.95 and df in _T95:
        return _T95[df]
    z = NormalDist().inv_cdf(p)
    d = float(df)
    return (z + (z**3 + z) / (4 * d) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * d**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * d**3))


def _rate(x: float) -> str:
    """A slope in GPUs a day to two decimals; under 0.005 either way it is 0.00 (no
    "-0.00", no 2.9e-06 in a sentence for finance)."""
    return "0.00" if abs(x) < 0.005 else f"{x:+,.2f}"


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gauss-Jordan with partial pivoting (the normal equations are tiny)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            raise ValueError("singular")
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _inverse(a: list[list[float]]) -> list[list[float]]:
    n = len(a)
    cols = [_solve(a, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    return [[cols[j][i] for j in range(n)] for i in range(n)]


def _design(t: float, weekday: int, seasonal: bool) -> list[float]:
    x = [1.0, t]
    if seasonal:  # Monday is the reference day
        x += [1.0 if weekday == k else 0.0 for k in range(1, 7)]
    return x


def _trend_point(t: float, seasonal: bool) -> list[float]:
    """A day's design row with the weekday averaged out (the weekly mean level)."""
    return [1.0, t, *([1 / 7] * 6 if seasonal else [])]


def forecast(points: Sequence[tuple[str, float, float]], horizon_days: int) -> Forecast:
    """Fit daily mean allocated GPUs = a + b t (+ a weekday term with >= 28 days) by
    least squares; the date the weekly mean level reaches installed capacity (the
    mean installed GPUs of the last 7 days) and the dates the 90 % prediction bounds
    reach it. Refuses (ok False, the slope still stated when there are >= 3 days) with
    fewer than 14 days, or fewer days of data than the horizon."""
    n = len(points)
    if n == 0:
        return Forecast(ok=False, message="no data: nothing to fit",
                        horizon_days=horizon_days)
    days = [dt.date.fromisoformat(d) for d, _, _ in points]
    t = [float((d - days[0]).days) for d in days]
    y = [a for _, a, _ in points]
    capacity = sum(c for _, _, c in points[-7:]) / len(points[-7:])
    seasonal = n >= SEASONAL_DAYS
    fc = Forecast(ok=False, message="", days=n, horizon_days=horizon_days,
                  capacity_gpus=capacity, seasonal=seasonal)
    p = 2 + (6 if seasonal else 0)
    if n < 3 or n <= p:
        fc.message = (f"{n} day(s) of data: too few to fit a trend (a forecast needs "
                      f"{MIN_FORECAST_DAYS}); the period's figures above still hold")
        return fc
    x = [_design(ti, d.weekday(), seasonal) for ti, d in zip(t, days, strict=True)]
    xtx = [[sum(r[i] * r[j] for r in x) for j in range(p)] for i in range(p)]
    xty = [sum(r[i] * yi for r, yi in zip(x, y, strict=True)) for i in range(p)]
    try:
        inv = _inverse(xtx)
    except ValueError:
        fc.message = "the days of data do not determine a trend (all on one weekday?)"
        return fc
    beta = [sum(inv[i][j] * xty[j] for j in range(p)) for i in range(p)]
    resid = [yi - sum(b * v for b, v in zip(beta, r, strict=True))
             for r, yi in zip(x, y, strict=True)]
    df = n - p
    s = math.sqrt(sum(e * e for e in resid) / df)
    tq = t_quantile(0.5 + LEVEL / 2, df)
    se_b = s * math.sqrt(max(inv[1][1], 0.0))
    fc.intercept, fc.slope_gpus_per_day = beta[0], beta[1]
    fc.slope_low, fc.slope_high = beta[1] - tq * se_b, beta[1] + tq * se_b
    fc.residual_sd = s
    if seasonal:
        eff = [0.0, *beta[2:]]
        mean = sum(eff) / 7
        fc.weekday_effect = [e - mean for e in eff]
    trend = (f"allocated demand changed by {_rate(fc.slope_gpus_per_day)} GPUs a day "
             f"(90 % interval {_rate(fc.slope_low)} to {_rate(fc.slope_high)}) over {n} "
             "days")
    recent = sum(y[-7:]) / len(y[-7:])
    if capacity > 0 and recent >= SATURATED * capacity:
        # allocation cannot exceed what is installed: a trend of it says nothing more
        fc.message = (f"allocated demand is already at installed capacity: "
                      f"{100 * recent / capacity:.0f} % of the {capacity:,.0f} GPUs over the "
                      "last 7 days, so allocation cannot show how much more is wanted (the "
                      f"queued demand does); {trend}")
        fc.reach_date = fc.reach_earliest = fc.reach_latest = points[-1][0]
        fc.ok = True
        return fc
    if n < MIN_FORECAST_DAYS or n < horizon_days:
        fc.message = (f"{n} day(s) of data cannot support a {horizon_days}-day forecast "
                      f"(it needs at least {max(MIN_FORECAST_DAYS, horizon_days)} days: no "
                      f"more days ahead than behind); what can be said: {trend}")
        return fc

    def at(ti: float) -> tuple[float, float, float]:
        r = _trend_point(ti, seasonal)
        mid = sum(b * v for b, v in zip(beta, r, strict=True))
        var = sum(r[i] * inv[i][j] * r[j] for i in range(p) for j in range(p))
        half = tq * s * math.sqrt(var + 1 / 7)  # a week's mean: the line's and 7 days' noise
        return mid, mid - half, mid + half

    last = t[-1]
    for k in range(0, int(last) + horizon_days + 1, 1 if n <= 62 else 7):
        mid, lo_, hi_ = at(float(k))
        fc.line.append(((days[0] + dt.timedelta(days=k)).isoformat(), mid, lo_, hi_))
    for k in range(int(last) + 1, int(last) + horizon_days + 1):
        mid, lo_, hi_ = at(float(k))
        when = (days[0] + dt.timedelta(days=k)).isoformat()
        if fc.reach_earliest is None and hi_ >= capacity:
            fc.reach_earliest = when
        if fc.reach_date is None and mid >= capacity:
            fc.reach_date = when
        if fc.reach_latest is None and lo_ >= capacity:
            fc.reach_latest = when
    fc.ok = True
    fit = "linear trend with a weekday term" if seasonal else "linear trend"
    if fc.reach_date is not None:
        later = fc.reach_latest or f"after the {horizon_days}-day horizon"
        fc.message = (f"at the current trend ({fit}) allocated demand reaches installed "
                      f"capacity ({capacity:,.0f} GPUs) around {fc.reach_date} (90 % "
                      f"interval {fc.reach_earliest} to {later}); {trend}")
    elif fc.reach_earliest is not None:
        fc.message = (f"at the current trend ({fit}) allocated demand is not expected to "
                      f"reach installed capacity ({capacity:,.0f} GPUs) within "
                      f"{horizon_days} days, though the 90 % bound reaches it on "
                      f"{fc.reach_earliest}; {trend}")
    else:
        fc.message = (f"at the current trend ({fit}) allocated demand does not reach "
                      f"installed capacity ({capacity:,.0f} GPUs) within {horizon_days} "
                      f"days, even at the 90 % bound; {trend}")
    return fc


# ------------------------------------------------------------------ the finance sentence

def _span(start: dt.datetime, end: dt.datetime) -> str:
    days = (end - start).total_seconds() / DAY
    months = round(days / 30.44)
    if days >= 27 and abs(days - months * 30.44) <= 3.5:
        return "the month" if months == 1 else f"the {months} months"
    if days >= 1 and days == int(days):
        return f"the {int(days)} day(s)"
    return f"the {days * 24:,.0f} hours"


def _pct(value: float) -> str:
    """A percentage for the sentence: "<1 %" rather than a "0 %" that is not zero."""
    if 0 < value < 0.5:
        return "<1 %"
    return f"{value:.0f} %"


def when(start: dt.datetime, end: dt.datetime) -> str:
    """The period in words: whole days as dates (the last day included), else times."""
    if start.time() == end.time() == dt.time(0, 0):
        return f"{start.date()} to {(end - dt.timedelta(days=1)).date()}"
    if start.date() == end.date():
        return f"{start.date()} {start:%H:%M} to {end:%H:%M} UTC"
    return f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"


def _gpu_h(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _h(hours: float) -> str:
    return f"{hours:,.1f} h"


def _change(what: str, before: float, after: float, *, plural: bool = False) -> str:
    s = "" if plural else "s"
    if round(after, 1) < round(before, 1):
        return f"{what} cut{s} the replayed p95 wait from {_h(before)} to {_h(after)}"
    if round(after, 1) > round(before, 1):
        return f"{what} raise{s} the replayed p95 wait from {_h(before)} to {_h(after)}"
    return f"{what} leave{s} the replayed p95 wait at {_h(before)}"


def sentence(cap: Capacity) -> str:
    """The finance sentence, from the numbers alone (docs/CAPACITY.md)."""
    period = [r for r in cap.rows if r.month == "period"]
    site = next((r for r in period if r.model == ALL), None)
    if site is None:
        return (f"No capacity figures for {cap.start.date()} .. {cap.end.date()}: the "
                f"source ({cap.source}) had no data for the period.")
    models = [r for r in period if r.model != ALL]
    n = round(site.installed_gpus)
    if len(models) == 1:
        who = f"the {n:,} {models[0].model} GPUs"
    else:
        who = f"the {n:,} GPUs (" + ", ".join(
            f"{round(m.installed_gpus):,} {m.model}"
            for m in sorted(models, key=lambda m: -m.installed_gpus)) + ")"
    total_h = (cap.end - cap.start).total_seconds() / H
    cover = ("" if site.hours >= total_h - 1e-6 else
             f" (with data for {site.hours:,.0f} of its {total_h:,.0f} hours)")
    lead = (f"Over {_span(cap.start, cap.end)} {when(cap.start, cap.end)}{cover} {who} "
            f"averaged {_pct(site.allocated_pct)} allocated (p95 "
            f"{_pct(site.allocated_pct_p95)})")
    unknown = cap.not_known
    if not unknown:
        parts = [f"{lead} and {_pct(site.busy_pct)} busy; {_pct(site.held_idle_pct)} were "
                 f"held idle and {_pct(site.down_pct)} down"]
    else:
        said = {"busy": "busy", "held_idle": "held-idle", "down": "down"}
        parts = [lead + "; " + ", ".join(said[k] for k in unknown if k in said)
                 + f" time not known from {cap.source}"]
    w = cap.waits
    if not w.known:
        parts.append("queue waits are not known (no queue was read)")
    elif w.jobs == 0:
        parts.append("no job waited for a GPU")
    else:
        parts.append(f"{_gpu_h(w.queued_gpu_hours)} GPU-hours of jobs waited (p95 wait "
                     f"{_h(w.p95_wait_h)}), {_pct(100 * w.while_idle_share)} of them while "
                     "GPUs were held idle")
    base = next((x for x in cap.whatif if x.name == "baseline"), None)
    reclaim = next((x for x in cap.whatif if x.name == "idle reclaim"), None)
    more = [x for x in cap.whatif if x.name.startswith("+")]
    if base is not None and (reclaim is not None or more):
        bits = []
        if reclaim is not None:
            bits.append(_change("reclaiming idle GPUs", base.p95_wait_h, reclaim.p95_wait_h))
        for x in more:
            bits.append(_change(f"{x.gpus - base.gpus} more GPUs", base.p95_wait_h,
                                x.p95_wait_h, plural=True))
        parts.append("in a replay of the queue (not a promise), " + "; ".join(bits))
    text = "; ".join(parts) + "."
    fc = cap.forecast
    text += " " + fc.message[0].upper() + fc.message[1:] + "." if fc.message else ""
    return text


def build(start: dt.datetime, end: dt.datetime, source: str, bin_seconds: float,  # noqa: PLR0917 - one call site, each named
          bins: Sequence[Bin], basis_text: str, waits: Sequence[Wait],
          wait_sources: list[str], horizon_days: int,
          whatif: Sequence[WhatIf] = (), whatif_note: str = "",
          notes: Sequence[str] = (), not_known: Sequence[str] = ()) -> Capacity:
    """The whole report of a period (the sentence last, from everything else)."""
    missing = sum(1 for b in bins if b.models is None)
    fc = forecast(daily(bins), horizon_days)
    fc.hour_effect = hour_profile(bins) if bin_seconds == H else []
    cap = Capacity(start=start, end=end, source=source, bin_seconds=bin_seconds,
                   basis=basis_text, rows=rows(bins),
                   waits=waits_summary(waits, wait_sources, start, end, bins),
                   forecast=fc, whatif=list(whatif),
                   whatif_note=whatif_note, notes=list(notes), bins_missing=missing,
                   series=site_series(bins), daily=daily(bins), not_known=list(not_known))
    if missing:
        cap.notes.append(f"{missing} of {len(bins)} bin(s) had no data from the source: "
                         "left out of the means and percentiles (not counted as 0)")
    cap.sentence = sentence(cap)
    # a reader who sees only the sentence must see these too
    if any(n.startswith("INCOMPLETE") for n in cap.notes):
        cap.sentence = "INCOMPLETE (records missing, --allow-gaps): " + cap.sentence
    if any(n.startswith("SIMULATED") for n in cap.notes):
        cap.sentence = "SIMULATED DATA, not real hardware: " + cap.sentence
    return cap
