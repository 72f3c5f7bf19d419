"""Channel payload parsing (Slack Events API, Telegram Updates, Bot Framework Activities,
generic webhook) and the outbound senders against loopback fakes of each platform."""

from __future__ import annotations

import json
import pickle
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from orchestrator.channels import (
    Challenge,
    DeliveryFailed,
    Inbound,
    parse_slack,
    parse_teams,
    parse_telegram,
    parse_webhook,
    send_slack,
    send_teams,
    send_telegram,
    send_webhook,
    telegram_chat_allowed,
)
from orchestrator.channels._platforms import _telegram_chunks
from orchestrator.errors import ValidationFailed
from tests.conftest import free_port
from tests.fakes import slack_server, teams_server, telegram_server
from tests.fakes.slack_server import SlackFake
from tests.fakes.teams_server import TeamsFake
from tests.fakes.telegram_server import TelegramFake
from tests.fakes.webhook_server import CallbackFake

# --- parsing: Slack --------------------------------------------------------------------------


def test_slack_url_verification_is_a_challenge() -> None:
    assert parse_slack(slack_server.url_verification("abc123")) == Challenge("abc123")
    with pytest.raises(ValidationFailed, match="challenge"):
        parse_slack({"type": "url_verification"})


def test_slack_message() -> None:
    payload = slack_server.message_event("  What is our uptime?  ", channel="C042", user="U7")
    inbound = parse_slack(payload)
    assert isinstance(inbound, Inbound)
    assert inbound.text == "What is our uptime?"
    assert inbound.conversation == "C042"
    assert inbound.user == "U7"
    assert inbound.delivery_id == payload["event_id"]
    assert inbound.reply == {"channel": "C042"}
    assert inbound.metadata["team_id"] == slack_server.TEAM
    assert inbound.metadata["ts"] == payload["event"]["ts"]
    json.dumps(inbound.reply)


def test_slack_thread_is_its_own_conversation() -> None:
    inbound = parse_slack(slack_server.message_event("more", channel="C1", thread_ts="1700.000100"))
    assert isinstance(inbound, Inbound)
    assert inbound.conversation == "C1:1700.000100"
    assert inbound.reply == {"channel": "C1", "thread_ts": "1700.000100"}


def test_slack_app_mention_drops_the_mention() -> None:
    inbound = parse_slack(slack_server.app_mention_event("summarise the incident"))
    assert isinstance(inbound, Inbound)
    assert inbound.text == "summarise the incident"
    assert inbound.metadata["event_type"] == "app_mention"


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(slack_server.bot_message_event("our answer"), id="own bot message"),
        pytest.param(slack_server.bot_message_event("deployed", own=False), id="bot_message"),
        pytest.param(
            slack_server.message_event("edited", subtype="message_changed"), id="message_changed"
        ),
        pytest.param(
            slack_server.message_event("", subtype="message_deleted"), id="message_deleted"
        ),
        pytest.param(
            slack_server.message_event("<@U1> has joined", subtype="channel_join"),
            id="channel_join",
        ),
        pytest.param(slack_server.message_event("   "), id="blank text"),
        pytest.param(
            {**slack_server.message_event("x"), "event": {"type": "reaction_added"}},
            id="other event",
        ),
        pytest.param(
            {"type": "app_rate_limited", "team_id": "T1", "minute_rate_limited": 1518467820},
            id="app_rate_limited",
        ),
    ],
)
def test_slack_ignores(payload: Any) -> None:
    assert parse_slack(payload) is None


def test_slack_user_messages_with_a_subtype_still_count() -> None:
    inbound = parse_slack(slack_server.message_event("see file", subtype="file_share"))
    assert isinstance(inbound, Inbound) and inbound.text == "see file"


def test_slack_body_must_be_an_object() -> None:
    with pytest.raises(ValidationFailed, match="body"):
        parse_slack([1, 2])


# --- parsing: Telegram -----------------------------------------------------------------------


def test_telegram_text_message() -> None:
    update = telegram_server.text_update("hello bot", chat_id=4242, user_id=4242)
    inbound = parse_telegram(update, None)
    assert isinstance(inbound, Inbound)
    assert inbound.text == "hello bot"
    assert inbound.conversation == "4242"
    assert inbound.user == "testuser"
    assert inbound.delivery_id == str(update["update_id"])
    assert inbound.reply == {"chat_id": 4242, "message_id": update["message"]["message_id"]}
    assert inbound.metadata["chat_type"] == "private"


