"""The README's picture of the data flow is drawn from its committed source:
docs/img/dataflow.svg is exactly what docs/img/dataflow.py draws (edit the script, run
it, commit both), it is well-formed SVG, and the README shows it."""

from __future__ import annotations

import importlib.util
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "img" / "dataflow.py"
SVG = ROOT / "docs" / "img" / "dataflow.svg"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dataflow_picture", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_the_committed_svg_is_what_the_script_draws() -> None:
    """A box or arrow changed in the script without redrawing (or the SVG edited by
    hand) fails here; `--check` says the same from the command line."""
    script = _script()
    assert SVG.read_text() == script.render(), (
        "docs/img/dataflow.svg is stale: run .venv/bin/python docs/img/dataflow.py")
    assert script.main(["--check"]) == 0


def test_the_picture_is_svg_with_every_box_and_the_readme_shows_it() -> None:
    """It parses as SVG, names every component and engine of the flow, and README.md
    embeds it."""
    root = ET.fromstring(SVG.read_text())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    for title in ("exporter", "spool", "shipper", "launcher", "chargeback", "Prometheus",
                  "Alertmanager", "Grafana", "sinks", "audit verify"):
        assert title in texts, title
    assert "](docs/img/dataflow.svg)" in (ROOT / "README.md").read_text()
