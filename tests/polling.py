"""Waiting in tests: the one polling loop every test uses.

A test that waits polls a precondition until it holds or a deadline passes, and fails
with what it waited for; it never sleeps a fixed time and then asserts (that passes
trivially when nothing happened).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The precondition never held within the timeout (a test failure)."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 15.0,
    what: str = "",
    *,
    step: float = 0.05,
    check: Callable[[], None] | None = None,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` every `step` seconds until it returns a true value, and return that
    value. `check` runs after each poll that failed and may raise to stop early (a server
    that died); `detail` adds context to the timeout message (a log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise WaitTimeout(
                f"timed out after {timeout:g} s waiting for {what or predicate}{extra}")
        time.sleep(step)
