"""`python -m gpu_audit_app ...`: the `gpu-audit` command without the installed script."""

import sys

from gpu_audit_app.cli import main

sys.exit(main())
