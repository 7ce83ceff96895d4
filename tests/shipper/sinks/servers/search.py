"""In-process Elasticsearch / OpenSearch server: `_bulk`, index templates, `_search`
(range + sort + search_after), `_refresh`, and the root `/` each product answers.

Storage is idempotent by (_index, _id): a second `create` of the same id answers 409 and
is counted in `conflicts`, so tests can prove that nothing was stored twice. Misbehaves on
command: Faults for whole requests (5xx, 429 + Retry-After, 401, slow, reset) and
`item_status`, a function choosing a per-item status (429, 400, 500...) for one document,
so one bulk response can mix 201/409/429/400 with `errors: true`, items in order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import urlparse

from tests.shipper.sinks.servers.http_base import FaultHandler, FaultServer

ERROR_TYPES = {
    400: "mapper_parsing_exception",
    404: "index_not_found_exception",
    429: "es_rejected_execution_exception",
    500: "internal_server_error",
    503: "unavailable_shards_exception",
}


class SearchServer(FaultServer):
    def __init__(self, flavour: Literal["elasticsearch", "opensearch"] = "elasticsearch") -> None:
        super().__init__(_Handler)
        self.flavour = flavour
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.templates: dict[str, dict[str, Any]] = {}
        self.conflicts = 0
        self.bulk_requests = 0
        self.item_status: Callable[[dict[str, Any]], int | None] | None = None
        self.auto_create = True
        self.basic: str | None = None  # expected Authorization header value, if any

    def stored_ids(self) -> list[str]:
        return sorted(i for _, i in self.docs)


class _Handler(FaultHandler):
    server: SearchServer

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        if self.server.flavour == "elasticsearch":
            self.send_header("X-Elastic-Product", "Elasticsearch")

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
        self.reply(status, json.dumps(data).encode(), headers=headers)

    def _dispatch(self) -> None:
        url = urlparse(self.path)
        body = self.read_body()
        if self.apply_fault():
            return
        if self.server.basic is not None and self.headers.get("Authorization") != \
                self.server.basic:
            self._json(401, {"error": {"type": "security_exception",
                                       "reason": "missing authentication credentials"},
                             "status": 401})
            return
        path = url.path.rstrip("/")
        if path == "" and self.command in ("GET", "HEAD"):
            self._root()
        elif path.endswith("/_bulk"):
            self._bulk(body)
        elif path.startswith("/_index_template/"):
            self.server.templates[path.rsplit("/", 1)[1]] = json.loads(body)
            self._json(200, {"acknowledged": True})
        elif path.endswith("/_search"):
            self._search(path, json.loads(body or b"{}"))
        elif path.endswith("/_refresh"):
            self._json(200, {"_shards": {"total": 1, "successful": 1, "failed": 0}})
        else:
            self._json(404, {"error": {"type": "resource_not_found", "reason": path}})

    do_GET = do_POST = do_PUT = do_HEAD = _dispatch

    def _root(self) -> None:
        if self.server.flavour == "elasticsearch":
            data = {"name": "fake", "cluster_name": "test", "version": {
                "number": "8.15.0", "build_flavor": "default",
                "minimum_wire_compatibility_version": "7.17.0"},
                "tagline": "You Know, for Search"}
        else:
            data = {"name": "fake", "cluster_name": "test", "version": {
                "distribution": "opensearch", "number": "2.15.0"},
                "tagline": "The OpenSearch Project: https://opensearch.org/"}
        self._json(200, data)

    def _bulk(self, body: bytes) -> None:
        srv = self.server
        lines = body.decode("utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        else:
            self._json(400, {"error": {"type": "illegal_argument_exception",
                                       "reason": "The bulk request must be terminated by a "
                                                 "newline [\\n]"}, "status": 400})
            return
        items: list[dict[str, Any]] = []
        errors = False
        with srv.lock:
            srv.bulk_requests += 1
            for action_line, source_line in zip(lines[::2], lines[1::2], strict=True):
                action = json.loads(action_line)
                op, meta = next(iter(action.items()))
                doc = json.loads(source_line)
                key = (meta["_index"], meta["_id"])
                status = srv.item_status(doc) if srv.item_status else None
                if status is None and not srv.auto_create and not any(
                        k[0] == key[0] for k in srv.docs):
                    status = 404
                if status is None:
                    if op == "create" and key in srv.docs:
                        srv.conflicts += 1
                        status = 409
                    else:
                        srv.docs[key] = doc
                        status = 201
                item: dict[str, Any] = {"_index": key[0], "_id": key[1], "status": status}
                if status == 409:
                    item["error"] = {"type": "version_conflict_engine_exception",
                                     "reason": f"[{key[1]}]: version conflict, document "
                                               "already exists"}
                elif status >= 300:
                    item["error"] = {"type": ERROR_TYPES.get(status, "exception"),
                                     "reason": f"injected {status}"}
                if status >= 300:
                    errors = True
                items.append({op: item})
        self._json(200, {"took": 1, "errors": errors, "items": items})

    def _search(self, path: str, query: dict[str, Any]) -> None:
        index = path[: -len("/_search")].strip("/") or "*"
        regex = re.compile("^" + ".*".join(re.escape(p) for p in index.split("*")) + "$")
        rng = query.get("query", {}).get("range", {}).get("time_ns", {})
        lo, hi = rng.get("gte", -(2**63)), rng.get("lt", 2**63)
        with self.server.lock:
            docs = [(k, d) for k, d in self.server.docs.items()
                    if regex.match(k[0]) and lo <= d.get("time_ns", 0) < hi]

        def key(item: tuple[tuple[str, str], dict[str, Any]]) -> list[Any]:
            doc = item[1]
            return [doc.get("stream", ""), doc.get("seq", 0), doc.get("id", "")]

        docs.sort(key=key)
        after = query.get("search_after")
        if after is not None:
            docs = [d for d in docs if key(d) > list(after)]
        page = docs[: int(query.get("size", 10))]
        hits = [{"_index": k[0], "_id": k[1], "_source": d, "sort": key((k, d))}
                for k, d in page]
        self._json(200, {"took": 1, "timed_out": False,
                         "hits": {"total": {"value": len(docs), "relation": "eq"},
                                  "hits": hits}})
