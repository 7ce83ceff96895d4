"""`gpu-audit dashboards push` against recorded Grafana and Kibana API contracts served
in process: the exact requests (method, path, auth and xsrf headers, bodies), folder
creation only when missing, overwrite by uid, and failures that name the problem
without ever showing a credential."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboards import build, kibana, push
from gpu_audit_app.cli import main
from tests.dashboards.contract_server import ContractServer, contract, contract_server

GRAFANA = contract("grafana")
KIBANA = contract("kibana")
TOKEN = "glsa_not-a-real-token-3f9a"
UIDS = sorted(m["uid"] for m in build.build_all().values())


@pytest.fixture
def server() -> Iterator[ContractServer]:
    with contract_server() as s:
        yield s


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GRAFANA_TOKEN", "GRAFANA_USER", "GRAFANA_PASSWORD", "KIBANA_API_KEY",
                 "KIBANA_USER", "KIBANA_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def test_grafana_push_creates_the_folder_and_overwrites_each_dashboard_by_uid(
        server: ContractServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Folder missing: GET it (404), POST /api/folders {title, uid}, then one
    POST /api/dashboards/db per dashboard with the committed model (id null),
    folderUid and overwrite=true, all with the Bearer token from GRAFANA_TOKEN."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    server.answer("GET", "/api/folders/gpu-audit", GRAFANA["folder_missing"])
    server.answer("POST", "/api/folders", GRAFANA["folder_created"])
    server.answer("POST", "/api/dashboards/db", GRAFANA["dashboard_saved"])
    assert main(["dashboards", "push", "--grafana", server.url]) == 0
    reqs = server.requests
    assert [(r.method, r.path) for r in reqs] == (
        [("GET", "/api/folders/gpu-audit"), ("POST", "/api/folders")]
        + [("POST", "/api/dashboards/db")] * len(UIDS))
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in reqs)
    assert reqs[1].json() == {"title": "GPU", "uid": "gpu-audit"}
    committed = {m["uid"]: m for m in push.load_dashboards()}
    bodies = [r.json() for r in reqs[2:]]
    assert sorted(b["dashboard"]["uid"] for b in bodies) == UIDS
    for body in bodies:
        assert body == {"dashboard": {**committed[body["dashboard"]["uid"]], "id": None},
                        "folderUid": "gpu-audit", "overwrite": True,
                        "message": "gpu-audit dashboards push"}
        assert reqs[2].headers["content-type"].startswith("application/json")
    out = capsys.readouterr()
    assert f"{len(UIDS)} dashboards into folder gpu-audit" in out.out
    assert TOKEN not in out.out + out.err


def test_grafana_push_reuses_an_existing_folder_with_basic_auth_from_a_file(
        server: ContractServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Folder exists: no POST /api/folders. GRAFANA_USER + --grafana-password-file
    (one trailing newline stripped) give HTTP basic auth."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("GRAFANA_USER", "pusher")
    secret = tmp_path / "pw"
    secret.write_text("s3cret pw\n")
    server.answer("GET", "/api/folders/gpu-audit", GRAFANA["folder_exists"])
    server.answer("POST", "/api/dashboards/db", GRAFANA["dashboard_saved"])
    assert main(["dashboards", "push", "--grafana", server.url + "/",
                 "--grafana-password-file", str(secret)]) == 0
    assert [r.method + " " + r.path for r in server.requests][:2] == [
        "GET /api/folders/gpu-audit", "POST /api/dashboards/db"]
    expected = "Basic " + base64.b64encode(b"pusher:s3cret pw").decode()
    assert {r.headers["authorization"] for r in server.requests} == {expected}


def test_grafana_refusal_fails_naming_the_server_message_and_not_the_token(
        server: ContractServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """401 from Grafana: exit 1, the server's message in the error, the token in no
    output or log record; credentials in the URL are stripped from messages too."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    server.answer("GET", "/api/folders/gpu-audit", GRAFANA["unauthorized"])
    url = server.url.replace("http://", "http://admin:urlpass@")
    assert main(["dashboards", "push", "--grafana", url]) == 1
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "invalid API key" in err
    text = err + caplog.text
    assert TOKEN not in text and "urlpass" not in text