@pytest.mark.parametrize(
    ("chat_ids", "allowed"),
    [
        (None, True),
        ([], True),
        (["-1001234567890"], True),
        (["42", "-1001234567890"], True),
        (["42"], False),
        (["@someone_else"], False),
    ],
)
def test_telegram_chat_ids(chat_ids: list[str] | None, allowed: bool) -> None:
    update = telegram_server.text_update("hi", chat_id=-1001234567890, chat_type="supergroup")
    assert telegram_chat_allowed(update, chat_ids) is allowed
    inbound = parse_telegram(update, chat_ids)
    if allowed:
        assert isinstance(inbound, Inbound) and inbound.conversation == "-1001234567890"
    else:
        assert inbound is None


def test_telegram_chat_by_username() -> None:
    update = telegram_server.text_update("hi", chat_id=77)
    assert telegram_chat_allowed(update, ["@testuser"])
    assert parse_telegram(update, ["@testuser"]) is not None


@pytest.mark.parametrize(
    "update",
    [
        pytest.param(telegram_server.photo_update(), id="photo"),
        pytest.param(telegram_server.edited_update("changed"), id="edited message"),
        pytest.param(telegram_server.text_update("   "), id="blank text"),
        pytest.param({"update_id": 5, "my_chat_member": {}}, id="other update"),
    ],
)
def test_telegram_ignores(update: Any) -> None:
    assert parse_telegram(update, None) is None


def test_telegram_ignores_bots() -> None:
    update = telegram_server.text_update("from a bot")
    update["message"]["from"]["is_bot"] = True
    assert parse_telegram(update, None) is None


# --- parsing: Teams --------------------------------------------------------------------------


def test_teams_message() -> None:
    activity = teams_server.message_activity("status of build 7?", activity_id="1508439884810")
    inbound = parse_teams(activity)
    assert isinstance(inbound, Inbound)
    assert inbound.text == "status of build 7?"
    assert inbound.conversation == activity["conversation"]["id"]
    assert inbound.user == "Megan Bowen"
    assert inbound.delivery_id == "1508439884810"
    assert inbound.reply == {
        "service_url": teams_server.SERVICE_URL,
        "conversation_id": activity["conversation"]["id"],
        "activity_id": "1508439884810",
        "from": activity["from"],
        "recipient": activity["recipient"],
    }
    assert inbound.metadata["tenant_id"] == teams_server.TENANT
    assert inbound.metadata["channel_id"] == "msteams"


def test_teams_mention_of_the_bot_is_dropped() -> None:
    inbound = parse_teams(teams_server.message_activity("deploy now", mention_bot=True))
    assert isinstance(inbound, Inbound) and inbound.text == "deploy now"


@pytest.mark.parametrize(
    "activity",
    [
        pytest.param(
            {**teams_server.message_activity("x"), "type": "conversationUpdate"},
            id="conversationUpdate",
        ),
        pytest.param({**teams_server.message_activity("x"), "type": "typing"}, id="typing"),
        pytest.param(teams_server.message_activity("  "), id="blank text"),
        pytest.param(
            {
                **teams_server.message_activity("echo"),
                "from": {"id": teams_server.BOT_ID, "name": "Teams TestBot"},
            },
            id="own message",
        ),
    ],
)
def test_teams_ignores(activity: Any) -> None:
    assert parse_teams(activity) is None


# --- parsing: generic webhook ----------------------------------------------------------------


def test_webhook_full_body() -> None:
    body = {
        "text": " deploy? ",
        "user": "ana",
        "metadata": {"conversation": "ops-42", "message_id": 991, "source": "ci"},
    }
    inbound = parse_webhook(body)
    assert inbound == Inbound(
        conversation="ops-42",
        text="deploy?",
        user="ana",
        delivery_id="991",
        reply={"conversation": "ops-42", "user": "ana", "metadata": body["metadata"]},
        metadata=body["metadata"],
    )


@pytest.mark.parametrize(
    ("body", "conversation"),
    [({"text": "hi", "user": "bob"}, "bob"), ({"text": "hi"}, "default")],
)
def test_webhook_conversation_defaults(body: Any, conversation: str) -> None:
    inbound = parse_webhook(body)
    assert inbound.conversation == conversation
    assert inbound.delivery_id is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": ""}, "text"),
        ({"text": "   "}, "text"),
        ({"text": 42}, "text"),
        ({"text": "hi", "user": 7}, "user"),
        ({"text": "hi", "metadata": "x"}, "metadata"),
        ({"text": "hi", "metadata": {"conversation": "c" * 300}}, "metadata.conversation"),
        (["text"], "body"),
        ("text", "body"),
    ],
)
def test_webhook_bad_bodies(body: Any, field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_webhook(body)
    assert caught.value.status_code == 400
    assert caught.value.message.startswith(f"{field}: ")
    assert caught.value.extra["fields"][0]["field"] == field


# --- senders ---------------------------------------------------------------------------------


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5) as client:
        yield client


