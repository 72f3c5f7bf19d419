"""Channels over HTTP (the app with its in-process relay, real Postgres; the agent's model and
every platform played by loopback servers speaking their wire formats): CRUD and its errors,
secrets never shown, and for each type an inbound message answered by an agent task run as
the channel owner and delivered to the platform; duplicates and replays processed once;
verification failures are 401 and relay nothing; delivery retries and the error status."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.auth import Principal
from orchestrator.channels import (
    Channel,
    ChannelRelay,
    ChannelStore,
    EgressPolicy,
    InboundLimits,
    secret_box,
)
from orchestrator.db import connect
from orchestrator.errors import RateLimited
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BOT_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0"


class Callback(LoopbackServer):
    """A generic webhook's callback URL: records what it is sent; `fail` answers 503."""

    label = "callback"

    def __init__(self) -> None:
        super().__init__()
        self.fail = 0

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if self.fail:
            self.fail -= 1
            await self.send_body(send, 503, b"busy", [("content-type", "text/plain")])
            return
        await self.send_body(send, 200, b'{"ok": true}', [("content-type", "application/json")])


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as server:
        yield server


@pytest.fixture
async def callback() -> AsyncIterator[Callback]:
    async with Callback() as server:
        yield server


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def _until(check: Any, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def _settings(make_settings: Any, llm: OpenAIFake, **kw: Any) -> Any:
    # The fake platforms and callbacks listen on loopback, which deliveries may not reach
    # unless allowed (the SSRF guard).
    kw.setdefault("outbound_allowed_cidrs", ["127.0.0.0/8"])
    return agent_settings(make_settings, llm, channel_retry_base_s=0.1, **kw)


@pytest.fixture
async def api(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[httpx.AsyncClient]:
    async with ServedApp(_settings(make_settings, llm)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"type": "irc", "name": "x", "config": {}}, 422, "type"),
        (
            {"type": "slack", "name": "x", "config": {"webhook_url": "https://h/x"}},
            400,
            "signing_secret",
        ),
        ({"type": "slack", "name": "x", "config": {"signing_secret": "s"}}, 400, "webhook_url"),
        (
            {
                "type": "slack",
                "name": "x",
                "config": {"signing_secret": "s", "webhook_url": "ftp://x"},
            },
            400,
            "webhook_url",
        ),
        (
            {"type": "teams", "name": "x", "config": {"webhook_url": "https://h/x"}},
            400,
            "tenant_id",
        ),
        ({"type": "telegram", "name": "x", "config": {"bot_token": "nope"}}, 400, "bot_token"),
        (
            {"type": "telegram", "name": "x", "config": {"bot_token": BOT_TOKEN, "chat_ids": "1"}},
            400,
            "chat_ids",
        ),
        ({"type": "webhook", "name": "x", "config": {"colour": "red"}}, 400, "colour"),
        ({"type": "webhook", "name": "", "config": {}}, 400, "name"),
        ({"type": "webhook", "name": "x", "config": []}, 400, "config"),
        ({"type": "webhook", "name": "a\u0000b", "config": {}}, 400, "name"),
        (
            {"type": "webhook", "name": "x", "config": {"callback_url": "http://[::1"}},
            400,
            "callback_url",
        ),
        (
            {"type": "webhook", "name": "x", "config": {"callback_url": "http://h:99999/"}},
            400,
            "callback_url",
        ),
        (
            {
                "type": "slack",
                "name": "x",
                "config": {"signing_secret": "s", "bot_token": "xoxb-café"},
            },
            400,
            "bot_token",
        ),
        (
            {
                "type": "teams",
                "name": "x",
                "config": {"webhook_url": "https://h/x", "tenant_id": "t\u0000"},
            },
            400,
            "tenant_id",
        ),
    ],
)
async def test_create_errors(
    api: httpx.AsyncClient, body: dict[str, Any], status: int, field: str
) -> None:
    r = await api.post("/channels", headers=ADMIN, json=body)
    assert r.status_code == status, r.text
    assert field in r.json()["error"]


