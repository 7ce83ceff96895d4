"""Screenshot a chargeback report with headless Chromium: docs/CHARGEBACK.md's picture.

    .venv/bin/python -m tests.chargeback.screenshot docs/img/chargeback-report.png
    .venv/bin/python -m tests.chargeback.screenshot --export BILL_DIR OUT.png
    .venv/bin/python -m tests.chargeback.screenshot --month OUT.png

With `--export` it shoots the `report.html` of an export (`gpu-audit chargeback bill --out
BILL_DIR`); with `--month`, the bill of the chargeback test month (tests/chargeback/
month.py: a counter reset, a MIG GPU, a GPU down for a day, an unattributed process, an
unmapped user, a simulated GPU) backfilled into a real Prometheus and billed by
run_chargeback (needs prometheus and promtool); otherwise the hand-made month of
tests/chargeback/fixtures.py.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from chargeback.report import render_html
from chargeback.values import HTML_NAME
from tests import chromium
from tests.chargeback.fixtures import sample_bill, sample_request, sample_source_data


def _month_export(tmp: Path) -> Path:
    from chargeback.model import Request
    from chargeback.run import run_chargeback
    from gpu_audit_app.chargeback.main import readers
    from tests.chargeback.month import scenario
    from tests.chargeback.promfill import backfilled_prometheus

    root = Path(__file__).resolve().parents[2] / "chargeback" / "examples"
    month = scenario(step=300)
    with backfilled_prometheus(tmp, month) as prom:
        req = Request(start=month.start, end=month.end, source="prometheus", config=None,
                      prometheus_url=prom.url, rates=str(root / "rates.yaml"),
                      directory=str(root / "directory.yaml"), idle_policy="proportional",
                      out=str(tmp / "bill"))
        run_chargeback(req, readers=readers())
    return tmp / "bill"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--export", type=Path, help="an export directory (report.html)")
    parser.add_argument("--month", action="store_true",
                        help="bill the test month through a real Prometheus first")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.export is not None:
            page = args.export / HTML_NAME
        elif args.month:
            page = _month_export(Path(tmp)) / HTML_NAME
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
