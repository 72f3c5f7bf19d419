"""Request ids and header bytes at every entry (issue 29, items 5 and 6): the rule
(`deployments.edge.request_ids`), the edge Serve runs around its HTTP servers, our HAProxy's
rules (run by a real HAProxy in tests/integration/test_haproxy_request_ids.py), and the app's
request layers. End to end, in both proxy modes:
tests/e2e/test_proxy_security.py."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp

from deployments import edge, launcher
from deployments.edge import EdgeGuard, edge_headers, loggable_path, request_ids
from deployments.errors import install_error_handlers
from deployments.launcher import EDGE_HOOK
from deployments.layers import request_layers
from orchestrator.config import Settings
from orchestrator.observability import ACCESS_LOGGER, MetricsRecorder, RouteTemplates
from orchestrator.runtime import haproxy_harden
from orchestrator.runtime.haproxy_harden import ProxyPolicy, harden
from tests.unit.test_client_address import RENDERED

with warnings.catch_warnings():  # Serve's own models still use pydantic v1 idioms
    warnings.simplefilter("ignore", DeprecationWarning)
    from ray.serve._private.http_util import validate_http_proxy_callback_return
    from ray.serve._private.utils import call_function_from_import_path

    import deployments.app as serve_app

FORGED = [
    b"forged-1 user=admin status=200",
    b"<script>alert(1)</script>",
    b"caf\xe9",
    b"",
    b"x" * 129,
    b"a\r\nb",
]


def _ours(value: str) -> bool:
    return edge.REQUEST_ID.fullmatch(value) is not None


@pytest.mark.parametrize("value", FORGED)
def test_the_first_hop_never_takes_a_clients_id(value: bytes) -> None:
    ours, client = request_ids([(b"x-request-id", value)], trusted=False)
    assert _ours(ours) and ours != value.decode("latin-1") and client is None


def test_a_well_formed_client_id_is_kept_apart_and_each_request_gets_its_own() -> None:
    headers = [(b"x-client-request-id", b"sent-as-client-id"), (b"x-request-id", b"trace-1")]
    first, second = (request_ids(headers, trusted=False) for _ in range(2))
    # A client naming its own X-Client-Request-ID at the first hop is not believed either.
    assert first[1] == second[1] == "trace-1" and first[0] != second[0]
    assert _ours(first[0]) and first[0] != "trace-1"


def test_behind_a_hop_of_ours_a_well_formed_id_is_kept_and_anything_else_replaced() -> None:
    made = [(b"x-request-id", b"9f1c0b1e-3a52-4f0e-8a67-2d1b5b7c9e10")]
    assert request_ids([*made, (b"x-client-request-id", b"trace-1")], trusted=True) == (
        "9f1c0b1e-3a52-4f0e-8a67-2d1b5b7c9e10",
        "trace-1",
    )
    for value in FORGED:
        ours, client = request_ids(
            [(b"x-request-id", value), (b"x-client-request-id", value)], trusted=True
        )
        assert _ours(ours) and ours != value.decode("latin-1") and client is None


def test_the_edge_removes_headers_serve_cannot_decode() -> None:
    headers = [
        (b"x-request-id", b"caf\xe9"),
        (b"x-session-id", b"\xff\xfe"),
        (b"serve_multiplexed_model_id", b"caf\xe9"),
        (b"x-request-timeout-seconds", b"1\xe9"),
        (b"user-agent", "café".encode()),  # UTF-8: Serve decodes it, the app reads it
        (b"caf\xe9", b"name not ASCII"),
        (b"authorization", b"Bearer t"),
    ]
    out, request_id = edge_headers(headers, trusted=False)
    assert out == [
        (b"user-agent", "café".encode()),
        (b"authorization", b"Bearer t"),
        (b"x-request-id", request_id.encode()),
    ]
    for name, value in out:  # what Serve does to them (proxy.py, replica.py)
        name.decode(), value.decode()


def _scope(headers: list[tuple[bytes, bytes]], path: str = "/api/v1/health") -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
    }


class _Sent:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def test_the_edge_hands_serve_our_ids_and_clean_headers() -> None:
    seen: list[list[tuple[bytes, bytes]]] = []

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard = EdgeGuard(serve, trusted_request_id=False, report=lambda *a: None)
    sent = _Sent()
    await guard(_scope([(b"x-request-id", b"trace-7"), (b"x-session-id", b"\xff")]), _receive, sent)
    assert sent.status == 200
    headers = dict(seen[0])
    assert b"x-session-id" not in headers and headers[b"x-client-request-id"] == b"trace-7"
    assert _ours(headers[b"x-request-id"].decode()) and headers[b"x-request-id"] != b"trace-7"


@pytest.mark.parametrize("answered_first", [False, True])
async def test_an_error_in_serves_code_is_logged_answered_and_counted(
    answered_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """What Serve's code did on a header it could not decode: raise, out of its ASGI app."""

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if answered_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        b"caf\xe9".decode()

    counted: list[tuple[str, str]] = []
    guard = EdgeGuard(serve, trusted_request_id=True, report=lambda m, p, s: counted.append((m, p)))
    sent = _Sent()
    path = "/api/v1/channels/webhook/chw_secret-token"
    with caplog.at_level(logging.ERROR, logger="ray.serve.edge"):
        if answered_first:
            with pytest.raises(UnicodeDecodeError):
                await guard(_scope([], path), _receive, sent)
        else:
            await guard(_scope([], path), _receive, sent)
    records = [r for r in caplog.records if r.name == "ray.serve.edge"]
    if answered_first:
        # The answer had begun: the app's middleware counted (and logged) its status, and
        # re-raised; counting it again here would count one request twice. The server ends
        # the connection.
        assert counted == [] and records == []
        return
    assert counted == [("GET", path)]
    (record,) = records
    assert record.levelno == logging.ERROR and record.exc_info is not None
    message = record.getMessage()
    assert "chw_secret-token" not in message and "/api/v1/channels/webhook/" in message
    assert loggable_path("/api/v1/channels/webhook/decide/iv-7.a.b3Bz.17.mac") == (
        "/api/v1/channels/webhook/decide/[redacted]"
    )
    assert sent.status == 500 and sent.headers[b"content-type"] == b"application/json"
    body = json.loads(sent.body)
    assert body == {
        "ok": False,
        "error": "internal server error",
        "code": "internal_error",
        "request_id": sent.headers[b"x-request-id"].decode(),
    }
    assert body["request_id"] in message


