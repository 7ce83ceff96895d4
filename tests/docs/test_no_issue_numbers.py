"""Docs and comments say what they mean, never a tracker issue number: the tracker does
not ship with the repository, so "(issue NN)" tells a reader nothing. BENCHMARKS.md
keeps its history of measurements per round and is left out; so are bench/results."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ISSUE = re.compile(r"\bissues? ?#?\d+\b", re.IGNORECASE)
LEFT_OUT = ("BENCHMARKS.md", "bench/results/")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.yaml", "*.sh", "Makefile",
                          "Dockerfile"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.split() if not f.startswith(LEFT_OUT)]


def test_no_issue_numbers_in_docs_or_code() -> None:
    files = _tracked()
    assert len(files) > 300
    found = [f"{f}:{n}: {line.strip()[:80]}" for f in files
             for n, line in enumerate((ROOT / f).read_text().splitlines(), 1)
             if ISSUE.search(line) and "ISSUE = re.compile" not in line]
    assert found == []
