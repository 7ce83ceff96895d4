"""Shared paths and tool lookups for the deployment tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def need_tool(name: str) -> str:
    """The tool's path, or skip naming the Debian package that brings it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/setup --test installs it)")
    return path
