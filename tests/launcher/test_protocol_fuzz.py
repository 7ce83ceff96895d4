"""The protocol fuzz, CI budget: random and mutated frames through the daemon's frame
parser and every request handler never raise, never reach an internal error, and always
get a bounded JSON answer (tests/launcher/fuzzing.py; 100,000+ inputs in
bench/bench_launcher_fuzz.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from launcher.peer import Caller
from launcher.protocol import parse_request
from launcher.server import handle_line
from launcher.service import Service
from tests.launcher import fuzzing


@pytest.fixture(scope="module")
def svc() -> Iterator[Service]:
    d = Path(tempfile.mkdtemp(prefix="gpu-audit-fuzz-"))
    d.chmod(0o755)
    s = fuzzing.service(d / "state")
    yield s
    s.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(frame=fuzzing.frames, caller=fuzzing.callers)
def test_any_frame_gets_a_bounded_answer_and_never_an_internal_error(
        svc: Service, frame: bytes, caller: Caller) -> None:
    """Bytes, hostile request objects and mutated valid requests, from an admin and from
    an ordinary user: every one is answered (ok or a known error code), never with an
    exception or an internal error."""
    fuzzing.check(handle_line(svc, caller, frame))


def test_every_bad_field_of_a_request_is_named_at_once() -> None:
    """A request with several bad fields lists each of them, not just the first."""
    answer = parse_request(orjson.dumps({"op": "logs", "id": -3, "offset": "x",
                                         "attempt": 10**9, "stream": "both", "uid": 0}))
    assert isinstance(answer, dict) and answer["error"] == "bad_request"
    text = "\n".join(answer["problems"])
    for key in ("id: must be an integer 1..", "offset: must be an integer 0..",
                "attempt: must be an integer 1..1000000", "stream: must be out or err",
                "unknown key(s) for logs: 'uid'"):
        assert key in text, (key, text)
    assert parse_request(b'{"op": "cancel"}')["problems"] == ["id: required for cancel"]
    assert parse_request(b'{"op": []}')["error"] == "bad_request"  # was a TypeError
    ok = parse_request(b'{"op": "logs", "id": "12", "offset": 3, "stream": "err"}')
    assert not isinstance(ok, dict) and (ok.id, ok.offset, ok.stream) == (12, 3, "err")