async def test_teams_with_the_spec_config_and_what_reads_show(
    api: httpx.AsyncClient,
) -> None:
    """Issue 33: a Teams channel made with the spec's config (`webhook_url`, `tenant_id`) is
    created; with no token audience its inbound activities are refused, said in `last_error`
    until `app_id` is set. Reads show non-secret config as set, secrets masked."""
    ann = await _user(api, "ann")
    hook = "https://teams.example.invalid/webhookb2/x"
    r = await api.post(
        "/channels",
        headers=ann,
        json={"type": "teams", "name": "t", "config": {"webhook_url": hook, "tenant_id": "t1"}},
    )
    assert r.status_code == 200, r.text
    made = r.json()["data"]
    assert made["config"] == {"webhook_url": hook, "tenant_id": "t1"}
    assert "app_id" in made["last_error"] and "teams_audience" in made["last_error"]
    cid, token = made["id"], made["webhook_token"]
    activity = {"type": "message", "text": "hi", "serviceUrl": "https://smba.example/"}
    r = await api.post(
        f"/channels/webhook/{token}", json=activity, headers={"Authorization": "Bearer x.y.z"}
    )
    assert r.status_code == 401, r.text
    shown = (await api.get(f"/channels/{cid}", headers=ann)).json()
    assert "refused" in shown["last_error"] and "app_id" in shown["last_error"]
    listed = (await api.get("/channels", headers=ann)).json()["data"]
    assert [c["config"] for c in listed] == [{"webhook_url": hook, "tenant_id": "t1"}]
    # An audience configured: the error goes.
    r = await api.put(f"/channels/{cid}", headers=ann, json={"config": {"app_id": "bot-1"}})
    assert r.status_code == 200 and r.json()["data"]["last_error"] is None, r.text
    # Slack and Telegram: secrets masked, the rest as set.
    r = await api.post(
        "/channels",
        headers=ann,
        json={
            "type": "slack",
            "name": "s",
            "config": {"signing_secret": "sig-1", "webhook_url": "https://hooks.example/s"},
        },
    )
    assert r.json()["data"]["config"] == {
        "signing_secret": "***",
        "webhook_url": "https://hooks.example/s",
    }


async def test_the_webhook_url_can_be_masked(make_settings: Any, llm: OpenAIFake) -> None:
    settings = _settings(make_settings, llm, channel_mask_webhook_url=True)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            hook = {"webhook_url": "https://teams.example.invalid/w", "tenant_id": "t1"}
            r = await api.post(
                "/channels", headers=ADMIN, json={"type": "teams", "name": "t", "config": hook}
            )
            assert r.json()["data"]["config"] == {"webhook_url": "***", "tenant_id": "t1"}
            cid = r.json()["data"]["id"]
            # "***" given back keeps it.
            r = await api.put(
                f"/channels/{cid}", headers=ADMIN, json={"config": {"webhook_url": "***"}}
            )
            assert r.status_code == 200, r.text
            got = (await api.get(f"/channels/{cid}", headers=ADMIN)).json()
            assert got["config"]["webhook_url"] == "***"


