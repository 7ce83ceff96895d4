"""What every test gets: a clean log redactor.

Loading a key or password registers it with gpu_audit.logredact for the whole process
(as it must in production). In a test run that would let one test's secret (a short test
key such as "k") mask letters in every later test's log lines, so each test starts with
none registered.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_audit import logredact


@pytest.fixture(autouse=True)
def _no_secrets_from_other_tests() -> Iterator[None]:
    logredact.forget_secrets()
    yield
    logredact.forget_secrets()
