"""Deciding interventions from chat platforms (issue 32), end to end over HTTP: the app with
its in-process poster and receiver, real Postgres, each platform played by a loopback fake
speaking its wire format. A workflow here is created by the store and its first step's
attempt is running, driven by the test (which holds its claim), as when the agent runner
parks a tool call: the intervention is created with `create_in` in an event transaction,
naming the channel to notify.

Per platform: the documented question with buttons is posted; a signed press by a listed
approver decides (status, decided_by, via, the audit event); a wrong signature is a 401 and
changes nothing; an unlisted platform user is told no and nothing changes; a replayed press
decides nothing twice; the question is updated with the outcome. The generic webhook: signed
links, GET only confirms, POST decides, a second use is a 409, a tampered link a 401."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from orchestrator.auth import Principal
from orchestrator.db import Database, connect
from orchestrator.events import EventQuery, EventStore
from orchestrator.interventions import Intervention, InterventionStore
from orchestrator.runtime.claims import ClaimStore
from orchestrator.workflows import WorkflowSpec, WorkflowStore
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes import slack_server as slack
from tests.fakes import teams_server as teams
from tests.fakes import telegram_server as telegram
from tests.fakes.webhook_server import CallbackFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TG_SECRET = "tg-secret_123"
PUBLIC = "https://orch.example.com"
APPROVER = "U0APPROVER"


@dataclass
class Parts:
    db: Database
    events: EventStore
    workflows: WorkflowStore
    store: InterventionStore
    claims: ClaimStore


@dataclass
class Fakes:
    slack: slack.SlackFake
    teams: teams.TeamsFake
    telegram: telegram.TelegramFake
    hook: CallbackFake


@pytest.fixture
async def fakes() -> AsyncIterator[Fakes]:
    async with (
        slack.SlackFake() as s,
        teams.TeamsFake() as t,
        telegram.TelegramFake() as g,
        CallbackFake() as h,
    ):
        yield Fakes(s, t, g, h)


@pytest.fixture
async def parts(make_settings: Any) -> AsyncIterator[Parts]:
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    events = EventStore(db.pool)
    try:
        yield Parts(
            db,
            events,
            WorkflowStore(db.pool, events),
            InterventionStore(db.pool, events),
            ClaimStore(db.pool, ttl_ms=3_600_000),
        )
    finally:
        await db.close()


@dataclass
class Api:
    client: httpx.AsyncClient
    url: str


@pytest.fixture
async def api(make_settings: Any, fakes: Fakes, parts: Parts) -> AsyncIterator[Api]:
    settings = make_settings(
        rate_limit_per_minute=0,
        outbound_allowed_cidrs=["127.0.0.0/8"],  # the fakes listen on loopback
        channel_retry_base_s=0.1,
        teams_jwks_url=fakes.teams.jwks_url,
        teams_audience=fakes.teams.app_id,
        channel_api_base_urls={
            "slack": fakes.slack.api_url,
            "telegram": fakes.telegram.url,
            "teams_login": fakes.teams.login_url,
        },
        trusted_proxies=["127.0.0.1/32"],  # the test client plays Telegram's load balancer
        public_url=PUBLIC,
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield Api(client, served.url)


async def until(check: Callable[[], Awaitable[Any] | Any], within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return found
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


async def user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def channel(c: httpx.AsyncClient, h: dict[str, str], kind: str, config: Any) -> Any:
    r = await c.post("/channels", headers=h, json={"type": kind, "name": kind, "config": config})
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def pending(parts: Parts, owner: str, channel_id: str) -> Intervention:
    """A running step attempt that asks, notifying `channel_id` (what the runner does)."""
    spec = WorkflowSpec.parse("pay", [{"name": "a", "prompt": "pay"}, {"name": "b", "prompt": "x"}])
    workflow_id = await parts.workflows.create(spec, owner)
    fence = await parts.claims.acquire("workflow", workflow_id, "test-driver")
    assert fence is not None
    await parts.workflows.mark_started(workflow_id, fence)
    _, key = await parts.workflows.start_step(workflow_id, 0, fence=fence)
    async with parts.events.transaction() as tx:
        return await parts.store.create_in(
            tx,
            task_id=key,
            workflow_id=workflow_id,
            step="a",
            user_uuid=owner,
            kind="tool",
            tool="http__pay",
            arguments={"amount": 5, "api_key": "sk-live-0123456789"},
            question="Pay 5 EUR to ACME?",
            notify_channel=channel_id,
        )


async def audit(parts: Parts, iv: Intervention) -> list[Any]:
    found, _ = await parts.events.query(
        EventQuery(aggregate=iv.task_id, limit=100), Principal("test", is_admin=True)
    )
    return [
        e for e in found if e.type in ("audit.intervention_approved", "audit.intervention_rejected")
    ]


async def post_state(parts: Parts, iv: Intervention, kind: str) -> str | None:
    state: str | None = await parts.db.pool.fetchval(
        "SELECT state FROM intervention_posts WHERE intervention_id = $1 AND kind = $2", iv.id, kind
    )
    return state


async def still_pending(parts: Parts, iv: Intervention) -> None:
    now = await parts.store.load(iv.id)
    assert now is not None and now.status == "pending" and now.decided_by is None


# --- Slack ----------------------------------------------------------------------------------


async def test_slack_buttons(api: Api, parts: Parts, fakes: Fakes) -> None:
    s = fakes.slack
    ann = await user(api.client, "ann")
    made = await channel(
        api.client,
        ann,
        "slack",
        {
            "signing_secret": SIGNING_SECRET,
            "bot_token": s.bot_token,
            "notify_channel": "C0OPS00001",
            "approvers": [APPROVER],
        },
    )
    assert made["config"]["approvers"] == [APPROVER]
    hook = f"/channels/webhook/{made['webhook_token']}"
    iv = await pending(parts, "ann", made["id"])

    # The question: chat.postMessage with the bot token, text and blocks ending in buttons.
    await until(lambda: s.posted)
    ask = s.posted[0]
    assert ask["channel"] == "C0OPS00001" and "Pay 5 EUR to ACME?" in ask["text"]
    asked = next(r for r in s.requests if r.path == "/api/chat.postMessage")
    assert asked.headers["authorization"] == f"Bearer {s.bot_token}"
    assert asked.headers["content-type"].startswith("application/json")
    actions = ask["blocks"][-1]
    assert actions["type"] == "actions" and actions["block_id"] == iv.id
    assert [(e["action_id"], e["style"], e["value"]) for e in actions["elements"]] == [
        ("approve", "primary", iv.id),
        ("reject", "danger", iv.id),
    ]
    assert "sk-live" not in json.dumps(ask)  # the arguments shown are masked
    await until(lambda: post_state(parts, iv, "ask"))
    # Recorded as sent once Slack answered (the fake's copy arrives first).
    await until(lambda: _equals(post_state(parts, iv, "ask"), "sent"))

    # An unlisted user: told so, ephemerally, through the response_url; nothing written.
    press = slack.block_actions("approve", iv.id, user="U0STRANGER", response_url=s.response_url())
    body = slack.interaction_body(press)
    r = await api.client.post(hook, content=body, headers=slack.sign_form(SIGNING_SECRET, body))
    assert r.status_code == 200 and r.content == b""
    await until(lambda: s.responses)
    assert s.responses[0]["response_type"] == "ephemeral"
    assert s.responses[0]["replace_original"] is False
    assert "not an approver" in s.responses[0]["text"]
    await still_pending(parts, iv)

    # A wrong signature, a stale timestamp: 401, nothing decided.
    press = slack.block_actions("approve", iv.id, user=APPROVER, response_url=s.response_url(2))
    body = slack.interaction_body(press)
    for headers in (
        slack.sign_form("wrong-secret", body),
        slack.sign_form(SIGNING_SECRET, body, int(time.time()) - 6 * 60),
    ):
        r = await api.client.post(hook, content=body, headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    await still_pending(parts, iv)

    # The approver's press decides.
    r = await api.client.post(hook, content=body, headers=slack.sign_form(SIGNING_SECRET, body))
    assert r.status_code == 200
    decided = await parts.store.load(iv.id)
    assert decided is not None and decided.status == "approved" and decided.via == "slack"
    assert decided.decided_by == {
        "platform": "slack",
        "platform_user": APPROVER,
        "channel_id": made["id"],
    }
    # Slack redelivers the same press (same action_ts): nothing decided twice.
    r = await api.client.post(hook, content=body, headers=slack.sign_form(SIGNING_SECRET, body))
    assert r.status_code == 200
    assert await parts.store.load(iv.id) == decided
    events = await audit(parts, iv)
    assert [(e.type, e.data["decided_by"], e.data["via"]) for e in events] == [
        ("audit.intervention_approved", f"slack:{APPROVER}", "slack")
    ]

    # The question is updated in place: chat.update of its channel and ts, buttons gone.
    await until(lambda: s.updated)
    update = s.updated[0]
    ref = await parts.db.pool.fetchval(
        "SELECT ref FROM intervention_posts WHERE intervention_id = $1 AND kind = 'ask'", iv.id
    )
    assert json.loads(ref) == {"channel": "C0OPS00001", "ts": update["ts"]}
    assert update["channel"] == "C0OPS00001"
    assert all(b["type"] != "actions" for b in update["blocks"])
    assert f"Approved by slack:{APPROVER}" in json.dumps(update["blocks"])
    await until(lambda: post_state(parts, iv, "outcome"))
    await until(lambda: _equals(post_state(parts, iv, "outcome"), "sent"))


async def _equals(value: Awaitable[Any], expected: Any) -> bool:
    return bool((await value) == expected)


async def test_a_press_on_another_channel_or_an_unknown_intervention_decides_nothing(
    api: Api, parts: Parts, fakes: Fakes
) -> None:
    s = fakes.slack
    ann = await user(api.client, "ann")
    config = {"signing_secret": SIGNING_SECRET, "bot_token": s.bot_token, "approvers": [APPROVER]}
    one = await channel(api.client, ann, "slack", {**config, "notify_channel": "C1"})
    other = await channel(api.client, ann, "slack", config)
    iv = await pending(parts, "ann", one["id"])
    for hook, value in ((other["webhook_token"], iv.id), (one["webhook_token"], "iv-999999")):
        press = slack.block_actions("approve", value, user=APPROVER, response_url=s.response_url())
        body = slack.interaction_body(press)
        r = await api.client.post(
            f"/channels/webhook/{hook}", content=body, headers=slack.sign_form(SIGNING_SECRET, body)
        )
        assert r.status_code == 200
    await until(lambda: len(s.responses) == 2)
    assert "not decided on this channel" in s.responses[0]["text"]
    assert "no longer exists" in s.responses[1]["text"]
    await still_pending(parts, iv)


# --- Telegram -------------------------------------------------------------------------------


async def test_telegram_buttons(api: Api, parts: Parts, fakes: Fakes) -> None:
    g = fakes.telegram
    ann = await user(api.client, "ann")
    made = await channel(
        api.client,
        ann,
        "telegram",
        {
            "bot_token": g.bot_token,
            "secret_token": TG_SECRET,
            "notify_chat_id": -1001234567890,
            "approvers": [4242],
        },
    )
    assert made["config"]["approvers"] == ["4242"]
    assert made["config"]["notify_chat_id"] == "-1001234567890"
    hook = f"/channels/webhook/{made['webhook_token']}"
    from_telegram = {
        "X-Forwarded-For": "149.154.167.220",
        "X-Telegram-Bot-Api-Secret-Token": TG_SECRET,
    }
    iv = await pending(parts, "ann", made["id"])
    number = iv.id[3:]

    await until(lambda: g.sent)
    ask = g.sent[0]
    assert str(ask["chat_id"]) == "-1001234567890" and "Pay 5 EUR to ACME?" in ask["text"]
    keyboard = ask["reply_markup"]["inline_keyboard"]
    assert keyboard == [
        [
            {"text": "Approve", "callback_data": f"iv:{number}:a"},
            {"text": "Reject", "callback_data": f"iv:{number}:r"},
        ]
    ]
    await until(lambda: _equals(post_state(parts, iv, "ask"), "sent"))
    message_id = await parts.db.pool.fetchval(
        "SELECT ref->>'message_id' FROM intervention_posts WHERE intervention_id = $1", iv.id
    )

    # An unlisted user: an alert, nothing decided.
    stranger = telegram.callback_update(f"iv:{number}:a", user_id=999, message_id=int(message_id))
    r = await api.client.post(hook, json=stranger, headers=from_telegram)
    assert r.status_code == 200
    answer = r.json()
    assert answer["method"] == "answerCallbackQuery" and answer["show_alert"] is True
    assert answer["callback_query_id"] == stranger["callback_query"]["id"]
    assert "not an approver" in answer["text"]
    await still_pending(parts, iv)

    # Without the secret token, or from outside Telegram's ranges: 401.
    press = telegram.callback_update(f"iv:{number}:r", user_id=4242, message_id=int(message_id))
    for headers in (
        {**from_telegram, "X-Telegram-Bot-Api-Secret-Token": "wrong"},
        {**from_telegram, "X-Forwarded-For": "8.8.8.8"},
    ):
        r = await api.client.post(hook, json=press, headers=headers)
        assert r.status_code == 401
    await still_pending(parts, iv)

    r = await api.client.post(hook, json=press, headers=from_telegram)
    assert r.status_code == 200 and r.json()["show_alert"] is False
    assert r.json()["text"].startswith("Rejected")
    decided = await parts.store.load(iv.id)
    assert decided is not None and decided.status == "rejected" and decided.via == "telegram"
    assert decided.decided_by == {
        "platform": "telegram",
        "platform_user": "4242",
        "channel_id": made["id"],
    }
    # Telegram redelivers the update: answered, nothing decided twice.
    r = await api.client.post(hook, json=press, headers=from_telegram)
    assert r.json()["show_alert"] is False and "Already rejected" in r.json()["text"]
    assert await parts.store.load(iv.id) == decided
    assert [e.data["decided_by"] for e in await audit(parts, iv)] == ["telegram:4242"]

    # The message edited: the outcome, the keyboard emptied.
    await until(lambda: g.edited)
    edit = g.edited[0]
    assert str(edit["chat_id"]) == "-1001234567890" and edit["message_id"] == int(message_id)
    assert edit["reply_markup"] == {"inline_keyboard": []}
    assert "Rejected by telegram:4242" in edit["text"]


# --- Teams ----------------------------------------------------------------------------------


async def test_teams_cards(api: Api, parts: Parts, fakes: Fakes) -> None:
    t = fakes.teams
    ann = await user(api.client, "ann")
    conversation = "19:ops0channel0id@thread.tacv2"
    made = await channel(
        api.client,
        ann,
        "teams",
        {
            "webhook_url": t.webhook_url,
            "tenant_id": teams.TENANT,
            "app_id": t.app_id,
            "app_password": t.app_password,
            "service_url": t.url,
            "notify_conversation_id": conversation,
            "approvers": [teams.AAD_USER],
        },
    )
    assert made["config"]["app_password"] == "***"
    got = await api.client.get(f"/channels/{made['id']}", headers=ann)
    assert t.app_password not in got.text
    hook = f"/channels/webhook/{made['webhook_token']}"
    iv = await pending(parts, "ann", made["id"])

    # The card, posted through the Bot Connector with a client-credentials token.
    await until(lambda: t.activities)
    where, activity = t.activities[0]
    assert where == conversation and t.tokens_issued == 1
    attachment = activity["attachments"][0]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert [(a["type"], a["title"], a["data"]) for a in card["actions"]] == [
        ("Action.Submit", "Approve", {"intervention_id": iv.id, "decision": "approve"}),
        ("Action.Submit", "Reject", {"intervention_id": iv.id, "decision": "reject"}),
    ]
    await until(lambda: _equals(post_state(parts, iv, "ask"), "sent"))

    def signed(activity: Any, token: str | None = None) -> dict[str, Any]:
        return {
            "content": json.dumps(activity).encode(),
            "headers": {
                "Authorization": f"Bearer {token or t.mint()}",
                "Content-Type": "application/json",
            },
        }

    # An unlisted user's invoke: answered no, nothing decided.
    data = {"intervention_id": iv.id, "decision": "approve"}
    r = await api.client.post(hook, **signed(teams.invoke_activity(data, aad_object_id="other")))
    assert r.status_code == 200
    assert r.json()["statusCode"] == 200 and "not an approver" in r.json()["value"]
    # Their card submit (a message activity, no answer of its own): the bot says so.
    refused = teams.submit_activity(data, aad_object_id="other")
    r = await api.client.post(hook, **signed(refused))
    assert r.status_code == 200 and r.json()["accepted"] is False
    await until(lambda: len(t.activities) == 2)
    assert t.activities[1][0] == refused["conversation"]["id"]
    assert "not an approver" in t.activities[1][1]["text"]
    await still_pending(parts, iv)

    # A token signed by another key, or for another bot: 401.
    submit = teams.submit_activity(data)
    for token in (t.mint(key=teams.rsa_key()), t.mint({"aud": "another-bot"})):
        r = await api.client.post(hook, **signed(submit, token))
        assert r.status_code == 401
    await still_pending(parts, iv)

    r = await api.client.post(hook, **signed(submit))
    assert r.status_code == 200 and r.json()["accepted"] is True
    decided = await parts.store.load(iv.id)
    assert decided is not None and decided.status == "approved" and decided.via == "teams"
    assert decided.decided_by == {
        "platform": "teams",
        "platform_user": teams.AAD_USER,
        "channel_id": made["id"],
    }
    # The same activity again (a retry): nothing decided twice.
    r = await api.client.post(hook, **signed(submit))
    assert r.status_code == 200
    assert await parts.store.load(iv.id) == decided
    assert [e.data["decided_by"] for e in await audit(parts, iv)] == [f"teams:{teams.AAD_USER}"]

    # The card updated in place (PUT of its activity), without its buttons.
    await until(lambda: t.updates)
    where, activity_id, update = t.updates[0]
    assert where == conversation
    posted_id = await parts.db.pool.fetchval(
        "SELECT ref->>'activity_id' FROM intervention_posts WHERE intervention_id = $1"
        " AND kind = 'ask'",
        iv.id,
    )
    assert activity_id == posted_id and update["id"] == posted_id
    content = update["attachments"][0]["content"]
    assert "actions" not in content and "Approved by teams:" in json.dumps(content)


# --- generic webhook ------------------------------------------------------------------------


async def test_webhook_signed_links(api: Api, parts: Parts, fakes: Fakes) -> None:
    h = fakes.hook
    ann = await user(api.client, "ann")
    made = await channel(
        api.client,
        ann,
        "webhook",
        {"callback_url": h.callback_url, "approvers": ["ops@example.com", "cfo@example.com"]},
    )
    iv = await pending(parts, "ann", made["id"])
    await until(lambda: h.received)
    ask = h.received[0]
    assert ask["type"] == "intervention" and ask["intervention_id"] == iv.id
    assert ask["question"] == "Pay 5 EUR to ACME?" and ask["arguments"]["api_key"] == "***"
    assert [d["approver"] for d in ask["decisions"]] == ["ops@example.com", "cfo@example.com"]
    links = ask["decisions"][0]
    prefix = f"{PUBLIC}/api/v1/channels/webhook/decide/"
    assert links["approve_url"].startswith(prefix) and links["reject_url"].startswith(prefix)

    def local(url: str) -> str:
        return api.url + url[len(PUBLIC) :]

    async with httpx.AsyncClient(timeout=30) as web:
        # GET only shows a form (a scanner's prefetch decides nothing).
        page = await web.get(local(links["approve_url"]))
        assert page.status_code == 200 and "<form method='post'>" in page.text
        assert page.headers["content-type"].startswith("text/html")
        await still_pending(parts, iv)
        # A changed byte, or a link of another decision spliced: 401.
        token = links["approve_url"].rsplit("/", 1)[1]
        tampered = token.replace(".a.", ".r.")
        r = await web.post(local(prefix + tampered))
        assert r.status_code == 401 and r.json()["ok"] is False
        await still_pending(parts, iv)
        # An approver the channel no longer lists: 403, nothing decided.
        other = ask["decisions"][1]["approve_url"]
        r = await api.client.put(
            f"/channels/{made['id']}",
            headers=ann,
            json={"config": {"approvers": ["ops@example.com"]}},
        )
        assert r.status_code == 200, r.text
        r = await web.post(local(other))
        assert r.status_code == 403
        await still_pending(parts, iv)

        r = await web.post(local(links["approve_url"]))
        assert r.status_code == 200, r.text
        assert r.json() == {"ok": True, "id": iv.id, "status": "approved"}
        # Used again, or its reject twin: 409, nothing changes.
        decided = await parts.store.load(iv.id)
        for url in (links["approve_url"], links["reject_url"]):
            r = await web.post(local(url))
            assert r.status_code == 409 and r.json()["status"] == "approved"
        assert await parts.store.load(iv.id) == decided
    assert decided is not None and decided.via == "webhook"
    assert decided.decided_by == {
        "platform": "webhook",
        "platform_user": "ops@example.com",
        "channel_id": made["id"],
    }
    assert [e.data["decided_by"] for e in await audit(parts, iv)] == ["webhook:ops@example.com"]
    # The outcome follows as a second callback.
    await until(lambda: len(h.received) == 2)
    outcome = h.received[1]
    assert outcome["type"] == "intervention_decided" and outcome["status"] == "approved"
    assert outcome["decided_by"] == "webhook:ops@example.com" and outcome["via"] == "webhook"


async def test_config_is_checked(api: Api) -> None:
    ann = await user(api.client, "ann")
    for kind, config, field in (
        (
            "slack",
            {"signing_secret": "s", "webhook_url": "https://h/x", "notify_channel": "C1"},
            "notify_channel",
        ),
        ("slack", {"signing_secret": "s", "bot_token": "x", "approvers": "U1"}, "approvers"),
        ("slack", {"signing_secret": "s", "bot_token": "x", "approvers": ["U"] * 101}, "approvers"),
        ("telegram", {"bot_token": telegram.TOKEN, "notify_chat_id": "x y"}, "notify_chat_id"),
        (
            "teams",
            {
                "webhook_url": "https://h/x",
                "tenant_id": "t",
                "app_id": "a",
                "notify_conversation_id": "19:x",
            },
            "app_password",
        ),
        ("webhook", {"callback_url": "https://h/x", "approvers": [""]}, "approvers"),
    ):
        r = await api.client.post(
            "/channels", headers=ann, json={"type": kind, "name": "x", "config": config}
        )
        assert r.status_code == 400, (kind, r.text)
        assert r.json()["fields"][0]["field"] == f"config.{field}", r.text


# --- the outbox -----------------------------------------------------------------------------


async def test_a_failed_question_is_retried_and_any_decision_updates_it(
    api: Api, parts: Parts, fakes: Fakes
) -> None:
    """Slack down for the first two tries: the question goes out on the third (backoff);
    decided in the API (not on Slack), the message is still updated; an expiry too."""
    s = fakes.slack
    ann = await user(api.client, "ann")
    made = await channel(
        api.client,
        ann,
        "slack",
        {"signing_secret": SIGNING_SECRET, "bot_token": s.bot_token, "notify_channel": "C1"},
    )
    s.fail_next(2, 503)
    iv = await pending(parts, "ann", made["id"])
    # Recorded as sent (after the post answered): then its tries are counted.
    await until(lambda: _equals(post_state(parts, iv, "ask"), "sent"))
    attempts = await parts.db.pool.fetchval(
        "SELECT attempts FROM intervention_posts WHERE intervention_id = $1 AND kind = 'ask'",
        iv.id,
    )
    assert attempts == 3 and len(s.posted) == 1
    # Counted against the channel like an answer's deliveries, cleared by the success.
    shown = (await api.client.get(f"/channels/{made['id']}", headers=ann)).json()
    assert shown["status"] == "active" and shown["failures"] == 0
    r = await api.client.post(f"/interventions/{iv.id}/reject", headers=ann, json={"reason": "no"})
    assert r.status_code == 200, r.text
    await until(lambda: s.updated)
    assert "Rejected by user:ann: no." in json.dumps(s.updated[0]["blocks"])

    short = await pending(parts, "ann", made["id"])
    await until(lambda: _equals(post_state(parts, short, "ask"), "sent"))
    await parts.db.pool.execute(
        "UPDATE interventions SET expires_at = 0 WHERE id = $1", short.id
    )  # the engines' sweep expires it within a period
    await until(lambda: len(s.updated) == 2, within=30)
    assert "Expired" in s.updated[1]["text"]


async def test_a_question_sent_while_a_press_dropped_it_queues_its_update(
    parts: Parts, make_settings: Any
) -> None:
    """The race the claim cannot close: a decision drops the unsent question while the
    poster is sending it. Recording it as sent queues the outcome, so the message is
    updated anyway."""
    from cryptography.fernet import Fernet

    from orchestrator.channels import ChannelStore, PostStore
    from orchestrator.channels._posts import POST_CLAIM
    from orchestrator.interventions import Decider

    channels = ChannelStore(parts.db.pool, Fernet(Fernet.generate_key()))
    ch, _ = await channels.create(
        Principal("ann"),
        "slack",
        "ops",
        {"signing_secret": "s", "bot_token": "xoxb-1", "notify_channel": "C1"},
    )
    posts = PostStore(parts.db.pool)
    iv = await pending(parts, "ann", ch.id)
    (post,) = await posts.due(0, 1, "poster")
    fence = await parts.claims.acquire(POST_CLAIM, post.key, "poster")
    assert fence is not None
    assert await posts.due(0, 1, "another") == []  # claimed: nobody else sends it
    await parts.store.decide(iv.id, Decider(user_uuid="ann"), approve=True)
    assert await post_state(parts, iv, "ask") == "dropped"
    await posts.sent(post, {"channel": "C1", "ts": "1.1"}, fence=fence)
    assert await post_state(parts, iv, "ask") == "sent"
    assert await post_state(parts, iv, "outcome") == "pending"
    assert [p.kind for p in await posts.due(0, 1, "poster")] == ["outcome"]
    # The claim went with the write: a stale sender writes nothing.
    from orchestrator.runtime.claims import StaleClaim

    with pytest.raises(StaleClaim):
        await posts.give_up(post, "late", fence=fence)
