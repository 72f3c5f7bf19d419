"""The deployment path under attack, through `scripts/serve` (HAProxy, and Serve's own proxy):

- the client address is the TCP peer's, whatever `X-Forwarded-For` a client writes, in both
  proxy modes, from 127.0.0.2 and 127.0.0.1 (the Telegram allowlist is the check that uses it);
- slow clients that never finish their headers do not take /health down, HAProxy cuts them
  off after proxy_header_timeout_s, and one source gets at most proxy_max_conns_per_source;
- HAProxy's stats page and exporter listen where the service does, its admin socket is 0600;
- failed authentications are throttled per real client address, in both proxy modes;
- two services on one host never answer each other's requests, also while one's replicas
  are dead, and a replica refuses requests that did not come through its own HAProxy;
- a second service on a port in use refuses to start (instead of sharing it);
- bytes outside ASCII in any header never crash a request, and a client's X-Request-ID is
  never our request id (a well-formed one is kept apart as `client_request_id`), in both
  proxy modes.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import select
import signal
import socket
import stat
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.e2e.test_json_logs import _session_dir
from tests.e2e.test_serve import ROOT, START_TIMEOUT_S
from tests.e2e.test_workflows import Orchestrator, running
from tests.fakes import telegram_server as telegram

pytestmark = pytest.mark.e2e

ALLOWED = "127.0.0.2"
SETTINGS = {
    "telegram_allowed_cidrs": [f"{ALLOWED}/32"],
    "rate_limit_per_minute": 0,
    # A burst of 20 failures, then one per 30 s: nothing refills while a test runs.
    "auth_failures_per_address": 20,
    "auth_failure_window_s": 600,
    "access_log": True,
}


@pytest.fixture(scope="module")
def haproxy_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    with running(tmp_path_factory.mktemp("proxy-a"), SETTINGS) as orch:
        yield orch


@pytest.fixture(scope="module")
def serve_proxy_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    with running(tmp_path_factory.mktemp("proxy-serve"), {**SETTINGS, "haproxy": False}) as orch:
        yield orch


def _from(source: str, orch: Orchestrator) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=source)
    return httpx.Client(transport=transport, base_url=orch.url, timeout=30)


def _telegram_hook(orch: Orchestrator) -> str:
    with orch.client() as c:
        r = c.post(
            "/channels",
            json={"type": "telegram", "name": "tg", "config": {"bot_token": "1234:" + "A" * 35}},
        )
        assert r.status_code == 200, r.text
        return str(r.json()["data"]["webhook_path"]).removeprefix("/api/v1")


def _address_matrix(orch: Orchestrator) -> dict[tuple[str, str | None], int]:
    hook = _telegram_hook(orch)
    seen = {}
    for source in ("127.0.0.2", "127.0.0.1", "127.0.0.3"):
        for forged in (None, ALLOWED, "149.154.160.1"):
            headers = {"X-Forwarded-For": forged} if forged else {}
            with _from(source, orch) as c:
                r = c.post(hook, json=telegram.text_update("hi"), headers=headers)
            seen[(source, forged)] = r.status_code
    return seen


def _expected() -> dict[tuple[str, str | None], int]:
    return {
        (source, forged): 200 if source == ALLOWED else 401
        for source in ("127.0.0.2", "127.0.0.1", "127.0.0.3")
        for forged in (None, ALLOWED, "149.154.160.1")
    }


def test_client_address_is_the_peer_behind_haproxy(haproxy_service: Orchestrator) -> None:
    assert "throughput-optimized Serve with HAProxy" in (
        haproxy_service.work / "serve.log"
    ).read_text(errors="replace")
    assert _address_matrix(haproxy_service) == _expected()


def test_client_address_is_the_peer_behind_serves_proxy(
    serve_proxy_service: Orchestrator,
) -> None:
    assert "using the standard Serve proxy" in (serve_proxy_service.work / "serve.log").read_text(
        errors="replace"
    )
    assert _address_matrix(serve_proxy_service) == _expected()


def _haproxy_processes(orch: Orchestrator) -> list[psutil.Process]:
    assert orch.proc is not None
    tree = psutil.Process(orch.proc.pid).children(recursive=True)
    return [p for p in tree if p.name() == "haproxy"]


def _hardened_config(orch: Orchestrator) -> Path:
    proc = _haproxy_processes(orch)[0]
    cmd = proc.cmdline()
    return Path(cmd[cmd.index("-f") + 1])


def test_haproxy_admin_surfaces_stay_local(haproxy_service: Orchestrator) -> None:
    config = _hardened_config(haproxy_service)
    assert config.name.endswith(".hardened")
    text = config.read_text()
    socket_path = re.search(r"stats socket (\S+) mode 600 ", text)
    assert socket_path, "admin socket not 0600 in the config"
    assert stat.S_IMODE(os.stat(socket_path.group(1)).st_mode) == 0o600
    listening = {
        c.laddr
        for p in _haproxy_processes(haproxy_service)
        for c in p.net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    assert haproxy_service.port in {addr.port for addr in listening}


@pytest.mark.parametrize("mode", ["haproxy", "serve-proxy"])
def test_slow_clients_do_not_take_health_down(mode: str, request: pytest.FixtureRequest) -> None:
    orch: Orchestrator = request.getfixturevalue(
        "haproxy_service" if mode == "haproxy" else "serve_proxy_service"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(4300, hard - 500)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted + 200), hard))
    sockets = []
    try:
        # From 50 addresses (each under the per-source limit): more than Serve's own
        # maxconn of 4096, each sending a header line and never finishing.
        for i in range(wanted):
            s = socket.socket()
            s.bind((f"127.0.1.{1 + i % 50}", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", orch.port))
            s.send(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
            sockets.append(s)
        with _from("127.0.0.200", orch) as c:
            started = time.monotonic()
            r = c.get("/health")
            took = time.monotonic() - started
        assert r.status_code == 200 and took < 1.0, took
    finally:
        for s in sockets:
            s.close()


def test_unfinished_headers_are_cut_off(haproxy_service: Orchestrator) -> None:
    # proxy_header_timeout_s (10 s): HAProxy answers 408 and closes; Serve's template had no
    # header timeout and a client timeout of an hour.
    with socket.create_connection(("127.0.0.1", haproxy_service.port), timeout=30) as s:
        s.send(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert 8 <= took <= 20, took


def test_one_source_gets_a_bounded_number_of_connections(haproxy_service: Orchestrator) -> None:
    sockets, refused = [], 0
    try:
        for _ in range(400):
            s = socket.socket()
            s.bind(("127.0.2.1", 0))
            try:
                s.connect(("127.0.0.1", haproxy_service.port))
                s.send(b"GET / HTTP/1.1\r\n")
            except OSError:
                refused += 1
                s.close()
                continue
            sockets.append(s)
        deadline = time.monotonic() + 10
        closed: set[int] = set()
        while time.monotonic() < deadline and len(closed) + refused < 400 - 256:
            readable, _, _ = select.select(sockets, [], [], 0.5)
            for s in readable:
                try:
                    if s.recv(16) == b"":
                        closed.add(s.fileno())
                except OSError:
                    closed.add(s.fileno())
        # proxy_max_conns_per_source (256): the rest are closed at once, not queued.
        assert len(closed) + refused >= 400 - 256
    finally:
        for s in sockets:
            s.close()


@pytest.mark.parametrize("mode", ["haproxy", "serve-proxy"])
def test_failed_authentication_is_throttled_per_real_address(
    mode: str, request: pytest.FixtureRequest
) -> None:
    orch: Orchestrator = request.getfixturevalue(
        "haproxy_service" if mode == "haproxy" else "serve_proxy_service"
    )
    statuses: list[int] = []
    with _from("127.0.3.1", orch) as c:
        # Until both replicas refuse (five 429s in a row), each request naming another
        # address in a forged X-Forwarded-For; bounded.
        while statuses[-5:] != [429] * 5 and len(statuses) < 60:
            i = len(statuses)
            r = c.get(
                "/whoami",
                headers={"Authorization": f"Bearer garbage-{i}", "X-Forwarded-For": f"10.9.0.{i}"},
            )
            statuses.append(r.status_code)
        # 20 failures (auth_failures_per_address), counted across replicas: the 2nd of the 2
        # replicas lets one more through before it learns of the block.
        assert statuses[:20] == [401] * 20, statuses
        assert statuses[-5:] == [429] * 5 and statuses.count(401) <= 21, statuses
        assert int(r.headers["Retry-After"]) >= 1 and r.json()["code"] == "rate_limited"
    with _from("127.0.3.2", orch) as c:
        assert c.get("/whoami", headers={"Authorization": "Bearer garbage"}).status_code == 401
        assert c.get("/whoami", headers=orch.admin).status_code == 200


def _replicas(orch: Orchestrator) -> list[psutil.Process]:
    assert orch.proc is not None
    found = []
    for p in psutil.Process(orch.proc.pid).children(recursive=True):
        try:  # a killed replica lingers as a zombie until its parent reaps it
            if p.status() != psutil.STATUS_ZOMBIE and (p.cmdline() or [""])[0].startswith(
                "ray::ServeReplica"
            ):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _listening(orch: Orchestrator) -> set[tuple[str, int]]:
    """Every (address, port) the service's processes listen on."""
    assert orch.proc is not None
    found = set()
    for p in [psutil.Process(orch.proc.pid), *psutil.Process(orch.proc.pid).children(True)]:
        try:
            found |= {
                (c.laddr.ip, c.laddr.port)
                for c in p.net_connections("inet")
                if c.status == psutil.CONN_LISTEN
            }
        except psutil.Error:
            continue  # a worker that just exited
    return found