@pytest.fixture(scope="module")
def slack_fake() -> Iterator[SlackFake]:
    with SlackFake() as fake:
        yield fake


@pytest.fixture
def slack(slack_fake: SlackFake) -> SlackFake:
    slack_fake.reset()
    return slack_fake


@pytest.fixture(scope="module")
def teams_fake() -> Iterator[TeamsFake]:
    with TeamsFake() as fake:
        yield fake


@pytest.fixture
def teams(teams_fake: TeamsFake) -> TeamsFake:
    teams_fake.reset()
    return teams_fake


@pytest.fixture(scope="module")
def telegram_fake() -> Iterator[TelegramFake]:
    with TelegramFake() as fake:
        yield fake


@pytest.fixture
def telegram(telegram_fake: TelegramFake) -> TelegramFake:
    telegram_fake.reset()
    return telegram_fake


@pytest.fixture(scope="module")
def callback_fake() -> Iterator[CallbackFake]:
    with CallbackFake() as fake:
        yield fake


@pytest.fixture
def callback(callback_fake: CallbackFake) -> CallbackFake:
    callback_fake.reset()
    return callback_fake


def closed_url(path: str = "/x") -> str:
    return f"http://127.0.0.1:{free_port()}{path}"


async def failure(coro: Any) -> DeliveryFailed:
    with pytest.raises(DeliveryFailed) as caught:
        await coro
    return caught.value


def test_delivery_failed_pickles() -> None:
    exc = DeliveryFailed("telegram sendMessage: HTTP 429", True, 3.0)
    again = pickle.loads(pickle.dumps(exc))
    assert (again.message, again.retryable, again.retry_after) == (
        "telegram sendMessage: HTTP 429",
        True,
        3.0,
    )
    assert str(again) == "telegram sendMessage: HTTP 429"
    assert not isinstance(exc, httpx.HTTPError)


# Slack ------------------------------------------------------------------------------------------


async def test_slack_post_message(http: httpx.AsyncClient, slack: SlackFake) -> None:
    secrets = {"bot_token": slack.bot_token}
    reply = {"channel": "C042", "thread_ts": "1700.000100"}
    await send_slack(http, {}, secrets, reply, "All green.", base_url=slack.api_url)
    assert slack.posted == [{"channel": "C042", "text": "All green.", "thread_ts": "1700.000100"}]
    request = slack.requests[-1]
    assert request.path == "/api/chat.postMessage"
    assert request.headers["authorization"] == f"Bearer {slack.bot_token}"
    assert request.headers["content-type"].startswith("application/json")


async def test_slack_post_message_prefers_the_bot_token(
    http: httpx.AsyncClient, slack: SlackFake
) -> None:
    config = {"webhook_url": slack.webhook_url}
    secrets = {"bot_token": slack.bot_token, "signing_secret": "x" * 32}
    await send_slack(http, config, secrets, {"channel": "C1"}, "hi", base_url=slack.api_url)
    assert [r.path for r in slack.requests] == ["/api/chat.postMessage"]


@pytest.mark.parametrize(
    ("status", "error", "retry_after", "retryable", "expected_after"),
    [
        (500, None, None, True, None),
        (503, "service_unavailable", None, True, None),
        (429, None, 7, True, 7.0),
        (200, "ratelimited", None, True, None),
        (200, "internal_error", None, True, None),
        (200, "channel_not_found", None, False, None),
        (200, "not_in_channel", None, False, None),
        (400, "invalid_arguments", None, False, None),
    ],
)
async def test_slack_post_message_failures(
    http: httpx.AsyncClient,
    slack: SlackFake,
    status: int,
    error: str | None,
    retry_after: int | None,
    retryable: bool,
    expected_after: float | None,
) -> None:
    slack.fail_next(status=status, error=error, retry_after=retry_after)
    exc = await failure(
        send_slack(
            http,
            {},
            {"bot_token": slack.bot_token},
            {"channel": "C1"},
            "hi",
            base_url=slack.api_url,
        )
    )
    assert exc.retryable is retryable
    assert exc.retry_after == expected_after
    assert exc.message.startswith("slack chat.postMessage: ")
    if error:
        assert error in exc.message
    assert slack.bot_token not in str(exc) + repr(exc)
    assert slack.posted == []


