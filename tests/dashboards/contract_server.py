"""An in-process HTTP server that answers with recorded API responses (contracts/*.json)
and records every request exactly as it arrived: method, path with query, headers, body.
Tests script the responses per (method, path) and then assert the exact requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CONTRACTS = Path(__file__).resolve().parent / "contracts"


def contract(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONTRACTS / f"{name}.json").read_text())
    return data


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ContractServer:
    def __init__(self) -> None:
        self.requests: list[Seen] = []
        # (method, path without query) -> responses, used in order (the last repeats)
        self.script: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.url = ""

    def answer(self, method: str, path: str, *responses: dict[str, Any]) -> None:
        self.script[(method, path)] = list(responses)

    def _respond(self, seen: Seen) -> tuple[int, bytes]:
        key = (seen.method, seen.path.split("?", 1)[0])
        queue = self.script.get(key)
        if not queue:
            return 599, json.dumps({"message": f"unscripted {key}"}).encode()
        response = queue.pop(0) if len(queue) > 1 else queue[0]
        body = json.dumps(response["body"]).replace('"UID"', json.dumps(
            _uid_of(seen))).encode()
        return int(response["status"]), body


def _uid_of(seen: Seen) -> str:
    try:
        return str(seen.json()["dashboard"]["uid"])
    except (ValueError, KeyError, TypeError):
        return "UID"


@contextmanager
def contract_server() -> Iterator[ContractServer]:
    server = ContractServer()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(self.command, self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        self.rfile.read(length) if length else b"")
            server.requests.append(seen)
            status, body = server._respond(seen)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
