"""The HTML report: hostile names stay text, the warnings a lab head must see are there,
and in headless Chromium the page renders with non-empty charts, no script and no
horizontal overflow, and prints on a few A4 pages."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from chargeback.charts import BLUE, GREEN, VERMILLION
from chargeback.report import render_html
from chargeback.values import HTML_NAME
from tests import chromium
from tests.chargeback.fixtures import (
    HOSTILE_PROJECT,
    HOSTILE_USER,
    sample_bill,
    sample_request,
    sample_source_data,
)

# `GPU_AUDIT_SCREENSHOT_DIR=DIR pytest tests/chargeback/test_report.py` keeps the test's
# screenshot there (docs/CHARGEBACK.md's picture comes from tests/chargeback/screenshot.py).
KEEP_DIR = os.environ.get("GPU_AUDIT_SCREENSHOT_DIR")


def _html(tmp_path: Path, **kwargs: object) -> str:
    bill = sample_bill(**kwargs)  # type: ignore[arg-type]
    return render_html(bill, sample_request(tmp_path, bill), sample_source_data(bill)).decode()


def test_hostile_names_are_escaped_everywhere(tmp_path: Path) -> None:
    """A user named `<script>...` and a project that closes an attribute appear as text
    in tables, chart labels and tooltips; the page has no script element at all."""
    html = _html(tmp_path, days=3, hostile=True)
    assert "<script" not in html
    assert "<img" not in html
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert HOSTILE_USER not in html and HOSTILE_PROJECT not in html


def test_no_external_asset_or_clock(tmp_path: Path) -> None:
    html = _html(tmp_path, days=3)
    assert not re.search(r"(?:src|href)\s*=", html), "the report must be self-contained"
    assert "@import" not in html and "url(" not in html
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html


def test_unverified_trail_is_a_banner_with_the_problems(tmp_path: Path) -> None:
    bad = _html(tmp_path, days=2, verified=False)
    assert 'id="unverified"' in bad
    assert "Unverified audit trail" in bad
    assert "prev_hash does not match record 87" in bad
    good = _html(tmp_path, days=2, verified=True)
    assert 'id="unverified"' not in good and "hash chain verified" in good
    prom = _html(tmp_path, days=2, verified=None)
    assert 'id="unverified"' not in prom and "has no hash chain" in prom


def test_reconciliation_unmapped_simulated_and_other_sources(tmp_path: Path) -> None:
    """The figures a reader checks: the difference line, who is unmapped, how many
    simulated records were left out, and by how much another source disagrees."""
    bill = sample_bill(days=3, other_sources={"prometheus": 1000.0})
    html = render_html(bill, sample_request(tmp_path, bill), sample_source_data(bill)).decode()
    fleet = bill.reconciliation.fleet_gpu_hours
    assert f"{fleet:,.3f}" in html
    assert "adds up (within 0.1 % of the fleet)" in html
    diff = 1000.0 - fleet
    assert f"{diff:+,.3f}" in html and f"{100 * diff / fleet:+.2f} %" in html
    assert "<h3>prometheus against " in html
    assert '<tr class="flag"><td>Fleet GPU-hours</td>' in html
    assert re.search(r'id="unmapped">1 user\(s\)/project\(s\).*<code>mallory</code>', html)
    assert "1,234 simulated record(s)/series left out" in html
    bill.reconciliation.difference_gpu_hours = 5.0
    off = render_html(bill, sample_request(tmp_path, bill), sample_source_data(bill)).decode()
    assert "does not add up" in off


def test_report_renders_in_chromium_with_non_empty_charts(tmp_path: Path) -> None:
    """Chromium lays out every chart with visible bars, the page runs no script (the
    hostile names did not become elements), fits 1000 px, and the screenshot shows the
    bar colours."""
    bill = sample_bill(hostile=True)
    page = tmp_path / HTML_NAME
    page.write_bytes(render_html(bill, sample_request(tmp_path, bill),
                                 sample_source_data(bill)))
    result = chromium.layout(page, "rect.bar, svg.chart")
    assert result["scripts"] == 0
    assert isinstance(result["width"], int) and result["width"] <= 1000
    boxes = result["boxes"]
    assert isinstance(boxes, list)
    charts = [b for b in boxes if b["tag"] == "svg"]
    assert len(charts) == 6  # departments, users, projects, waste, fleet by day, energy
    assert all(c["width"] > 200 and c["height"] > 60 for c in charts)
    bars: dict[str, list[dict[str, float]]] = {}
    for b in boxes:
        if b["cls"] == "bar":
            bars.setdefault(b["section"], []).append(b)
    assert set(bars) == {"departments", "top-users", "top-projects", "waste", "by-day"}
    assert len(bars["top-users"]) == 9  # 7 users + 2 hostile ones, top 10
    assert all(b["width"] > 0 and b["height"] > 0 for bs in bars.values() for b in bs)
    # the fleet-by-day chart has 30 columns of stacked segments, energy 30 more
    assert len([b for b in bars["by-day"] if b["height"] > 1]) >= 90
    assert "onerror" not in re.sub(r"&[a-z]+;", "", result["dom"].split("<body>")[0])

    png = chromium.screenshot(page, tmp_path / "report.png", width=1000, height=2200)
    if KEEP_DIR:
        Path(KEEP_DIR).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, Path(KEEP_DIR) / "chargeback-report.png")
    counts = chromium.count_colors(png, [BLUE, GREEN, VERMILLION])
    assert all(n > 2000 for n in counts.values()), counts


def test_report_prints_on_a_few_a4_pages(tmp_path: Path) -> None:
    bill = sample_bill()
    page = tmp_path / HTML_NAME
    page.write_bytes(render_html(bill, sample_request(tmp_path, bill),
                                 sample_source_data(bill)))
    pdf = chromium.print_pdf(page, tmp_path / "report.pdf").read_bytes()
    pages = re.findall(rb"/Count (\d+)", pdf)
    assert pages, "no page count in the PDF"
    assert 2 <= max(int(p) for p in pages) <= 5


@pytest.mark.parametrize("days", [0, 1])
def test_short_or_empty_day_series_still_render(tmp_path: Path, days: int) -> None:
    """A bill without per-day figures says so instead of drawing an empty axis."""
    bill = sample_bill(days=max(days, 1))
    if days == 0:
        bill.days = {}
    html = render_html(bill, sample_request(tmp_path, bill), sample_source_data(bill)).decode()
    assert ("no per-day data" in html) == (days == 0)