async def test_slack_wrong_bot_token(http: httpx.AsyncClient, slack: SlackFake) -> None:
    token = "xoxb-wrong-token-0000"
    exc = await failure(
        send_slack(http, {}, {"bot_token": token}, {"channel": "C1"}, "hi", base_url=slack.api_url)
    )
    assert exc.message == "slack chat.postMessage: invalid_auth"
    assert exc.retryable is False
    assert token not in str(exc) + repr(exc)


async def test_slack_incoming_webhook(http: httpx.AsyncClient, slack: SlackFake) -> None:
    config = {"webhook_url": slack.webhook_url, "signing_secret": "s"}
    await send_slack(http, config, {}, {"channel": "C1", "thread_ts": "17.5"}, "Done.")
    assert slack.posted == [{"text": "Done.", "thread_ts": "17.5"}]
    await send_slack(http, config, {}, {"channel": "C1"}, "Top level.")
    assert slack.posted[-1] == {"text": "Top level."}


@pytest.mark.parametrize(
    ("status", "error", "retry_after", "retryable"),
    [
        (500, "rollup_error", None, True),
        (429, None, 30, True),
        (404, "channel_not_found", None, False),
        (410, "channel_is_archived", None, False),
        (403, "action_prohibited", None, False),
    ],
)
async def test_slack_incoming_webhook_failures(
    http: httpx.AsyncClient,
    slack: SlackFake,
    status: int,
    error: str | None,
    retry_after: int | None,
    retryable: bool,
) -> None:
    slack.fail_next(status=status, error=error, retry_after=retry_after)
    exc = await failure(send_slack(http, {"webhook_url": slack.webhook_url}, {}, {}, "hi"))
    assert exc.retryable is retryable
    assert exc.message.startswith(f"slack webhook: HTTP {status}")
    if error:
        assert exc.message.endswith(error)
    assert exc.retry_after == (float(retry_after) if retry_after else None)
    assert "/services/" not in str(exc)  # the webhook URL is a credential


async def test_slack_webhook_unknown_and_unreachable(
    http: httpx.AsyncClient, slack: SlackFake
) -> None:
    exc = await failure(
        send_slack(http, {"webhook_url": f"{slack.url}/services/T0/B0/revoked"}, {}, {}, "hi")
    )
    assert (exc.message, exc.retryable) == ("slack webhook: HTTP 404 no_service", False)
    url = closed_url("/services/T0/B0/secretpart")
    exc = await failure(send_slack(http, {"webhook_url": url}, {}, {}, "hi"))
    assert exc.retryable is True
    assert "connection failed" in exc.message
    assert "secretpart" not in str(exc)


async def test_slack_needs_a_token_or_a_webhook(http: httpx.AsyncClient) -> None:
    exc = await failure(send_slack(http, {"signing_secret": "s"}, {}, {"channel": "C1"}, "hi"))
    assert (exc.message, exc.retryable) == ("slack webhook: no webhook_url configured", False)
    exc = await failure(send_slack(http, {}, {"bot_token": "xoxb-1"}, {}, "hi"))
    assert exc.retryable is False and "no channel" in exc.message


# Teams ------------------------------------------------------------------------------------------


async def test_teams_connector_webhook(http: httpx.AsyncClient, teams: TeamsFake) -> None:
    await send_teams(http, {"webhook_url": teams.webhook_url}, {}, {}, "**Build** passed.")
    assert teams.posted == [{"text": "**Build** passed."}]


async def test_teams_workflow_webhook_gets_an_adaptive_card(
    http: httpx.AsyncClient, teams: TeamsFake
) -> None:
    await send_teams(http, {"webhook_url": teams.workflow_url}, {}, {}, "Build passed.")
    [body] = teams.posted
    assert body["type"] == "message"
    [attachment] = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert card["body"] == [{"type": "TextBlock", "text": "Build passed.", "wrap": True}]


async def test_teams_long_answers_are_truncated(http: httpx.AsyncClient, teams: TeamsFake) -> None:
    await send_teams(http, {"webhook_url": teams.webhook_url}, {}, {}, "é" * 30_000)
    text = teams.posted[-1]["text"]
    assert len(text.encode()) <= 24_000
    assert text.endswith("(answer truncated)")


