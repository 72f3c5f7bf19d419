"""Each channel type end to end over HTTP (the app with its in-process relay, real Postgres),
the platforms played by loopback servers speaking their wire formats: a verified inbound
message is answered by an agent task run as the channel owner and delivered back; replays,
platform retries and duplicates are processed once; failed verification is 401 and relays
nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes import slack_server as slack
from tests.fakes import teams_server as teams
from tests.fakes import telegram_server as telegram
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_channels_api import _settings, _until, _user, llm  # noqa: F401

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TG_SECRET = "tg-secret_123"


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[Any, Any, Any]]:
    async with slack.SlackFake() as s, teams.TeamsFake() as t, telegram.TelegramFake() as g:
        yield s, t, g


@pytest.fixture
async def api(
    make_settings: Any,
    llm: OpenAIFake,  # noqa: F811 - the fixture imported above
    fakes: tuple[Any, Any, Any],
) -> AsyncIterator[httpx.AsyncClient]:
    s, t, g = fakes
    settings = _settings(
        make_settings,
        llm,
        teams_jwks_url=t.jwks_url,
        teams_audience=t.app_id,
        channel_api_base_urls={"telegram": g.url, "slack": s.api_url},
        trusted_proxies=["127.0.0.1/32"],  # the test client plays the load balancer
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def _channel(c: httpx.AsyncClient, h: dict[str, str], kind: str, config: Any) -> Any:
    r = await c.post("/channels", headers=h, json={"type": kind, "name": kind, "config": config})
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def _task_owner(c: httpx.AsyncClient, users: dict[str, dict[str, str]]) -> set[str]:
    """Who sees chan-* task events: the tenants whose task it was."""
    out = set()
    for name, h in users.items():
        r = await c.get("/events", headers=h, params={"types": "task.completed"})
        if any(e["aggregate_id"].startswith("chan-") for e in r.json()["data"]):
            out.add(name)
    return out


async def test_slack(api: httpx.AsyncClient, fakes: tuple[Any, Any, Any]) -> None:
    s, _, _ = fakes
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    made = await _channel(
        api, ann, "slack", {"signing_secret": SIGNING_SECRET, "webhook_url": s.webhook_url}
    )
    hook = f"/channels/webhook/{made['webhook_token']}"
    # url_verification: answered with the challenge.
    body = json.dumps(slack.url_verification("abc123")).encode()
    r = await api.post(hook, content=body, headers=slack.sign(SIGNING_SECRET, body))
    assert r.status_code == 200 and r.text == "abc123"
    # A message: relayed, answered, delivered to the incoming webhook.
    event = slack.message_event("[answer hello from the agent]", event_id="Ev0001")
    body = json.dumps(event).encode()
    r = await api.post(hook, content=body, headers=slack.sign(SIGNING_SECRET, body))
    assert r.status_code == 200 and r.json()["accepted"] is True
    await _until(lambda: _count(s.posted, 1))
    assert s.posted[0]["text"] == "hello from the agent"
    # Slack's retry of the same event (X-Slack-Retry-Num): acknowledged, not relayed again.
    r = await api.post(hook, content=body, headers=slack.sign(SIGNING_SECRET, body, retry_num=1))
    assert r.json()["duplicate"] is True
    # Bad signature, tampered body, replayed (stale) timestamp: 401, nothing relayed.
    old = int(time.time()) - 6 * 60
    for headers, sent in (
        (slack.sign("wrong-secret", body), body),
        (slack.sign(SIGNING_SECRET, body), body + b" "),
        (slack.sign(SIGNING_SECRET, body, old), body),
        ({"Content-Type": "application/json"}, body),
    ):
        r = await api.post(hook, content=sent, headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["code"] == "unauthorized"
    # The bot's own messages are ignored.
    bot = json.dumps(slack.bot_message_event("I said this")).encode()
    r = await api.post(hook, content=bot, headers=slack.sign(SIGNING_SECRET, bot))
    assert r.json()["accepted"] is False
    await _until(lambda: _quiet())
    assert len(s.posted) == 1
    assert await _task_owner(api, {"ann": ann, "bob": bob}) == {"ann"}


async def test_telegram(api: httpx.AsyncClient, fakes: tuple[Any, Any, Any]) -> None:
    _, _, g = fakes
    ann = await _user(api, "ann")
    made = await _channel(
        api,
        ann,
        "telegram",
        {"bot_token": g.bot_token, "chat_ids": ["1111111"], "secret_token": TG_SECRET},
    )
    hook = f"/channels/webhook/{made['webhook_token']}"
    from_telegram = {
        "X-Forwarded-For": "149.154.167.220",
        "X-Telegram-Bot-Api-Secret-Token": TG_SECRET,
    }
    update = telegram.text_update("[answer pong]", update_id=500)
    r = await api.post(hook, json=update, headers=from_telegram)
    assert r.status_code == 200 and r.json()["accepted"] is True, r.text
    await _until(lambda: _count(g.sent, 1))
    assert g.sent[0]["text"] == "pong" and str(g.sent[0]["chat_id"]) == "1111111"
    # The same update again (Telegram redelivers until it gets a 200): once.
    r = await api.post(hook, json=update, headers=from_telegram)
    assert r.json()["duplicate"] is True
    # Outside Telegram's ranges, or without the secret token: 401.
    r = await api.post(
        hook,
        json=telegram.text_update("[answer no]"),
        headers={**from_telegram, "X-Forwarded-For": "8.8.8.8"},
    )
    assert r.status_code == 401
    r = await api.post(
        hook,
        json=telegram.text_update("[answer no]"),
        headers={"X-Forwarded-For": "149.154.167.220"},
    )
    assert r.status_code == 401
    # A chat not in chat_ids: acknowledged (so Telegram stops), not relayed.
    r = await api.post(
        hook, json=telegram.text_update("[answer no]", chat_id=999), headers=from_telegram
    )
    assert r.status_code == 200 and r.json()["accepted"] is False
    await _until(lambda: _quiet())
    assert len(g.sent) == 1


async def test_teams(api: httpx.AsyncClient, fakes: tuple[Any, Any, Any]) -> None:
    _, t, _ = fakes
    # A key Microsoft endorses for another channel only (published before the first fetch).
    t.keys["webchat-key"] = teams.rsa_key()
    t.endorsements["webchat-key"] = ["webchat"]
    ann = await _user(api, "ann")
    made = await _channel(
        api, ann, "teams", {"webhook_url": t.webhook_url, "tenant_id": teams.TENANT}
    )
    hook = f"/channels/webhook/{made['webhook_token']}"
    activity = teams.message_activity("[answer hi teams]", activity_id="act-1")
    token = t.mint({"serviceurl": activity["serviceUrl"]})
    r = await api.post(hook, json=activity, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json()["accepted"] is True, r.text
    await _until(lambda: _count(t.posted, 1))
    assert "hi teams" in json.dumps(t.posted[0])
    r = await api.post(hook, json=activity, headers={"Authorization": f"Bearer {token}"})
    assert r.json()["duplicate"] is True
    other = teams.message_activity("[answer no]")
    for bad in (
        t.mint({"aud": "someone-else", "serviceurl": other["serviceUrl"]}),
        t.mint({"iss": "https://evil.example", "serviceurl": other["serviceUrl"]}),
        t.mint({"serviceurl": other["serviceUrl"]}, lifetime_s=-600),
        t.mint({"serviceurl": other["serviceUrl"]}, key=teams.rsa_key()),
        t.mint({"serviceurl": "https://elsewhere.example/"}),
        t.mint({"serviceurl": other["serviceUrl"]}, kid="webchat-key"),  # not for msteams
    ):
        r = await api.post(hook, json=other, headers={"Authorization": f"Bearer {bad}"})
        assert r.status_code == 401, r.text
    webchat = t.mint({"serviceurl": other["serviceUrl"]}, kid="webchat-key")
    r = await api.post(hook, json=other, headers={"Authorization": f"Bearer {webchat}"})
    assert "not endorsed" in r.json()["error"]
    # A valid token, but the activity names no channel: no endorsement to check.
    unnamed = {k: v for k, v in other.items() if k != "channelId"}
    token = t.mint({"serviceurl": other["serviceUrl"]})
    r = await api.post(hook, json=unnamed, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and "channelId" in r.json()["error"]
    r = await api.post(hook, json=other)
    assert r.status_code == 401
    # A valid token for an activity of another tenant than the channel's: refused.
    foreign = teams.message_activity("[answer no]", tenant="00000000-0000-0000-0000-000000000bad")
    token = t.mint({"serviceurl": foreign["serviceUrl"]})
    r = await api.post(hook, json=foreign, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and "tenant" in r.json()["error"]
    await _until(lambda: _quiet())
    assert len(t.posted) == 1


async def test_teams_audience_set_later_clears_the_refusal(
    make_settings: Any,
    llm: OpenAIFake,  # noqa: F811 - the fixture imported above
    fakes: tuple[Any, Any, Any],
) -> None:
    """Issue 33: a Teams channel made while the service had no token audience says in
    `last_error` that its inbound is refused; once the operator sets `teams_audience` (a
    restart), the first verified activity clears that error (no PUT needed)."""
    _, t, _ = fakes
    first = _settings(make_settings, llm, teams_jwks_url=t.jwks_url)
    async with ServedApp(first) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            made = await _channel(
                c, ann, "teams", {"webhook_url": t.webhook_url, "tenant_id": teams.TENANT}
            )
            assert "refused" in made["last_error"], made
    again = _settings(make_settings, llm, teams_jwks_url=t.jwks_url, teams_audience=t.app_id)
    async with ServedApp(again) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            shown = (await c.get(f"/channels/{made['id']}", headers=ann)).json()
            assert "refused" in shown["last_error"], shown  # nothing verified yet
            activity = teams.message_activity("[answer later]", activity_id="act-later")
            token = t.mint({"serviceurl": activity["serviceUrl"]})
            r = await c.post(
                f"/channels/webhook/{made['webhook_token']}",
                json=activity,
                headers={"Authorization": f"Bearer {token}"},
            )
            assert r.status_code == 200 and r.json()["accepted"] is True, r.text
            shown = (await c.get(f"/channels/{made['id']}", headers=ann)).json()
            assert shown["last_error"] is None, shown
            await _until(lambda: _count(t.posted, 1))


async def _count(items: list[Any], n: int) -> bool:
    return len(items) >= n


async def _quiet() -> bool:
    """A moment for anything wrongly relayed to show up."""
    await asyncio.sleep(0.5)
    return True
