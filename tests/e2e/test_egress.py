"""The SSRF guard of channel deliveries through `scripts/serve` (ChannelHub actors deliver):
with `outbound_allowed_cidrs: ["127.0.0.2/32"]`, a webhook channel's callback reaches a
receiver on 127.0.0.2; a callback whose name resolves to 127.0.0.1 is refused when connecting
(the server there receives nothing, last_error says "destination not allowed" and nothing of
its answer); a redirect from the allowed receiver to that server is not followed; literal
internal addresses are a 400 naming the field."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.e2e.test_workflows import Orchestrator, agent_config, running
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e


class Receiver:
    """A plain HTTP server on `host` that records each request's path; it answers 403 with
    a body that must never show up anywhere, or 302 to `redirect_to`."""

    def __init__(self, host: str, redirect_to: str | None = None) -> None:
        seen: list[str] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                seen.append(self.path)
                self.rfile.read(int(self.headers.get("content-length") or 0))
                if redirect_to:
                    self.send_response(302)
                    self.send_header("Location", redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b"internal secret: do not show"
                self.send_response(403 if host == "127.0.0.1" else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    work = tmp_path_factory.mktemp("egress-e2e")
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        settings = agent_config(
            llm, outbound_allowed_cidrs=["127.0.0.2/32"], channel_retry_base_s=0.2
        )
        with running(work, settings) as orch:
            yield orch


def _last_error(c: httpx.Client, h: dict[str, str], channel_id: str, within: float = 60) -> str:
    deadline = time.monotonic() + within
    while True:
        error = c.get(f"/channels/{channel_id}", headers=h).json()["last_error"]
        if error:
            return str(error)
        assert time.monotonic() < deadline, "no delivery failure recorded in time"
        time.sleep(0.2)


def test_deliveries_reach_only_allowed_addresses(service: Orchestrator) -> None:
    with (
        Receiver("127.0.0.1") as inside,
        Receiver("127.0.0.2") as allowed,
        Receiver("127.0.0.2", redirect_to=f"http://localhost:{inside.port}/moved") as bounce,
        httpx.Client(base_url=service.url, timeout=30) as c,
    ):
        made = c.post("/tokens", headers=service.admin, json={"user_uuid": "ann"}).json()
        ann = {"Authorization": f"Bearer {made['token']}"}

        def hook(url: str) -> Any:
            r = c.post(
                "/channels",
                headers=ann,
                json={"type": "webhook", "name": "hook", "config": {"callback_url": url}},
            )
            assert r.status_code == 200, r.text
            channel = r.json()["data"]
            r = c.post(
                f"/channels/webhook/{channel['webhook_token']}",
                json={"text": "[answer hi]", "metadata": {"message_id": url}},
            )
            assert r.json()["accepted"] is True, r.text
            return channel

        # Literal internal addresses, in any spelling, are refused when configured.
        for kind, field, url in (
            ("webhook", "callback_url", "http://169.254.169.254/latest/meta-data/"),
            ("webhook", "callback_url", f"http://[::ffff:127.0.0.1]:{inside.port}/"),
            ("webhook", "callback_url", f"http://2130706433:{inside.port}/"),
            ("slack", "webhook_url", "http://0x7f.1/services/T/B/x"),
        ):
            config = {field: url, **({"signing_secret": "s" * 32} if kind == "slack" else {})}
            r = c.post("/channels", headers=ann, json={"type": kind, "name": "x", "config": config})
            assert r.status_code == 400 and field in r.text, (url, r.text)

        # The allowed range is delivered to.
        hook(f"http://127.0.0.2:{allowed.port}/ok")
        deadline = time.monotonic() + 60
        while not allowed.seen:
            assert time.monotonic() < deadline, "the allowed receiver got nothing"
            time.sleep(0.2)
        assert allowed.seen == ["/ok"]

        # A name that resolves inside: refused when connecting, nothing reaches the server.
        refused = hook(f"http://localhost:{inside.port}/hook")
        error = _last_error(c, ann, refused["id"])
        assert "destination not allowed" in error
        assert "secret" not in error and "403" not in error and str(inside.port) not in error

        # A redirect from an allowed host to an internal one is not followed.
        bounced = hook(f"http://127.0.0.2:{bounce.port}/bounce")
        assert "HTTP 302" in _last_error(c, ann, bounced["id"])
        assert bounce.seen == ["/bounce"]
        assert inside.seen == []


def test_ipv6_forms_of_internal_addresses_are_refused(service: Orchestrator) -> None:
    """Issue 29: IPv4-compatible, NAT64 (well-known and local-use) and SIIT spellings of
    loopback and metadata addresses are refused when a channel is created."""
    with Receiver("127.0.0.1") as inside, httpx.Client(base_url=service.url, timeout=30) as c:
        made = c.post("/tokens", headers=service.admin, json={"user_uuid": "dee"}).json()
        dee = {"Authorization": f"Bearer {made['token']}"}
        for address in (
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "::a9fe:a9fe",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:5",
            "::ffff:0:7f00:1",
        ):
            url = f"http://[{address}]:{inside.port}/"
            r = c.post(
                "/channels",
                headers=dee,
                json={"type": "webhook", "name": "v6", "config": {"callback_url": url}},
            )
            assert r.status_code == 400, (url, r.text)
            assert r.json()["code"] == "validation_error", r.text
            assert "callback_url" in r.text and "not allowed" in r.text, (url, r.text)
        assert c.get("/channels", headers=dee).json()["data"] == []
        assert inside.seen == []
