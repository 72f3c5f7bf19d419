"""Our HAProxy's request-id rules (issue 29, item 6), run by a real HAProxy in front of a
loopback server that echoes the ids it was given. The rules themselves, and the edge and
middleware around Serve: tests/unit/test_request_ids.py."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from deployments import edge
from deployments.launcher import haproxy_usable
from orchestrator.runtime.haproxy_harden import ProxyPolicy, harden
from tests.unit.test_client_address import RENDERED, _free_port, _listening
from tests.unit.test_request_ids import FORGED


def _ours(value: str) -> bool:
    return edge.REQUEST_ID.fullmatch(value) is not None


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers with the request ids it was given, as JSON."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        got = {
            name: self.headers.get_all(name) or []
            for name in ("X-Request-ID", "X-Client-Request-ID")
        }
        body = json.dumps(got).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def haproxy_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    ok, binary = haproxy_usable()
    assert ok, binary
    work = tmp_path_factory.mktemp("haproxy-ids")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.handle_error = lambda *_: None  # type: ignore[method-assign]  # HAProxy hanging up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    front, exporter, stats = _free_port(), _free_port(), _free_port()
    rendered = (
        RENDERED.replace("/tmp/oh-1/", f"{work}/")
        .replace("bind :9101", f"bind :{exporter}")
        .replace("127.0.0.1:8000", f"127.0.0.1:{front}")
        .replace("*:8404", f"*:{stats}")
        .replace("127.0.0.1:30000 check", f"127.0.0.1:{server.server_address[1]}")
    )
    config = work / "haproxy.cfg"
    config.write_text(harden(rendered, ProxyPolicy(binary, "127.0.0.1")))
    checked = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    proxy = subprocess.Popen([binary, "-db", "-f", str(config)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not _listening(front):
            assert proxy.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.05)
        yield front
    finally:
        proxy.terminate()
        proxy.wait(10)
        if proxy.stderr is not None:
            proxy.stderr.close()
        server.shutdown()
        server.server_close()


def _through(port: int, headers: list[bytes]) -> dict[str, list[str]]:
    request = b"\r\n".join([b"GET / HTTP/1.1", b"Host: x", b"Connection: close", *headers])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request + b"\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return dict(json.loads(body))


@pytest.mark.parametrize("value", [v for v in FORGED if b"\r" not in v])
def test_haproxy_replaces_a_clients_id(haproxy_front: int, value: bytes) -> None:
    got = _through(
        haproxy_front,
        [b"X-Request-ID: " + value, b"X-Client-Request-ID: " + value],
    )
    (ours,) = got["X-Request-ID"]
    assert _ours(ours) and ours.encode() != value and got["X-Client-Request-ID"] == []


def test_haproxy_keeps_a_well_formed_client_id_apart(haproxy_front: int) -> None:
    sent = [b"X-Client-Request-ID: planted", b"X-Request-ID: trace-1"]
    first, second = _through(haproxy_front, sent), _through(haproxy_front, sent)
    assert first["X-Client-Request-ID"] == second["X-Client-Request-ID"] == ["trace-1"]
    assert first["X-Request-ID"] != second["X-Request-ID"]
    assert all(_ours(i) and i != "trace-1" for i in first["X-Request-ID"] + second["X-Request-ID"])
    assert _ours(_through(haproxy_front, [])["X-Request-ID"][0])
