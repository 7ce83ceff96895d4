"""Screenshot a chargeback report with headless Chromium: the README's picture.

    .venv/bin/python -m tests.chargeback.screenshot docs/img/chargeback-report.png
    .venv/bin/python -m tests.chargeback.screenshot --export BILL_DIR OUT.png

With `--export` it shoots the `report.html` of an export (`gpu-audit chargeback --out
BILL_DIR`); without, the hand-made month of tests/chargeback/fixtures.py.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from chargeback.report import render_html
from chargeback.values import HTML_NAME
from tests import chromium
from tests.chargeback.fixtures import sample_bill, sample_request, sample_source_data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--export", type=Path, help="an export directory (report.html)")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.export is not None:
            page = args.export / HTML_NAME
        else:
            bill = sample_bill()
            page = Path(tmp) / HTML_NAME
            page.write_bytes(render_html(bill, sample_request(Path(tmp), bill),
                                         sample_source_data(bill)))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        chromium.screenshot(page, args.out, args.width, args.height)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