@pytest.mark.parametrize(
    ("status", "error", "retry_after", "retryable", "message"),
    [
        (500, None, None, True, "teams webhook: HTTP 500"),
        (502, None, None, True, "teams webhook: HTTP 502"),
        (429, None, 12, True, "teams webhook: HTTP 429"),
        (400, "Summary or Text is required.", None, False, "teams webhook: HTTP 400"),
        (404, None, None, False, "teams webhook: HTTP 404"),
        (200, "429", None, True, "teams webhook: delivery failed (Teams answered HTTP 429)"),
        (200, "400", None, False, "teams webhook: delivery failed (Teams answered HTTP 400)"),
    ],
)
async def test_teams_failures(
    http: httpx.AsyncClient,
    teams: TeamsFake,
    status: int,
    error: str | None,
    retry_after: int | None,
    retryable: bool,
    message: str,
) -> None:
    teams.fail_next(status=status, error=error, retry_after=retry_after)
    exc = await failure(send_teams(http, {"webhook_url": teams.webhook_url}, {}, {}, "hi"))
    assert (exc.message, exc.retryable) == (message, retryable)
    assert exc.retry_after == (float(retry_after) if retry_after else None)
    assert "webhookb2" not in str(exc)
    assert teams.posted == []


async def test_teams_needs_a_webhook(http: httpx.AsyncClient) -> None:
    exc = await failure(send_teams(http, {"tenant_id": "t"}, {}, {}, "hi"))
    assert (exc.message, exc.retryable) == ("teams webhook: no webhook_url configured", False)


# Telegram ---------------------------------------------------------------------------------------


async def test_telegram_send_message(http: httpx.AsyncClient, telegram: TelegramFake) -> None:
    secrets = {"bot_token": telegram.bot_token}
    reply = {"chat_id": 4242, "message_id": 1365}
    await send_telegram(http, {}, secrets, reply, "Here you go.", base_url=telegram.url)
    assert telegram.sent == [
        {
            "chat_id": 4242,
            "text": "Here you go.",
            "reply_to_message_id": 1365,
            "allow_sending_without_reply": True,
        }
    ]
    assert telegram.requests[-1].path == f"/bot{telegram.bot_token}/sendMessage"


async def test_telegram_long_answers_are_split(
    http: httpx.AsyncClient, telegram: TelegramFake
) -> None:
    paragraph = "word " * 300  # 1500 characters
    text = "\n".join([paragraph] * 8)  # about 12000
    secrets = {"bot_token": telegram.bot_token}
    reply = {"chat_id": -100123, "message_id": 9}
    await send_telegram(http, {}, secrets, reply, text, base_url=telegram.url)
    parts = [body["text"] for body in telegram.sent]
    assert len(parts) == 3
    assert all(len(p) <= 4096 for p in parts)
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())
    assert "reply_to_message_id" in telegram.sent[0]
    assert all("reply_to_message_id" not in body for body in telegram.sent[1:])


def test_telegram_chunks_count_utf16_units() -> None:
    emoji = "\U0001f600"  # two UTF-16 code units
    parts = _telegram_chunks(emoji * 3000)
    assert [len(p) for p in parts] == [2048, 952]
    assert _telegram_chunks("short") == ["short"]
    assert _telegram_chunks("a" * 5000) == ["a" * 4096, "a" * 904]


@pytest.mark.parametrize(
    ("status", "retry_after", "retryable", "message"),
    [
        (429, 17, True, "telegram sendMessage: HTTP 429: Too Many Requests: retry after 17"),
        (500, None, True, "telegram sendMessage: HTTP 500: Internal Server Error"),
        (502, None, True, "telegram sendMessage: HTTP 502"),
        (400, None, False, "telegram sendMessage: HTTP 400: Internal Server Error"),
        (403, None, False, "telegram sendMessage: HTTP 403: Internal Server Error"),
    ],
)
async def test_telegram_failures(
    http: httpx.AsyncClient,
    telegram: TelegramFake,
    status: int,
    retry_after: int | None,
    retryable: bool,
    message: str,
) -> None:
    telegram.fail_next(status=status, retry_after=retry_after)
    secrets = {"bot_token": telegram.bot_token}
    exc = await failure(
        send_telegram(http, {}, secrets, {"chat_id": 1}, "hi", base_url=telegram.url)
    )
    assert (exc.message, exc.retryable) == (message, retryable)
    assert exc.retry_after == (float(retry_after) if retry_after else None)
    assert telegram.bot_token not in str(exc) + repr(exc)


