"""The forecast recovers a known trend within the interval it states, and says what it
cannot know: too few days, fewer days than the horizon."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from chargeback.capacity.compute import forecast, t_quantile

START = dt.date(2026, 6, 1)
CAPACITY = 1000.0


def _points(days: int, *, a: float = 500.0, b: float = 2.0, sd: float = 15.0,
            weekly: tuple[float, ...] = (0,) * 7, seed: int = 7
            ) -> list[tuple[str, float, float]]:
    rng = random.Random(seed)
    out = []
    for t in range(days):
        d = START + dt.timedelta(days=t)
        out.append((d.isoformat(), a + b * t + weekly[d.weekday()] + rng.gauss(0, sd),
                    CAPACITY))
    return out


WEEKLY = (20, 25, 25, 20, 10, -50, -50)  # weekends quiet
TRUTH = (START + dt.timedelta(days=250)).isoformat()  # 500 + 2 t = 1000


def test_the_stated_intervals_hold_what_they_say() -> None:
    """Over 200 seeds, the 90 % slope interval holds the true slope about 90 % of the
    time, and the reach interval holds the true date at least as often."""
    slope = reach = 0
    for seed in range(200):
        fc = forecast(_points(183, weekly=WEEKLY, seed=seed), 183)
        slope += fc.slope_low <= 2.0 <= fc.slope_high
        reach += (fc.reach_earliest is not None and fc.reach_latest is not None
                  and fc.reach_earliest <= TRUTH <= fc.reach_latest)
    assert 0.84 <= slope / 200 <= 0.95
    assert reach / 200 >= 0.88


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_recovers_a_linear_trend_within_its_interval(seed: int) -> None:
    fc = forecast(_points(183, weekly=WEEKLY, seed=seed), 183)
    assert fc.ok and fc.seasonal
    assert fc.slope_low <= 2.0 <= fc.slope_high
    assert fc.slope_high - fc.slope_low < 0.2  # and says something
    truth = TRUTH
    assert fc.reach_earliest is not None and fc.reach_latest is not None
    assert fc.reach_earliest <= truth <= fc.reach_latest
    assert fc.reach_date is not None and abs(
        (dt.date.fromisoformat(fc.reach_date) - dt.date.fromisoformat(truth)).days) <= 5
    assert fc.weekday_effect[5] < -40 and fc.weekday_effect[0] > 0
    assert "reaches installed capacity (1,000 GPUs) around" in fc.message


def test_a_flat_demand_never_reaches_capacity() -> None:
    fc = forecast(_points(200, b=0.0, sd=5), 183)
    assert fc.ok and fc.reach_date is None and fc.reach_earliest is None
    assert "does not reach installed capacity" in fc.message


def test_one_month_cannot_make_a_six_month_forecast() -> None:
    fc = forecast(_points(30), 183)
    assert not fc.ok
    assert fc.message.startswith("30 day(s) of data cannot support a 183-day forecast")
    # what can still be said: the trend, with its interval
    assert "allocated demand changed by +" in fc.message
    assert fc.slope_low <= 2.0 <= fc.slope_high


def test_too_few_days_and_none() -> None:
    assert "too few to fit a trend" in forecast(_points(2), 183).message
    assert forecast([], 183).message == "no data: nothing to fit"


@pytest.mark.parametrize(("df", "exact"), [(1, 6.313752), (3, 2.353363), (5, 2.015048),
                                           (10, 1.812461), (30, 1.697261), (100, 1.660234)])
def test_t_quantile(df: int, exact: float) -> None:
    assert t_quantile(0.95, df) == pytest.approx(exact, abs=2e-3)


def test_demand_already_at_capacity_is_said_so() -> None:
    """Allocation cannot exceed what is installed: a flat trend at 100 % is not 'never
    reaches capacity'."""
    fc = forecast(_points(183, a=990.0, b=0.0, sd=3), 183)
    assert fc.message.startswith("allocated demand is already at installed capacity: 99 % "
                                 "of the 1,000 GPUs over the last 7 days")
    assert fc.reach_date == fc.reach_earliest == _points(183)[-1][0]
    assert "does not reach" not in fc.message


def test_the_hour_of_day_profile_of_the_sample() -> None:
    """The six-month sample is busier 09:00-19:00 (UTC) than at night: the profile says
    so; with day bins there is no hour profile."""
    from tests.capacity.sample import sample

    hours = sample().forecast.hour_effect
    assert len(hours) == 24
    assert min(hours[9:19]) > max(hours[:9] + hours[19:])
    assert abs(sum(hours)) < 1e-6


def test_waits_meet_bins_of_unequal_length() -> None:
    """A period starting mid-day has a short first day bin: a wait is matched with the
    idle GPUs of the bins it really overlaps."""
    from chargeback.capacity.compute import waits_summary
    from chargeback.capacity.model import Bin, Figures, Wait

    t0 = dt.datetime(2026, 11, 3, 20, tzinfo=dt.UTC)  # 20:00: a 4-hour first bin
    mid = dt.datetime(2026, 11, 4, tzinfo=dt.UTC)
    end = dt.datetime(2026, 11, 5, tzinfo=dt.UTC)
    bins = [Bin(t0, 4 * 3600.0, {"m": Figures(installed=4 * 3600.0 * 4)}),  # none idle
            Bin(mid, 86400.0, {"m": Figures(installed=86400.0 * 4,
                                            held_idle=2 * 86400.0)})]  # 2 GPUs idle
    h = 3600.0
    # 1 GPU queued 23:00-01:00 (1 h in each bin) and 1 GPU 05:00-07:00 the next day;
    # only the second bin had idle GPUs: 1 + 2 GPU-hours waited while they were idle
    late = dt.datetime(2026, 11, 3, 23, tzinfo=dt.UTC).timestamp()
    morning = mid.timestamp() + 5 * h
    waits = [Wait("launcher", "a", 1.0, late, late + 2 * h),
             Wait("launcher", "b", 1.0, morning, morning + 2 * h)]
    s = waits_summary(waits, ["launcher"], t0, end, bins)
    assert s.queued_gpu_hours == pytest.approx(4.0)
    assert s.while_idle_gpu_hours == pytest.approx(3.0)