def test_two_services_on_one_host_never_answer_each_other(
    haproxy_service: Orchestrator, tmp_path_factory: pytest.TempPathFactory
) -> None:
    a = haproxy_service
    with running(tmp_path_factory.mktemp("proxy-b"), SETTINGS) as b:
        for orch, value in ((a, "from-a"), (b, "from-b")):
            with orch.client() as c:
                r = c.post("/memory/default/store", json={"key": "whose", "value": value})
                assert r.status_code == 200, r.text

        # Nothing of either listens on a port of the other, nor on Serve's fixed defaults
        # (fallback proxy 8500/9500, stats 8404, exporter 9101) that both would share.
        on_a, on_b = _listening(a), _listening(b)
        assert on_a and on_b and not on_a & on_b, on_a & on_b
        assert not {port for _, port in on_a | on_b} & {8500, 9500, 8404, 9101}

        # A replica of A refuses a request that did not pass A's HAProxy (here: sent to
        # its direct-ingress port by hand, as another service's proxy would).
        ports = {
            c.laddr.port
            for p in _replicas(a)
            for c in p.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1"
        }
        assert ports
        for port in ports:
            r = httpx.get(f"http://127.0.0.1:{port}/api/v1/whoami", headers=a.admin, timeout=10)
            assert r.status_code == 421, (port, r.status_code, r.text)

        victims = _replicas(b)
        assert victims
        for p in victims:
            p.send_signal(signal.SIGKILL)
        crossed: list[Any] = []
        seen: Counter[tuple[str, int | str]] = Counter()
        odd: list[str] = []
        killed = {p.pid for p in victims}
        restarted = False
        answered_b = 0  # B's answers once its replicas were replaced
        deadline = time.monotonic() + 120
        # From two addresses: A's token failing on B gets its address throttled, which must
        # not hold up B's own client.
        with _from("127.0.4.1", b) as with_a, _from("127.0.4.2", b) as with_b:
            while time.monotonic() < deadline and answered_b < 20:
                for who, c, headers in (("a", with_a, a.admin), ("b", with_b, b.admin)):
                    try:
                        r = c.get("/memory/default/whose", headers=headers)
                    except httpx.HTTPError as exc:
                        seen[(who, type(exc).__name__)] += 1
                        continue
                    seen[(who, r.status_code)] += 1
                    if r.status_code == 200 and (who == "a" or r.json()["value"] != "from-b"):
                        crossed.append((who, r.json()))
                    if who == "b" and r.status_code not in (200, 503):
                        odd.append(f"{r.status_code} {r.text[:200]}")  # for the message
                    if who == "b" and r.status_code == 200 and restarted:
                        answered_b += 1
                restarted = restarted or any(p.pid not in killed for p in _replicas(b))
                time.sleep(0.05)
        assert crossed == [], (crossed, seen)
        # Serve replaced B's replicas, and B answers again (its own data, checked above).
        assert restarted and answered_b >= 20, (seen, odd[:5])