async def test_the_edges_own_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """In Serve's proxy no formatter of ours masks secrets: the edge's records are masked
    before any handler formats them, the message and the traceback alike."""

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise ValueError("bad header authorization: Bearer orch_live-secret-0123456789")

    guard = EdgeGuard(serve, trusted_request_id=False, report=lambda *a: None)
    with caplog.at_level(logging.ERROR, logger="ray.serve.edge"):
        await guard(_scope([]), _receive, _Sent())
        edge.log.error("token in a message: Bearer %s", "orch_other-secret-0123456789")
    records = [r for r in caplog.records if r.name == "ray.serve.edge"]
    assert len(records) == 2
    # Formatted as Serve's text formatter (and the standard one) would: exc_text is used.
    lines = [logging.Formatter("%(message)s").format(r) for r in records]
    assert "ValueError" in lines[0] and "Traceback" in lines[0]
    for line in lines:
        assert "secret" not in line and "[redacted]" in line


def test_serve_finds_the_edge_where_the_launcher_points_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The hook names a function that returns Starlette middlewares (what Serve's
    `configure_http_middlewares` calls), in either proxy mode."""
    # The launcher configures Serve through the environment: a copy, for this test only.
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(launcher.tempfile, "gettempdir", lambda: str(tmp_path))  # its run dir
    modes = [(launcher._configure_standard_proxy_env, False)]
    modes.append((lambda: launcher._configure_serve_env(Settings(data_dir=tmp_path), print), True))
    for configure, trusted in modes:
        configure()
        returned = call_function_from_import_path(os.environ[EDGE_HOOK])
        (middleware,) = validate_http_proxy_callback_return(returned)
        assert middleware.cls is EdgeGuard and middleware.kwargs["trusted_request_id"] is trusted
    # Named, not imported, by the edge (that module loads the whole app).
    assert (edge.APP_NAME, edge.INGRESS) == (serve_app.APP_NAME, serve_app.INGRESS)


# HAProxy: its rules, checked by HAProxy itself and then run in front of a loopback server.


def test_the_haproxy_rules_use_the_one_request_id_form() -> None:
    assert haproxy_harden.REQUEST_ID_PATTERN == edge.REQUEST_ID.pattern
    out = harden(RENDERED, ProxyPolicy(binary="/bin/haproxy", host="127.0.0.1"))
    frontend = out.split("frontend http_frontend\n", 1)[1].split("\nbackend http-x", 1)[0]
    for rule in haproxy_harden.REQUEST_ID_RULES:
        assert rule + "\n" in frontend
    # Before Serve's own rules (its template sets x-request-id when none is found).
    assert frontend.index("x-request-id %[uuid]") < frontend.index("default_backend")


# The app's request layers: the same rule, served alone (first hop) and under Serve.


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = json.dumps({"request_id": scope["state"]["request_id"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _middleware(echo: bool, ingress_key: str | None = None) -> tuple[ASGIApp, MetricsRecorder]:
    """The app's request layers (deployments/layers) around a route that answers its id."""
    recorder = MetricsRecorder("test")
    settings = Settings(access_log=True, ingress_key=ingress_key)
    ctx = SimpleNamespace(settings=settings, recorder=recorder)
    handlers = FastAPI()
    install_error_handlers(handlers)
    layers = request_layers(
        settings,
        services_getter=lambda: ctx,
        templates=RouteTemplates(["/api/v1/health"]),
        echo_request_id=echo,
        handlers=handlers.exception_handlers,
    )
    app: ASGIApp = _ok
    for cls, args, kwargs in reversed(layers):
        app = cls(app, *args, **kwargs)
    return app, recorder


