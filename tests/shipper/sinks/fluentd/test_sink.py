"""The Fluentd forward sink against the in-process forward server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from pydantic import SecretStr

from shipper.sinks.base import Outcome, SinkError
from shipper.sinks.errors import ReadBackUnsupported
from shipper.sinks.fluentd.config import FluentdSinkConfig
from shipper.sinks.fluentd.encode import chunk_id, event_time
from shipper.sinks.fluentd.sink import FluentdSink
from tests.shipper.sinks.records import make_batch, make_record
from tests.shipper.sinks.servers.forward import ForwardServer


@pytest.fixture
def server() -> Iterator[ForwardServer]:
    with ForwardServer() as srv:
        yield srv


def make_sink(server: ForwardServer, key: str | None = None, password: str | None = None,
              **kw: Any) -> FluentdSink:
    data: dict[str, Any] = {"type": "fluentd", "host": "127.0.0.1", "port": server.port,
                            "timeout_s": 2, "ack_timeout_s": 1, **kw}
    if key is not None:
        data["shared_key_env"] = "K"
    cfg = FluentdSinkConfig.model_validate(data)
    return FluentdSink(cfg, "fluentd", shared_key=SecretStr(key) if key else None,
                       password=SecretStr(password) if password else None)


def outcomes(results: Any) -> list[Outcome]:
    return [r.outcome for r in results]


def test_forward_mode_with_ack_and_nanosecond_time(server: ForwardServer) -> None:
    """Records arrive tagged by kind with exact ns EventTime, after an ack per chunk."""
    sink = make_sink(server)
    batch = [*make_batch(3), make_record(3, kind="gpu")]
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 4
    assert server.messages == 2  # one chunk per tag
    by_seq = {e.record["seq"]: e for e in server.events}
    assert by_seq[0].tag == "gpu_audit.process"
    assert by_seq[3].tag == "gpu_audit.gpu"
    assert by_seq[1].time_ns == batch[1].doc["time_ns"]
    assert by_seq[1].time_ns % 1_000_000_000 != 0
    assert by_seq[2].record == dict(batch[2].doc)


def test_lost_ack_retries_with_the_same_chunk_id_and_receiver_dedupes(
        server: ForwardServer) -> None:
    """No ack -> RETRY; resending keeps the chunk id so the receiver drops the copy."""
    sink = make_sink(server)
    batch = make_batch(4)
    server.drop_acks = 1
    assert outcomes(sink.send(batch)) == [Outcome.RETRY] * 4
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 4
    assert server.duplicates == 1
    assert len(server.events) == 4


def test_connection_closed_before_ack_is_retry(server: ForwardServer) -> None:
    """The server closing the connection mid-chunk is RETRY; the resend lands once."""
    sink = make_sink(server)
    server.close_on_next = 1
    batch = make_batch(2)
    results = sink.send(batch)
    assert outcomes(results) == [Outcome.RETRY] * 2
    assert "no ack" in results[0].reason
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 2
    assert len(server.events) == 2


def test_failed_chunk_retries_it_and_later_chunks_only(server: ForwardServer) -> None:
    """Chunks acked before a failure stay DELIVERED; the failed and later ones RETRY."""
    sink = make_sink(server)
    batch = [make_record(0, kind="gpu"), make_record(1, kind="process")]
    sink.send([make_record(9, kind="gpu")])
    server.close_on_next = 0
    server.drop_acks = 0
    # second chunk's ack is dropped: the first chunk is acked normally
    original = server.ingest
    calls = {"n": 0}

    def ingest(msg: list[Any]) -> str | None:
        calls["n"] += 1
        if calls["n"] == 2:
            server.drop_acks = 1
        return original(msg)

    server.ingest = ingest  # type: ignore[method-assign]
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED, Outcome.RETRY]


def test_chunk_id_is_deterministic_and_distinct() -> None:
    """The same record ids give the same chunk id; different ones differ (16 bytes b64)."""
    assert chunk_id(["a", "b"]) == chunk_id(["a", "b"])
    assert chunk_id(["a", "b"]) != chunk_id(["a", "c"])
    assert len(chunk_id(["a"])) == 24


def test_nothing_listening_is_retry() -> None:
    """Connection refused on start or send is RETRY, never a drop."""
    with ForwardServer() as srv:
        port = srv.port
    cfg = FluentdSinkConfig.model_validate({"type": "fluentd", "host": "127.0.0.1",
                                            "port": port, "timeout_s": 1})
    sink = FluentdSink(cfg, "f")
    with pytest.raises(SinkError) as info:
        sink.start()
    assert info.value.outcome is Outcome.RETRY
    assert outcomes(sink.send(make_batch(1))) == [Outcome.RETRY]


def test_shared_key_handshake_succeeds_and_wrong_key_holds() -> None:
    """With shared_key the HELO/PING/PONG handshake runs; a wrong key is HOLD at start."""
    with ForwardServer(shared_key="s3cret") as srv:
        assert outcomes(make_sink(srv, key="s3cret").send(make_batch(2))) == \
            [Outcome.DELIVERED] * 2
        bad = make_sink(srv, key="wrong")
        with pytest.raises(SinkError) as info:
            bad.start()
        assert info.value.outcome is Outcome.HOLD
        assert "s3cret" not in info.value.reason and "wrong" not in info.value.reason


def test_user_auth_and_server_impostor_detection() -> None:
    """Username/password ride in PING; a server whose PONG digest is wrong is refused."""
    with ForwardServer(shared_key="k", users={"alice": "pw"}) as srv:
        ok = make_sink(srv, key="k", password="pw", username="alice", password_env="P")
        assert outcomes(ok.send(make_batch(1))) == [Outcome.DELIVERED]
        bad = make_sink(srv, key="k", password="nope", username="alice", password_env="P")
        with pytest.raises(SinkError):
            bad.start()
        srv.wrong_pong = True
        with pytest.raises(SinkError) as info:
            make_sink(srv, key="k", password="pw", username="alice", password_env="P").start()
        assert "does not know the key" in info.value.reason


def test_server_parses_message_and_packed_forward_modes(server: ForwardServer) -> None:
    """The test server itself understands Message and PackedForward (contract check)."""
    import socket

    et = event_time(1_700_000_000_123_456_789)
    packed = msgpack.packb([et, {"a": 1}], use_bin_type=True) + msgpack.packb(
        [et, {"a": 2}], use_bin_type=True)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(msgpack.packb(["t.msg", et, {"a": 0}], use_bin_type=True))
        sock.sendall(msgpack.packb(["t.packed", packed, {"chunk": "c1"}], use_bin_type=True))
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(sock.recv(1024))
        assert next(iter(unpacker)) == {"ack": "c1"}
    assert [(e.tag, e.record["a"], e.time_ns) for e in server.events] == [
        ("t.msg", 0, 1_700_000_000_123_456_789), ("t.packed", 1, 1_700_000_000_123_456_789),
        ("t.packed", 2, 1_700_000_000_123_456_789)]


def test_read_back_is_refused_clearly(server: ForwardServer) -> None:
    """Fluentd is a router: read_back raises ReadBackUnsupported with a hint."""
    with pytest.raises(ReadBackUnsupported, match="router"):
        list(make_sink(server).read_back(0, 1))


def test_the_sink_needs_no_fluent_logger(server: ForwardServer,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink owns its forward connection: with fluent-logger unimportable it is built
    by the registry and delivers with acks (it never relied on FluentSender's private
    methods)."""
    import importlib
    import sys

    for module in list(sys.modules):
        if module == "fluent" or module.startswith(("fluent.", "shipper.sinks.fluentd.")):
            monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "fluent", None)
    monkeypatch.setitem(sys.modules, "fluent.sender", None)
    registry = importlib.import_module("shipper.sinks.registry")
    cfg = FluentdSinkConfig.model_validate({"type": "fluentd", "host": "127.0.0.1",
                                            "port": server.port, "ack_timeout_s": 5})
    assert registry.missing_sdk("fluentd") is None
    sink = registry.create_sink(cfg, spool_dir=Path("/nonexistent"))
    assert outcomes(sink.send(make_batch(2))) == [Outcome.DELIVERED] * 2
    assert "fluent" not in {m.split(".")[0] for m, mod in sys.modules.items() if mod}
