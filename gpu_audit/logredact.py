"""Logging set-up that keeps secrets out of every log line, whoever logs it.

Our own code never formats a secret into a message, but the libraries underneath do:
urllib3 logs every request line at DEBUG (`POST /write?db=audit&u=ops&p=<password>`
for InfluxDB 1.x with `auth: query`), and exception texts repeat URLs. So redaction is
not left to each call site: `setup_logging` installs a record factory that rewrites
every record as it is created, before any handler (ours, pytest's, a library's) sees it.

Three things are replaced by `***`:
- every secret value registered with `register_secret` (the sink factory registers each
  password, token, API key and shared key it resolves, the audit producer its HMAC key),
  with their base64 and URL-quoted forms;
- the values of secret-bearing URL/form parameters (`p=`, `password=`, `token=`, `u=`,
  ...) and of the same keys in dict reprs (`'p': '...'`);
- the credentials of `Authorization` headers, whatever their scheme.

A record whose text changes loses its arguments (the message is stored pre-formatted)
and its exception is stored as redacted text; a record that needs no change is left as
it is, so the common case costs one scan per emitted record (suppressed levels cost
nothing: the factory runs only for records that pass the level check).

This module must never log, print or return a registered secret, and never import a
component (it is core).
"""

from __future__ import annotations

import base64
import logging
import re
import sys
import threading
import traceback
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"

# Query/form parameters whose value is a secret (u= too: a user name in a URL is half of
# a credential, and InfluxDB 1.x puts it next to p=).
_PARAMS = r"p|pw|pwd|passwd|password|token|access_token|api_key|apikey|api-key|secret|" \
          r"shared_key|u"
_QUERY_PARAM = re.compile(rf"(?i)(?<![A-Za-z0-9_.-])({_PARAMS})=[^&\s'\")<>,;]*")
# `'p': 'value'` / `"password": "value"` in reprs of dicts (urllib3 fields, request params)
_DICT_ITEM = re.compile(
    rf"(?i)(['\"](?:{_PARAMS}|authorization|proxy-authorization)['\"]\s*:\s*)"
    r"(b?)(['\"])(?:(?!\3).)*\3")
# `Authorization: Basic xxx`, `authorization=Token xxx`: keep the scheme, mask the rest
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?)"
    r"((?:basic|bearer|token|apikey|api-key|digest|negotiate)\s+)?[^\s'\",}]+")

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # longest first, so a secret inside another is not half-masked


def register_secret(value: str | bytes | None, *, username: str | None = None) -> None:
    """Mask `value` (and its base64 and URL-quoted forms) in every later log record.

    With `username`, the base64 of `username:value` (an HTTP Basic credential) is masked
    too. Empty values are ignored.
    """
    global _secrets  # noqa: PLW0603 - process-wide by nature: logging is process-wide
    if value is None:
        return
    if isinstance(value, bytes):
        raw = value
        value = value.decode("utf-8", errors="replace")
    else:
        raw = value.encode("utf-8", errors="replace")
    if not value:
        return
    forms = {value, quote(value, safe=""), quote_plus(value), base64.b64encode(raw).decode()}
    if username is not None:
        forms.add(base64.b64encode(f"{username}:".encode() + raw).decode())
    with _lock:
        _secrets = tuple(sorted(set(_secrets) | {f for f in forms if f},
                                key=len, reverse=True))


def forget_secrets() -> None:
    """Drop every registered secret (for tests)."""
    global _secrets  # noqa: PLW0603
    with _lock:
        _secrets = ()


def redact(text: str) -> str:
    """`text` with registered secrets, secret parameters and credentials masked."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    if "=" in text:
        text = _QUERY_PARAM.sub(lambda m: f"{m.group(1)}={MASK}", text)
    if ":" in text:
        text = _DICT_ITEM.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}"
                              f"{m.group(3)}", text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{MASK}", text)
    return text


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Rewrite `record` in place so that no handler can format a secret from it."""
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a record factory must never raise into the caller;
        # a broken format string is reported by the handler later, as it would be
        return record
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        clean = redact(text)
        if clean != text:
            # the exception object itself still holds the secret: keep only the text
            record.exc_text, record.exc_info = clean, None
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return record


def install_redaction() -> None:
    """Make every log record created from now on pass through `redact_record`. Idempotent."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_gpu_audit_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return redact_record(previous(*args, **kwargs))

    factory._gpu_audit_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """Log to stderr at `level`, with secrets redacted from every record."""
    install_redaction()
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format=LOG_FORMAT, stream=sys.stderr)
