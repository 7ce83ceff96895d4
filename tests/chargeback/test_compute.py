"""build_bill on small hand-made SourceData: every figure checked by hand."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.directory import Directory, load_directory
from chargeback.model import UNATTRIBUTED, Fleet, SourceData, Usage
from chargeback.rates import Rates, load_rates
from gpu_audit.errors import ConfigError

H = 3600.0
KWH = 3.6e6
A, B = "GPU-A", "GPU-B"
RATES = Rates("EUR", {A: 2.0, B: 5.0}, 0.5)
DIRECTORY = Directory(users={"alice": "d1"}, projects={"p2": "d2"})


def _data() -> SourceData:
    d = SourceData("prometheus", datetime(2026, 11, 1, tzinfo=UTC),
                   datetime(2026, 11, 2, tzinfo=UTC))
    # alice/p1: 10 h on A, 4 h on B; bob/p2: 6 h on A; zed/zz: 2 h on A; unattributed 1 h on A
    d.usage[(("alice", "p1"), A)] = Usage(used_gpu_seconds=10 * H, charged_gpu_seconds=10 * H,
                                          energy_joules=2 * KWH)
    d.usage[(("alice", "p1"), B)] = Usage(used_gpu_seconds=4 * H, charged_gpu_seconds=4 * H)
    d.usage[(("bob", "p2"), A)] = Usage(used_gpu_seconds=6 * H, charged_gpu_seconds=6 * H,
                                        energy_joules=1 * KWH)
    d.usage[(("zed", "zz"), A)] = Usage(used_gpu_seconds=2 * H, charged_gpu_seconds=0.0)
    d.usage[(UNATTRIBUTED, A)] = Usage(used_gpu_seconds=1 * H, charged_gpu_seconds=1 * H)
    # A: 2 GPUs x 24 h minus 3 h down = 45 h up, 17 h held -> 28 h idle; B: 24 h up, 4 held
    d.fleet[A] = Fleet(gpu_seconds=45 * H, down_gpu_seconds=3 * H, held_gpu_seconds=17 * H,
                       energy_joules=5 * KWH, power_energy_joules=5.5 * KWH)
    d.fleet[B] = Fleet(gpu_seconds=24 * H, held_gpu_seconds=4 * H, energy_joules=1 * KWH,
                       power_energy_joules=1 * KWH)
    return d


def test_rows_costs_and_reconciliation_by_hand() -> None:
    bill = build_bill(_data(), RATES, DIRECTORY, "none")
    keys = [(r.kind, r.department, r.project, r.user) for r in bill.rows]
    assert keys == [("owner", "d1", "p1", "alice"), ("owner", "d2", "p2", "bob"),
                    ("owner", "unmapped", "zz", "zed"), ("unattributed", "", "", ""),
                    ("idle", "", "", "")]
    alice, bob, zed, unatt, idle = bill.rows
    assert alice.charged_gpu_hours == 14
    assert alice.gpu_cost == pytest.approx(10 * 2.0 + 4 * 5.0)  # per model, then summed
    assert alice.energy_cost == pytest.approx(2 * 0.5)
    assert bob.gpu_cost == pytest.approx(12.0)
    assert zed.used_gpu_hours == 2 and zed.gpu_cost == 0
    assert unatt.gpu_cost == pytest.approx(2.0)
    # idle: A 45 - 17 = 28 h at 2.0, B 24 - 4 = 20 h at 5.0; energy 6 - 3 kWh
    assert idle.charged_gpu_hours == pytest.approx(48)
    assert idle.gpu_cost == pytest.approx(56 + 100)
    assert idle.energy_kwh == pytest.approx(3)
    assert idle.total_cost == pytest.approx(156 + 1.5)
    r = bill.reconciliation
    assert r.fleet_gpu_hours == 69 and r.down_gpu_hours == 3
    assert r.owners_gpu_hours == 20 and r.unattributed_gpu_hours == 1
    assert r.difference_gpu_hours == pytest.approx(0)  # 69 - (20 + 1 + 48)
    assert r.energy_difference_kwh == pytest.approx(-0.5)
    assert bill.unmapped == ["zed/zz"]


def test_proportional_and_even_idle_share() -> None:
    idle_cost = 156 + 1.5
    prop = build_bill(_data(), RATES, DIRECTORY, "proportional")
    alice, bob, zed, _, idle = prop.rows
    assert alice.idle_share_cost == pytest.approx(idle_cost * 14 / 20)
    assert bob.idle_share_cost == pytest.approx(idle_cost * 6 / 20)
    assert zed.idle_share_cost == 0
    assert idle.idle_share_cost == pytest.approx(-idle_cost) and idle.total_cost == pytest.approx(0)
    even = build_bill(_data(), RATES, DIRECTORY, "even")
    assert [r.idle_share_cost for r in even.rows[:3]] == pytest.approx([idle_cost / 3] * 3)
    # the total is the fleet's cost whatever the policy
    none = build_bill(_data(), RATES, DIRECTORY, "none")
    totals = {sum(r.total_cost for r in b.rows) for b in (prop, even, none)}
    assert max(totals) - min(totals) < 1e-9


def test_proportional_falls_back_to_even_when_all_weights_are_zero() -> None:
    d = _data()
    d.usage = {k: Usage(used_gpu_seconds=u.used_gpu_seconds) for k, u in d.usage.items()}
    bill = build_bill(d, RATES, DIRECTORY, "proportional")
    owners = [r for r in bill.rows if r.kind == "owner"]
    assert len({round(r.idle_share_cost, 9) for r in owners}) == 1
    assert owners[0].idle_share_cost > 0
    assert "fallback" in bill.idle_policy_note


def test_model_without_price_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="GPU-B"):
        build_bill(_data(), Rates("EUR", {A: 1.0}, 0.0), DIRECTORY, "none")


def test_rates_file_lists_every_problem(tmp_path: Path) -> None:
    f = tmp_path / "rates.yaml"
    f.write_text("currency: euro\ngpu_hour: {default: -1}\nenergy_kwh: .nan\nextra: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_rates(f)
    text = str(exc.value)
    for what in ("currency", "gpu_hour", "energy_kwh", "extra"):
        assert what in text


def test_example_files_load_and_user_mapping_wins() -> None:
    root = Path(__file__).parents[2] / "chargeback" / "examples"
    rates = load_rates(root / "rates.yaml")
    assert rates.gpu_hour_price("unknown model") == rates.gpu_hour["default"]
    d = load_directory(root / "directory.yaml")
    assert d.department("bob", "vision") == "lang-lab"  # the user's mapping first
    assert d.department("carol", "nlp") == "lang-lab"  # then the project's
    assert d.department("dave", "misc") == "unmapped"
