"""`python -m alerts --params FILE --out DIR`: the same as `gpu-audit rules render`."""

from __future__ import annotations

import sys

from alerts.cli import main

if __name__ == "__main__":
    sys.exit(main())