async def test_crud_tenancy_and_secrets(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    r = await api.post(
        "/channels",
        headers=ann,
        json={
            "type": "telegram",
            "name": "ops",
            "config": {"bot_token": BOT_TOKEN, "chat_ids": [42, "-100"], "secret_token": "s3cr3t"},
        },
    )
    assert r.status_code == 200, r.text
    made = r.json()["data"]
    token = made["webhook_token"]
    assert made["webhook_path"] == f"/api/v1/channels/webhook/{token}"
    assert made["status"] == "active" and made["user_uuid"] == "ann"
    assert made["config"] == {"bot_token": "***", "chat_ids": ["42", "-100"], "secret_token": "***"}
    cid = made["id"]
    listed = (await api.get("/channels", headers=ann)).json()
    assert listed["ok"] is True and [c["id"] for c in listed["data"]] == [cid]
    assert (await api.get("/channels", headers=bob)).json()["data"] == []
    assert cid in [c["id"] for c in (await api.get("/channels", headers=ADMIN)).json()["data"]]
    assert (await api.get(f"/channels/{cid}", headers=bob)).status_code == 404
    assert (await api.put(f"/channels/{cid}", headers=bob, json={"name": "x"})).status_code == 404
    assert (await api.delete(f"/channels/{cid}", headers=bob)).status_code == 404
    assert (await api.get("/channels/ch-999999", headers=ann)).status_code == 404
    assert (await api.get("/channels/nope", headers=ann)).status_code == 404  # any shape
    # Update: name, a config key, secrets kept with "***", status, token rotation.
    r = await api.put(
        f"/channels/{cid}",
        headers=ann,
        json={
            "name": "ops2",
            "config": {"chat_ids": ["7"], "bot_token": "***"},
            "status": "paused",
        },
    )
    body = r.json()
    assert body["data"]["name"] == "ops2" and body["data"]["status"] == "paused"
    assert body["data"]["config"]["chat_ids"] == ["7"] and body["webhook_token"] is None
    r = await api.put(f"/channels/{cid}", headers=ann, json={"status": "broken"})
    assert r.status_code == 400
    r = await api.put(f"/channels/{cid}", headers=ann, json={"config": {"bot_token": "bad"}})
    assert r.status_code == 400 and "bot_token" in r.json()["error"]
    r = await api.put(f"/channels/{cid}", headers=ann, json={"rotate_token": True})
    fresh = r.json()["webhook_token"]
    assert fresh and fresh != token
    old = await api.post(f"/channels/webhook/{token}", json={})
    assert old.status_code == 404  # the old token is retired
    # Secrets never appear in any answer.
    everything = json.dumps(
        [
            (await api.get("/channels", headers=ann)).json(),
            (await api.get(f"/channels/{cid}", headers=ann)).json(),
            (await api.get("/channels", headers=ADMIN)).json(),
        ]
    )
    assert BOT_TOKEN not in everything and "s3cr3t" not in everything
    r = await api.delete(f"/channels/{cid}", headers=ann)
    assert r.json() == {"ok": True, "deleted": cid}
    assert (await api.get(f"/channels/{cid}", headers=ann)).status_code == 404
    assert (await api.get("/channels")).status_code == 401


async def test_generic_webhook_relays_as_the_owner(
    api: httpx.AsyncClient, callback: Callback
) -> None:
    ann = await _user(api, "ann")
    made = (
        await api.post(
            "/channels",
            headers=ann,
            json={"type": "webhook", "name": "hook", "config": {"callback_url": callback.url}},
        )
    ).json()["data"]
    hook = f"/channels/webhook/{made['webhook_token']}"
    r = await api.post(
        hook, json={"text": "[answer hi there]", "user": "zed", "metadata": {"message_id": "m1"}}
    )
    assert r.status_code == 200 and r.json()["accepted"] is True
    await _until(lambda: _has(callback, 1))
    sent = callback.requests[0].json
    assert sent["text"] == "hi there"
    # The agent task ran as the channel owner: its events are Ann's, not Bob's.
    bob = await _user(api, "bob")

    async def owned(h: dict[str, str]) -> list[str]:
        r = await api.get("/events", headers=h, params={"types": "task.completed"})
        return [e["aggregate_id"] for e in r.json()["data"]]

    assert [t for t in await owned(ann) if t.startswith("chan-")] != []
    assert [t for t in await owned(bob) if t.startswith("chan-")] == []
    # The same delivery again: acknowledged, not relayed.
    r = await api.post(
        hook, json={"text": "[answer hi there]", "user": "zed", "metadata": {"message_id": "m1"}}
    )
    assert r.json()["duplicate"] is True
    # Synchronous mode answers in the response and sends nothing to the callback.
    r = await api.post(f"{hook}?sync=true", json={"text": "[answer right away]"})
    assert r.json()["answer"] == "right away"
    await asyncio.sleep(0.3)
    assert len(callback.requests) == 1
    # Bad bodies, unknown tokens.
    assert (await api.post(hook, json={"user": "zed"})).status_code == 400
    assert (await api.post(hook, content=b"not json")).status_code == 400
    assert (await api.post("/channels/webhook/chw_unknown-token", json={})).status_code == 404


async def test_delivery_retries_then_error_status(
    make_settings: Any, llm: OpenAIFake, callback: Callback
) -> None:
    settings = _settings(make_settings, llm, channel_delivery_attempts=4, channel_error_after=3)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            ann = await _user(api, "ann")
            made = (
                await api.post(
                    "/channels",
                    headers=ann,
                    json={"type": "webhook", "name": "h", "config": {"callback_url": callback.url}},
                )
            ).json()["data"]
            hook = f"/channels/webhook/{made['webhook_token']}"
            callback.fail = 2  # two 503s, then it works
            await api.post(hook, json={"text": "[answer eventually]"})
            await _until(lambda: _has(callback, 3))
            assert callback.requests[-1].json["text"] == "eventually"

            async def recovered() -> bool:  # the callback answered before the relay recorded it
                chan = (await api.get(f"/channels/{made['id']}", headers=ann)).json()
                return bool(chan["status"] == "active" and chan["failures"] == 0)

            await _until(recovered)
            callback.fail = 100  # now it keeps failing: error after 3, given up after 4
            await api.post(hook, json={"text": "[answer lost]"})
            await _until(lambda: _has(callback, 7))

            async def errored() -> bool:
                c = (await api.get(f"/channels/{made['id']}", headers=ann)).json()
                return bool(c["status"] == "error" and "503" in (c["last_error"] or ""))

            await _until(errored)
            await asyncio.sleep(1.0)
            assert len(callback.requests) == 7  # 3 + 4 attempts, no more


async def _has(server: LoopbackServer, n: int) -> bool:
    return len(server.requests) >= n


async def test_a_poisoned_item_backs_off_instead_of_spinning(
    make_settings: Any, llm: OpenAIFake, callback: Callback
) -> None:
    """An item whose processing raises (here: the channel's secrets cannot be decrypted) is
    retried with backoff and given up, and counted against the channel: never a hot loop."""
    settings = _settings(make_settings, llm, channel_delivery_attempts=3, channel_error_after=2)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            ann = await _user(api, "ann")
            made = (
                await api.post(
                    "/channels",
                    headers=ann,
                    json={"type": "webhook", "name": "h", "config": {"callback_url": callback.url}},
                )
            ).json()["data"]
            db = await asyncpg.connect(settings.database_url)
            try:
                await db.execute(
                    "UPDATE channels SET secrets = 'garbage'::bytea WHERE id = $1", made["id"]
                )
                # A message already in the inbox (as if received before the key changed).
                await db.execute(
                    "INSERT INTO channel_inbox (channel_id, conversation, text, reply,"
                    " next_attempt_at, created_at, updated_at) VALUES ($1, 'c', 'hi', '{}',"
                    " 0, 0, 0)",
                    made["id"],
                )

                async def given_up() -> bool:
                    row = await db.fetchrow("SELECT state, attempts FROM channel_inbox")
                    return row is not None and row["state"] == "failed"

                await _until(given_up, within=20)  # the relay polls every 5 s at most
                row = await db.fetchrow("SELECT state, attempts, error FROM channel_inbox")
                assert row["attempts"] == 3, dict(row)  # channel_delivery_attempts, no more
                status = await db.fetchval("SELECT status FROM channels WHERE id = $1", made["id"])
                assert status == "error"
                assert callback.requests == []
            finally:
                await db.close()


class _CountingAgent:
    """Agent work that takes a moment and counts how often it ran."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def run(self, task: AgentTask) -> TaskResult:
        self.runs.append(task.task_id)
        await asyncio.sleep(0.3)
        return TaskResult(task.task_id, "completed", "the answer", None, 300, "test")


async def test_two_relays_never_answer_one_message_twice(
    make_settings: Any, callback: Callback, tmp_path: Any
) -> None:
    settings = make_settings(outbound_allowed_cidrs=["127.0.0.0/8"])
    db = await connect(settings.database_url)
    agent = _CountingAgent()
    try:
        store = ChannelStore(
            db.pool, secret_box(None, tmp_path), egress=EgressPolicy(["127.0.0.0/8"])
        )
        channel, _ = await store.create(
            Principal("ann"), "webhook", "w", {"callback_url": callback.url}
        )
        inbox_id = await store.enqueue(
            channel.id,
            delivery_id="d1",
            conversation="c",
            text="hi",
            sender=None,
            reply={"conversation": "c"},
        )
        assert inbox_id is not None
        async with httpx.AsyncClient() as http:
            one = ChannelRelay(store, agent, settings, http, name="hub-a")
            two = ChannelRelay(store, agent, settings, http, name="hub-b")
            await asyncio.gather(one.answer(inbox_id, 10), two.answer(inbox_id, 10))
            await _until(lambda: _has(callback, 1))
            await asyncio.sleep(0.5)
            assert agent.runs == [f"chan-{inbox_id}"]
            assert len(callback.requests) == 1
            item = await store.item(inbox_id)
            assert item is not None and item.state == "done"
    finally:
        await db.close()


async def _fresh_window(need_s: float = 20.0) -> None:
    """The limits count per wall-clock minute: start a burst with `need_s` left in the
    current one, so a new window cannot open in the middle of it (and admit more)."""
    left = 60 - time.time() % 60
    if left < need_s:
        await asyncio.sleep(left + 0.05)


async def test_inbound_messages_are_limited_per_channel_and_per_owner(
    make_settings: Any, llm: OpenAIFake, callback: Callback
) -> None:
    """Issue 29 item 7: a tenant's own webhook took 700 messages in 3 s, each an agent task.
    Past its channel's budget, and then its owner's over all their channels, a message is a
    429 with Retry-After naming the limit, and is neither written nor run; another owner's
    channel is not affected."""
    settings = _settings(
        make_settings,
        llm,
        channel_inbound_per_minute=5,
        channel_inbound_per_owner_per_minute=8,
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            ann, bob = await _user(api, "ann"), await _user(api, "bob")

            async def hook(h: dict[str, str]) -> str:
                made = await api.post(
                    "/channels",
                    headers=h,
                    json={"type": "webhook", "name": "h", "config": {"callback_url": callback.url}},
                )
                return f"/channels/webhook/{made.json()['data']['webhook_token']}"

            first, second, bobs = await hook(ann), await hook(ann), await hook(bob)

            async def burst(path: str, n: int, tag: str) -> list[httpx.Response]:
                return list(
                    await asyncio.gather(
                        *(
                            api.post(
                                path,
                                json={
                                    "text": f"[answer {tag}{i}]",
                                    "metadata": {"message_id": f"{tag}{i}"},
                                },
                            )
                            for i in range(n)
                        )
                    )
                )

            await _fresh_window()
            one = await burst(first, 8, "a")
            two = await burst(second, 5, "b")
            other = await burst(bobs, 1, "c")

            def split(rs: list[httpx.Response]) -> tuple[int, list[httpx.Response]]:
                ok = [r for r in rs if r.status_code == 200 and r.json()["accepted"] is True]
                return len(ok), [r for r in rs if r.status_code != 200]

            accepted, refused = split(one)
            assert accepted == 5 and len(refused) == 3, [r.text for r in one]
            for r in refused:
                assert r.status_code == 429
                assert 1 <= int(r.headers["Retry-After"]) <= 61
                body = r.json()
                assert body["code"] == "rate_limited"
                assert body["limit"] == "channel_inbound_per_minute"
            accepted, refused = split(two)  # the owner had 8: 5 spent on the first channel
            assert accepted == 3 and len(refused) == 2, [r.text for r in two]
            assert {r.json()["limit"] for r in refused} == {"channel_inbound_per_owner_per_minute"}
            assert split(other) == (1, [])

            # A platform re-delivering a message it sent (Slack, Telegram retry) spends no
            # budget: bob's channel, 1 of 5 spent, takes 6 re-deliveries and then 4 new ones.
            again = {"text": "[answer c0]", "metadata": {"message_id": "c0"}}
            for _ in range(6):
                r = await api.post(bobs, json=again)
                assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
            assert split(await burst(bobs, 4, "d")) == (4, [])
            r = await api.post(bobs, json={"text": "x", "metadata": {"message_id": "e0"}})
            assert r.status_code == 429 and r.json()["limit"] == "channel_inbound_per_minute"

            # Only what was admitted is in the inbox, and only that runs agent tasks.
            db = await asyncpg.connect(settings.database_url)
            try:
                assert await db.fetchval("SELECT count(*) FROM channel_inbox") == 13
            finally:
                await db.close()
            await _until(lambda: _has(callback, 13))
            answered = sorted(r.json["text"][0] for r in callback.requests)
            assert answered == ["a"] * 5 + ["b"] * 3 + ["c"] + ["d"] * 4
            assert len(llm.chat_requests) == 13


async def test_a_message_the_owners_limit_refuses_costs_its_channel_nothing(
    make_settings: Any,
) -> None:
    """The channel is counted first (a busy channel must not spend its owner's other
    channels); when the owner's limit then refuses, the channel's count is given back.
    Real Redis; owners told apart by the channel's `user_uuid`."""
    settings = make_settings(channel_inbound_per_minute=2, channel_inbound_per_owner_per_minute=1)
    client = aioredis.from_url(settings.redis_url)
    limits = InboundLimits(client, settings)

    def of(owner: str) -> Channel:
        return Channel(
            id="ch-1",
            user_uuid=owner,
            type="webhook",
            name="h",
            config={},
            secrets={},
            status="active",
            failures=0,
            last_error=None,
            created_at=0,
            updated_at=0,
        )

    try:
        await _fresh_window(5)
        await limits.admit(of("ann"))
        with pytest.raises(RateLimited) as refused:
            await limits.admit(of("ann"))  # the owner's one is spent
        assert refused.value.extra["limit"] == "channel_inbound_per_owner_per_minute"
        await limits.admit(of("bob"))  # the channel's second: the refused one cost nothing
        with pytest.raises(RateLimited) as refused:
            await limits.admit(of("cid"))
        assert refused.value.extra["limit"] == "channel_inbound_per_minute"
    finally:
        await client.aclose()
