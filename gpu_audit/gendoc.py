"""Generated documentation files: write them, or check that the committed copy is current."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, regenerate: str, *, check: bool) -> int:
    """check: exit status 1 (saying `regenerate` on stderr) when `path` differs from
    `text`, else 0. Otherwise write `text` to `path` and return 0."""
    if check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path} is out of date: run `{regenerate}`", file=sys.stderr)
            return 1
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return 0