def test_grafana_forbidden_on_save_is_an_error(server: ContractServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A 403 on the first dashboard stops the push with the permission message."""
    _clean_env(monkeypatch)
    server.answer("GET", "/api/folders/gpu-audit", GRAFANA["folder_exists"])
    server.answer("POST", "/api/dashboards/db", GRAFANA["forbidden"])
    tgt = push.target(server.url, {"GRAFANA_TOKEN": TOKEN}, prefix="GRAFANA",
                      key_var="GRAFANA_TOKEN", token_file=None, password_file=None)
    with pytest.raises(push.PushError, match=r"HTTP 403.*dashboards:create"):
        push.push_grafana(tgt)


def _multipart_file(body: bytes, content_type: str) -> bytes:
    boundary = content_type.split("boundary=", 1)[1].encode()
    (part,) = [p for p in body.split(b"--" + boundary) if b"filename=" in p]
    head, _, payload = part.partition(b"\r\n\r\n")
    assert b'name="file"; filename="gpu-audit.ndjson"' in head
    return payload.removesuffix(b"\r\n")


def test_kibana_push_imports_the_ndjson_with_overwrite_and_xsrf(
        server: ContractServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """POST /s/SPACE/api/saved_objects/_import?overwrite=true, kbn-xsrf header, ApiKey
    auth from KIBANA_API_KEY, multipart field `file` holding the committed NDJSON."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("KIBANA_API_KEY", TOKEN)
    server.answer("POST", "/s/ops/api/saved_objects/_import", KIBANA["imported"])
    assert main(["dashboards", "push", "--kibana", server.url, "--kibana-space", "ops"]) == 0
    (req,) = server.requests
    assert (req.method, req.path) == ("POST", "/s/ops/api/saved_objects/_import?overwrite=true")
    assert req.headers["kbn-xsrf"] == "true"
    assert req.headers["authorization"] == f"ApiKey {TOKEN}"
    assert req.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert _multipart_file(req.body, req.headers["content-type"]) == kibana.NDJSON.read_bytes()
    assert "7 saved objects imported" in capsys.readouterr().out


def test_kibana_partial_import_fails_naming_each_object(
        server: ContractServer, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """success=false (HTTP 200): exit 1 naming the object and the error type."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("KIBANA_USER", "elastic")
    monkeypatch.setenv("KIBANA_PASSWORD", "kpw-secret")
    server.answer("POST", "/api/saved_objects/_import", KIBANA["missing_references"])
    assert main(["dashboards", "push", "--kibana", server.url]) == 1
    (req,) = server.requests
    assert req.headers["authorization"] == "Basic " + base64.b64encode(
        b"elastic:kpw-secret").decode()
    err = capsys.readouterr().err
    assert "dashboard/gpu-audit-usage: missing_references" in err
    assert "kpw-secret" not in err


def test_kibana_http_error_names_the_message(server: ContractServer) -> None:
    """A 401 from Kibana is an error with Kibana's message."""
    server.answer("POST", "/api/saved_objects/_import", KIBANA["unauthorized"])
    tgt = push.Target(server.url)
    with pytest.raises(push.PushError, match=r"HTTP 401.*unable to authenticate"):
        push.push_kibana(tgt)


def test_push_without_a_target_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing to push: exit 2 with what to give."""
    assert main(["dashboards", "push"]) == 2
    assert "--grafana URL and/or --kibana URL" in capsys.readouterr().err


def test_unreadable_secret_file_is_named(tmp_path: Path, server: ContractServer) -> None:
    """A token file that cannot be read fails before any request, naming the file."""
    missing = tmp_path / "nope"
    assert main(["dashboards", "push", "--grafana", server.url,
                 "--grafana-token-file", str(missing)]) == 1
    assert server.requests == []


def test_request_bodies_are_the_committed_json() -> None:
    """What push uploads is exactly what is committed (and built)."""
    assert json.dumps(push.load_dashboards(), sort_keys=True) == json.dumps(
        [build.build_all()[p.stem] for p in sorted(build.GRAFANA_DIR.glob("*.json"))],
        sort_keys=True)