async def test_served_alone_the_layers_never_take_a_clients_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Served alone (no Serve), the app is the first hop: every request gets an id of its
    own; a client's well-formed id is in the access line apart, a forged one nowhere."""
    app, _ = _middleware(echo=True)
    sent_ids = [b"trace-123", b"trace-123", *FORGED]
    ids = []
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        for value in sent_ids:
            sent = _Sent()
            await app(_scope([(b"x-request-id", value)]), _receive, sent)
            request_id = sent.headers[b"x-request-id"].decode()
            assert _ours(request_id) and json.loads(sent.body)["request_id"] == request_id
            ids.append(request_id)
    assert len(set(ids)) == len(sent_ids) and "trace-123" not in ids
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    for value, request_id, line in zip(sent_ids, ids, lines, strict=True):
        assert f"request_id={request_id} " in line
        if value == b"trace-123":
            assert line.endswith(" client_request_id=trace-123")
        else:
            assert "client_request_id" not in line
            assert not value or value.decode("latin-1") not in line


async def test_under_serve_the_layers_check_the_id_they_are_given() -> None:
    """Serve hands over the id a hop of ours made (and echoes it itself); one that is not
    well-formed (a deployment without our edge) is still never used."""
    app, _ = _middleware(echo=False)
    sent = _Sent()
    await app(_scope([(b"x-request-id", b"made-by-the-edge")]), _receive, sent)
    assert json.loads(sent.body)["request_id"] == "made-by-the-edge"
    assert b"x-request-id" not in sent.headers  # Serve adds it
    for value in FORGED:
        sent = _Sent()
        await app(_scope([(b"x-request-id", value)]), _receive, sent)
        request_id = json.loads(sent.body)["request_id"]
        assert _ours(request_id) and request_id != value.decode("latin-1")


async def test_a_request_that_skipped_our_haproxy_never_gets_the_clients_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sent straight to a replica's port: the edge there trusts X-Request-ID (our HAProxy
    made it), but with no ingress key it is the client's. The 421 carries a fresh id, in the
    body, the access line and the one X-Request-ID header, through the edge and Serve's own
    RequestIdMiddleware as a replica's direct-ingress server stacks them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from ray.serve._private.http_util import RequestIdMiddleware

    app, _ = _middleware(echo=False, ingress_key="the-ingress-key")
    server = EdgeGuard(RequestIdMiddleware(app), trusted_request_id=True, report=lambda *a: None)
    sent = _Sent()
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        await server(_scope([(b"x-request-id", b"client-trace-1")]), _receive, sent)
    assert sent.status == 421
    request_id = json.loads(sent.body)["request_id"]
    assert _ours(request_id) and request_id != "client-trace-1"
    ids = [v for n, v in sent.messages[0]["headers"] if n.lower() == b"x-request-id"]
    assert ids == [request_id.encode()]
    (line,) = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert f"request_id={request_id} " in line and "request_id=client-trace-1 " not in line
    # Through our HAProxy (the key present) the id it made is kept, and echoed once.
    sent = _Sent()
    headers = [(b"x-request-id", b"made-by-haproxy"), (b"x-orch-ingress", b"the-ingress-key")]
    await server(_scope(headers), _receive, sent)
    assert sent.status == 200 and json.loads(sent.body)["request_id"] == "made-by-haproxy"
    ids = [v for n, v in sent.messages[0]["headers"] if n.lower() == b"x-request-id"]
    assert ids == [b"made-by-haproxy"]
