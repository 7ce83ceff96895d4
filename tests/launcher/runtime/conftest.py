"""Fixtures shared by the daemon tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher.runtime.users import ALICE, BOB, local_user, remove_created, shared_dir


@pytest.fixture(scope="session", autouse=True)
def _remove_test_users() -> Iterator[None]:
    """Every unix user and group the tests created is deleted when the session ends."""
    yield
    remove_created()


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory both test users can read and write, with alice and bob created."""
    local_user(ALICE)
    local_user(BOB)
    d = shared_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)
