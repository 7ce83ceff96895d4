"""The log redaction rules, one behaviour each (the canary test in
tests/integration/test_secrets_not_logged.py runs them against every sink at DEBUG)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest

from gpu_audit import logredact
from gpu_audit.logredact import MASK, redact


@pytest.fixture
def installed() -> Iterator[None]:
    factory = logging.getLogRecordFactory()
    logredact.install_redaction()
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        logredact.forget_secrets()


def test_url_query_secrets_are_masked_and_other_parameters_kept() -> None:
    """InfluxDB 1.x `u=`/`p=` and token/password parameters lose their values; `db=`,
    `precision=` and words merely ending in those letters (`gpu=`, `up=`) stay."""
    line = 'POST /write?db=audit&u=ops&p=s3cr%23t&precision=ns HTTP/1.1" 204 0 gpu=3 up=1'
    assert redact(line) == (f'POST /write?db=audit&u={MASK}&p={MASK}&precision=ns '
                            'HTTP/1.1" 204 0 gpu=3 up=1')
    assert redact("https://h/x?token=abc&password=def") == \
        f"https://h/x?token={MASK}&password={MASK}"


def test_authorization_headers_keep_the_scheme_and_lose_the_credential() -> None:
    """Header dumps in any shape (`Name: value`, dict repr) keep only the scheme."""
    assert redact("Authorization: Basic dXNlcjpwdw==") == f"Authorization: Basic {MASK}"
    assert redact("{'Authorization': 'Token abc.def'}") == f"{{'Authorization': '{MASK}'}}"
    assert redact("authorization=ApiKey xyz") == f"authorization=ApiKey {MASK}"


def test_dict_reprs_of_secret_parameters_are_masked() -> None:
    """A params dict printed by a library (`{'u': 'ops', 'p': 'pw'}`) loses the values."""
    assert redact("fields={'db': 'audit', 'u': 'ops', 'p': 'pw'}") == \
        f"fields={{'db': 'audit', 'u': '{MASK}', 'p': '{MASK}'}}"


def test_registered_secret_is_masked_in_every_encoding() -> None:
    """A registered value is masked as itself, URL-quoted, base64, and inside a Basic
    credential with its user name, wherever it occurs in free text."""
    try:
        logredact.register_secret("pa ss/word", username="alice")
        basic = base64.b64encode(b"alice:pa ss/word").decode()
        text = f"x pa ss/word y pa%20ss%2Fword z pa+ss%2Fword {basic} " \
               f"{base64.b64encode(b'pa ss/word').decode()}"
        assert redact(text) == f"x {MASK} y {MASK} z {MASK} {MASK} {MASK}"
    finally:
        logredact.forget_secrets()


def test_records_are_redacted_for_every_handler_including_tracebacks(
        installed: None, caplog: pytest.LogCaptureFixture) -> None:
    """Once installed, a record's message and its exception text are masked before any
    handler sees them; the exception object (which still holds the secret) is dropped."""
    logredact.register_secret("hunter2-canary")
    log = logging.getLogger("some.library")
    with caplog.at_level(logging.DEBUG):
        log.debug("connecting with %s", "hunter2-canary")
        try:
            raise ConnectionError("POST /write?p=hunter2-canary failed")
        except ConnectionError:
            log.exception("send failed")
    assert "hunter2-canary" not in caplog.text
    assert caplog.records[0].getMessage() == f"connecting with {MASK}"
    assert caplog.records[1].exc_info is None
    assert "ConnectionError" in caplog.text and f"p={MASK}" in caplog.text


def test_records_without_secrets_are_left_untouched(
        installed: None, caplog: pytest.LogCaptureFixture) -> None:
    """A clean record keeps its template and arguments (handlers that use them still can)."""
    with caplog.at_level(logging.INFO):
        logging.getLogger("x").info("sink %s: %d records", "es", 3)
    assert caplog.records[0].msg == "sink %s: %d records"
    assert caplog.records[0].args == ("es", 3)
