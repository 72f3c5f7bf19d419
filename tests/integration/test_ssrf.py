"""Channel deliveries never reach internal addresses unless the operator allows them
(`outbound_allowed_cidrs`), checked on the address connected to; the channel's last_error
says so without any answer from inside. Through the real app and relay."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ServedApp
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.integration.test_channels_api import _settings, _until, _user, llm

__all__ = ["llm"]


class Inside(LoopbackServer):
    """An internal service: anything that reaches it is recorded; `redirect_to` answers 302."""

    label = "inside"

    def __init__(self, redirect_to: str | None = None) -> None:
        super().__init__()
        self.redirect_to = redirect_to

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if self.redirect_to:
            await self.send_body(send, 302, b"", [("location", self.redirect_to)])
            return
        await self.send_body(send, 403, b"secret internal answer", [("content-type", "text/plain")])


@pytest.fixture
async def inside() -> AsyncIterator[Inside]:
    async with Inside() as server:
        yield server


async def _hook_channel(api: httpx.AsyncClient, who: dict[str, str], url: str) -> Any:
    r = await api.post(
        "/channels",
        headers=who,
        json={"type": "webhook", "name": "h", "config": {"callback_url": url}},
    )
    return r


async def _deliver(api: httpx.AsyncClient, made: Any) -> None:
    r = await api.post(
        f"/channels/webhook/{made['webhook_token']}",
        json={"text": "[answer hi]", "metadata": {"message_id": f"m{time.monotonic_ns()}"}},
    )
    assert r.status_code == 200 and r.json()["accepted"] is True


async def test_internal_destinations_are_refused_by_default(
    make_settings: Any, llm: Any, inside: Inside
) -> None:
    settings = _settings(make_settings, llm, outbound_allowed_cidrs=[])
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=f"{app.url}/api/v1") as api:
        ann = await _user(api, "ann")
        # A literal internal address, in any spelling, is refused when configured.
        for url in (
            inside.url,
            "http://2130706433/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:127.0.0.1]/",
        ):
            r = await _hook_channel(api, ann, url)
            assert r.status_code == 400 and "callback_url" in r.text, (url, r.text)
        # A name that resolves inside passes creation, and is refused at connect time.
        port = inside.url.rsplit(":", 1)[1]
        r = await _hook_channel(api, ann, f"http://localhost:{port}/hook")
        assert r.status_code == 200, r.text
        made = r.json()["data"]
        await _deliver(api, made)

        async def refused() -> Any:
            chan = (await api.get(f"/channels/{made['id']}", headers=ann)).json()
            return chan if chan["last_error"] else None

        chan = await _until(refused)
        assert "destination not allowed" in chan["last_error"]
        assert "secret" not in chan["last_error"] and "403" not in chan["last_error"]
        assert inside.requests == []


# IPv6 spellings of internal IPv4 addresses (issue 29): IPv4-compatible, NAT64 well-known
# and local-use prefixes, SIIT.
IPV6_FORMS_OF_INSIDE = (
    "::127.0.0.1",
    "64:ff9b::7f00:1",
    "::a9fe:a9fe",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::a00:5",
    "::ffff:0:7f00:1",
)


async def test_ipv6_forms_of_internal_addresses_are_refused(
    make_settings: Any, llm: Any, inside: Inside
) -> None:
    settings = _settings(make_settings, llm, outbound_allowed_cidrs=[])
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=f"{app.url}/api/v1") as api:
        ann = await _user(api, "ann")
        port = inside.url.rsplit(":", 1)[1]
        # The same forms carrying a public address are accepted.
        r = await _hook_channel(api, ann, f"http://[64:ff9b::8.8.8.8]:{port}/hook")
        assert r.status_code == 200, r.text
        made = r.json()["data"]
        for address in IPV6_FORMS_OF_INSIDE:
            url = f"http://[{address}]:{port}/hook"
            r = await _hook_channel(api, ann, url)
            assert r.status_code == 400, (url, r.text)
            assert "callback_url" in r.text and "not allowed" in r.text, (url, r.text)
            r = await api.put(
                f"/channels/{made['id']}", headers=ann, json={"config": {"callback_url": url}}
            )
            assert r.status_code == 400, (url, r.text)
            assert "callback_url" in r.text and "not allowed" in r.text, (url, r.text)
        chan = (await api.get(f"/channels/{made['id']}", headers=ann)).json()
        assert "64:ff9b::8.8.8.8" in chan["config"]["callback_url"]
        assert inside.requests == []


async def test_allowed_ranges_are_delivered_and_redirects_not_followed(
    make_settings: Any, llm: Any
) -> None:
    async with (
        Inside(redirect_to="http://169.254.169.254/latest/meta-data/") as redirector,
        Inside() as target,
    ):
        settings = _settings(make_settings, llm, outbound_allowed_cidrs=["127.0.0.0/8"])
        async with (
            ServedApp(settings) as app,
            httpx.AsyncClient(base_url=f"{app.url}/api/v1") as api,
        ):
            ann = await _user(api, "ann")
            direct = (await _hook_channel(api, ann, f"{target.url}/hook")).json()["data"]
            await _deliver(api, direct)
            await _until(lambda: _count(target))
            bounce = (await _hook_channel(api, ann, f"{redirector.url}/hook")).json()["data"]
            await _deliver(api, bounce)

            async def failed() -> Any:
                chan = (await api.get(f"/channels/{bounce['id']}", headers=ann)).json()
                return chan if chan["last_error"] else None

            chan = await _until(failed)
            assert "HTTP 302" in chan["last_error"]
            assert len(redirector.requests) == 1  # asked once, its Location never followed


async def _count(server: Inside) -> bool:
    return len(server.requests) >= 1
