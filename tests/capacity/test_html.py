"""The HTML report as headless Chromium lays it out: the finance sentence first, every
chart drawn, nothing wider than the page, no script; the PNG charts are real images."""

from __future__ import annotations

from pathlib import Path

import pytest

from chargeback.capacity.outputs import write_outputs
from tests import chromium
from tests.capacity.sample import sample

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("capacity-html")
    cap = sample()
    written = write_outputs(cap, out, png=chromium.binary() is not None)
    assert {"chart-states.png", "chart-allocated.png", "chart-forecast.png"} <= set(written)
    return out, cap.sentence


def test_the_sentence_comes_first_and_nothing_overflows(report: tuple[Path, str]) -> None:
    out, sentence = report
    lay = chromium.layout(out / "capacity.html", ".sentence, table, svg.chart", width=1000)
    boxes = lay["boxes"]
    assert isinstance(boxes, list)
    first = min(boxes, key=lambda b: b["y"])
    assert first["cls"] == "sentence" and first["y"] < 200
    assert lay["width"] == 1000  # no horizontal scrolling at 1000 px
    assert all(b["x"] + b["width"] <= 1000 for b in boxes)
    assert sum(1 for b in boxes if b["tag"] == "svg") == 3
    assert lay["scripts"] == 0
    dom = str(lay["dom"])
    assert sentence.split(";")[0].replace("<", "&lt;") in dom
    assert dom.count('class="bar"') > 20  # the state columns were drawn


def test_png_charts_are_images_with_ink(report: tuple[Path, str]) -> None:
    out, _ = report
    for name in ("states", "allocated", "forecast"):
        width, height, rows = chromium.png_pixels(out / f"chart-{name}.png")
        assert (width, height) in ((900, 230), (900, 260))
        # some pixels are not white: the chart is drawn, not a blank page
        assert any(any(v < 200 for v in row) for row in rows)


def test_a_screenshot_of_the_page(report: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = report
    png = chromium.screenshot(out / "capacity.html", tmp_path / "shot.png", width=1000,
                              height=1500)
    width, height, rows = chromium.png_pixels(png)
    assert (width, height) == (1000, 1500)
    assert sum(1 for row in rows if any(v < 128 for v in row)) > 300