@pytest.mark.parametrize("mode", ["haproxy", "serve-proxy"])
def test_a_second_service_on_the_same_port_refuses_to_start(
    mode: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Serve's proxy binds with SO_REUSEPORT (and is the fallback when HAProxy cannot bind): a
    second service on a taken port would start and the kernel would split the connections."""
    first: Orchestrator = request.getfixturevalue(
        "haproxy_service" if mode == "haproxy" else "serve_proxy_service"
    )
    config = tmp_path / "orchestrator.yaml"
    config.write_text(yaml.safe_dump({**SETTINGS, "haproxy": mode == "haproxy"}))
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
    args = ["--config", str(config), "--data-dir", str(tmp_path / "data")]
    with log.open("wb") as out:
        second = subprocess.Popen(
            [str(ROOT / "scripts" / "serve"), *args, "--port", str(first.port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while second.poll() is None and time.monotonic() < deadline:
            assert "Orchestrator ready at" not in log.read_text(errors="replace"), (
                "a second service started on a port in use"
            )
            time.sleep(0.25)
    finally:
        if second.poll() is None:
            second.send_signal(signal.SIGTERM)
            second.wait(120)
    text = log.read_text(errors="replace")
    assert second.returncode == 2, text[-3000:]
    assert f"cannot listen on 127.0.0.1:{first.port}" in text, text[-3000:]
    with httpx.Client(base_url=first.url, headers=first.admin, timeout=30) as c:
        assert c.get("/whoami").json()["user_uuid"] == "admin"


# The one form a request id has (docs/security.md, "The network edge").
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _raw(
    orch: Orchestrator,
    method: str,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes = b"",
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request written byte for byte (httpx refuses header values outside ASCII)."""
    head = [
        f"{method} {path} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Connection: close",
        f"Content-Length: {len(body)}".encode(),
        *(name + b": " + value for name, value in headers),
    ]
    with socket.create_connection(("127.0.0.1", orch.port), timeout=30) as s:
        s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        response = http.client.HTTPResponse(s)
        response.begin()
        return response.status, response.headers, response.read()


# Each header Serve reads (and decoded as UTF-8 before the app ran: a 500 nobody logged),
# and two it does not, each with bytes that are not UTF-8.
NOT_UTF8 = [
    (b"X-Request-ID", b"caf\xe9"),
    (b"X-Client-Request-ID", b"caf\xe9"),
    (b"X-Session-ID", b"\xff\xfe"),
    (b"serve_multiplexed_model_id", b"caf\xe9"),
    (b"serve-multiplexed-model-id", b"caf\xe9"),
    (b"X-Request-Timeout-Seconds", b"1\xe9"),
    (b"X-Request-Disconnect-Disabled", b"?\xe9"),
    (b"traceparent", b"00-\xe9"),
    (b"User-Agent", b"caf\xe9"),
]


@pytest.mark.parametrize("mode", ["haproxy", "serve-proxy"])
def test_bytes_outside_ascii_in_headers_never_crash_a_request(
    mode: str, request: pytest.FixtureRequest
) -> None:
    orch: Orchestrator = request.getfixturevalue(
        "haproxy_service" if mode == "haproxy" else "serve_proxy_service"
    )
    token = orch.admin["Authorization"].encode()
    json_body = [(b"Content-Type", b"application/json")]
    routes = [
        ("GET", "/api/v1/health", [], b"", 200),
        ("GET", "/api/v1/workflows", [], b"", 401),
        ("GET", "/api/v1/workflows", [(b"Authorization", token)], b"", 200),
        ("POST", "/api/v1/channels/webhook/no-such-token", json_body, b"{}", 404),
        ("GET", "/ui/", [], b"", 200),
    ]
    for method, path, headers, body, expected in routes:
        for sent in ([NOT_UTF8[0]], NOT_UTF8):
            status, answer, content = _raw(orch, method, path, [*headers, *sent], body)
            assert status == expected, (method, path, sent, status, content[:300])
            ids = answer.get_all("X-Request-ID") or []
            assert len(ids) == 1 and REQUEST_ID.fullmatch(ids[0]), (path, ids)
            if path.startswith("/api/") and status != 200:
                error = json.loads(content)
                assert error["ok"] is False and error["request_id"] == ids[0], error


def _replica_lines(orch: Orchestrator) -> str:
    logs = _session_dir(orch.proc.pid if orch.proc else 0) / "logs" / "serve"
    return "".join(p.read_text(errors="replace") for p in logs.glob("replica_*Api*.log"))


@pytest.mark.parametrize("mode", ["haproxy", "serve-proxy"])
def test_a_clients_request_id_is_never_ours(mode: str, request: pytest.FixtureRequest) -> None:
    """A forged id (log forging, markup) never reaches the answer or a log line; a
    well-formed one is kept apart as the access line's `client_request_id`, and each
    request still gets an id of its own, so a reused one ties nothing together."""
    orch: Orchestrator = request.getfixturevalue(
        "haproxy_service" if mode == "haproxy" else "serve_proxy_service"
    )
    marks = [uuid.uuid4().hex[:12] for _ in range(2)]
    forged = [f"forged-{marks[0]} user=admin status=200", f"<script>alert('{marks[1]}')</script>"]
    ours: dict[str, str | None] = {}
    for value in forged:
        status, answer, content = _raw(
            orch, "GET", "/api/v1/whoami", [(b"X-Request-ID", value.encode())]
        )
        assert status == 401, content[:300]
        request_id = answer["X-Request-ID"]
        assert REQUEST_ID.fullmatch(request_id) and value not in content.decode(), request_id
        assert json.loads(content)["request_id"] == request_id
        ours[request_id] = None

    reused = f"trace-{uuid.uuid4().hex}"
    auth = (b"Authorization", orch.admin["Authorization"].encode())
    for _ in range(2):
        status, answer, content = _raw(
            orch, "GET", "/api/v1/whoami", [auth, (b"X-Request-ID", reused.encode())]
        )
        assert status == 200, content[:300]
        assert REQUEST_ID.fullmatch(answer["X-Request-ID"]) and answer["X-Request-ID"] != reused
        ours[answer["X-Request-ID"]] = reused
    assert len(ours) == 4  # four requests, four ids

    # Each request's access line, found by our id, names the client's own id only if it
    # was well-formed; nothing of a forged one is in any line.
    deadline = time.monotonic() + 30  # replicas write their buffered lines every second
    while True:
        text = _replica_lines(orch)
        if all(f"request_id={rid}" in text for rid in ours):
            break
        assert time.monotonic() < deadline, "access lines missing"
        time.sleep(0.5)
    assert not [mark for mark in marks if mark in text]
    for rid, client in ours.items():
        (line,) = [line for line in text.splitlines() if f"request_id={rid}" in line]
        assert (f"client_request_id={client}" in line) == (client is not None), line