async def test_telegram_bot_blocked_is_final(
    http: httpx.AsyncClient, telegram: TelegramFake
) -> None:
    telegram.fail_next(status=403, error="Forbidden: bot was blocked by the user")
    secrets = {"bot_token": telegram.bot_token}
    exc = await failure(
        send_telegram(http, {}, secrets, {"chat_id": 1}, "hi", base_url=telegram.url)
    )
    assert exc.message == "telegram sendMessage: HTTP 403: Forbidden: bot was blocked by the user"
    assert exc.retryable is False


async def test_telegram_wrong_token_never_shows_it(
    http: httpx.AsyncClient, telegram: TelegramFake
) -> None:
    token = "999999999:AAWrongWrongWrongWrongWrongWrongWro"
    exc = await failure(
        send_telegram(http, {}, {"bot_token": token}, {"chat_id": 1}, "hi", base_url=telegram.url)
    )
    assert (exc.message, exc.retryable) == ("telegram sendMessage: HTTP 401: Unauthorized", False)
    assert token not in str(exc) + repr(exc)
    assert token.split(":")[1] not in str(exc)


async def test_telegram_unreachable_and_slow(
    http: httpx.AsyncClient, telegram: TelegramFake
) -> None:
    secrets = {"bot_token": telegram.bot_token}
    exc = await failure(
        send_telegram(http, {}, secrets, {"chat_id": 1}, "hi", base_url=closed_url(""))
    )
    assert exc.retryable is True
    assert exc.message.startswith("telegram sendMessage: connection failed")
    assert telegram.bot_token not in str(exc) + repr(exc)

    telegram.fail_next(delay_s=1.0)
    async with httpx.AsyncClient(timeout=0.2) as impatient:
        exc = await failure(
            send_telegram(impatient, {}, secrets, {"chat_id": 1}, "hi", base_url=telegram.url)
        )
    assert exc.retryable is True
    assert exc.message.startswith("telegram sendMessage: timed out")
    assert telegram.bot_token not in str(exc) + repr(exc)


async def test_telegram_needs_a_token_and_a_chat(http: httpx.AsyncClient) -> None:
    exc = await failure(send_telegram(http, {}, {}, {"chat_id": 1}, "hi"))
    assert (exc.message, exc.retryable) == ("telegram sendMessage: no bot_token configured", False)
    exc = await failure(send_telegram(http, {}, {"bot_token": "1:abc"}, {}, "hi"))
    assert exc.retryable is False and "no chat" in exc.message


# Generic webhook --------------------------------------------------------------------------------


async def test_webhook_callback(http: httpx.AsyncClient, callback: CallbackFake) -> None:
    inbound = parse_webhook(
        {"text": "deploy?", "user": "ana", "metadata": {"conversation": "c1", "message_id": "m1"}}
    )
    config = {"callback_url": callback.callback_url}
    await send_webhook(http, config, {}, inbound.reply, "Deployed.")
    assert callback.received == [
        {
            "text": "Deployed.",
            "conversation": "c1",
            "user": "ana",
            "in_reply_to": {"conversation": "c1", "message_id": "m1"},
        }
    ]


@pytest.mark.parametrize(
    ("status", "retry_after", "retryable"),
    [(500, None, True), (503, None, True), (429, 4, True), (408, None, True), (404, None, False)],
)
async def test_webhook_callback_failures(
    http: httpx.AsyncClient,
    callback: CallbackFake,
    status: int,
    retry_after: int | None,
    retryable: bool,
) -> None:
    callback.fail_next(status=status, retry_after=retry_after)
    config = {"callback_url": callback.callback_url}
    exc = await failure(send_webhook(http, config, {}, {"conversation": "c"}, "hi"))
    assert (exc.message, exc.retryable) == (f"webhook callback: HTTP {status}", retryable)
    assert exc.retry_after == (float(retry_after) if retry_after else None)


async def test_webhook_callback_unreachable_or_missing(http: httpx.AsyncClient) -> None:
    exc = await failure(send_webhook(http, {"callback_url": closed_url()}, {}, {}, "hi"))
    assert exc.retryable is True and "connection failed" in exc.message
    exc = await failure(send_webhook(http, {}, {}, {}, "hi"))
    assert (exc.message, exc.retryable) == ("webhook callback: no callback_url configured", False)
    exc = await failure(send_webhook(http, {"callback_url": "ftp://example.com/x"}, {}, {}, "hi"))
    assert (exc.message, exc.retryable) == (
        "webhook callback: the configured URL is not valid",
        False,
    )
