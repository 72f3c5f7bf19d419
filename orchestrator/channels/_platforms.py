"""What each platform sends us and how we answer it: payload parsing into one `Inbound`
shape, and one outbound sender per channel type.

Parsing (after the request was verified):
- Slack Events API: `url_verification` -> `Challenge`; an `event_callback` whose event is a
  user's `message` (or `app_mention`) with text -> `Inbound`; bot messages, edits, deletions,
  joins and every other event -> `None` (acknowledged, not relayed).
- Telegram Bot API `Update`: `message.text` -> `Inbound`. Edited messages, channel posts and
  messages without text (photos, stickers, joins) -> `None`; so is a chat outside the
  channel's `chat_ids` (see `telegram_chat_allowed`, for logging). The receiver still answers
  200 to an ignored update, or Telegram would redeliver it.
- Bot Framework (Teams) `Activity` of type `message` with text -> `Inbound`; other activity
  types (conversationUpdate, typing, invoke...) -> `None`.
- Generic webhook `{text, user?, metadata?}` -> `Inbound`, or `ValidationFailed` (400).

`Inbound.conversation` keys the session history; `Inbound.delivery_id` is the platform's own
id of the delivery, for processing a redelivered message once; `Inbound.reply` is all the
sender needs to answer (JSON-serialisable: it is stored with the inbox item).

Sending: each `send_*` posts one answer and raises `DeliveryFailed` with `retryable` set for
5xx, 408, 429 (with the platform's retry delay), timeouts and connection errors, and cleared
for other 4xx and for a configuration that cannot work. Messages never contain a token or a
webhook URL (both are credentials): only the platform, the HTTP status and the platform's
short error code.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from orchestrator.egress import DestinationNotAllowed
from orchestrator.errors import ValidationFailed

__all__ = [
    "SLACK_API",
    "TELEGRAM_API",
    "Challenge",
    "DeliveryFailed",
    "Inbound",
    "parse_slack",
    "parse_teams",
    "parse_telegram",
    "parse_webhook",
    "send_slack",
    "send_teams",
    "send_telegram",
    "send_webhook",
    "telegram_chat_allowed",
]

SLACK_API = "https://slack.com/api"
TELEGRAM_API = "https://api.telegram.org"

# Telegram refuses a message over 4096 characters (UTF-16 code units): longer answers go out
# as several messages, split at line breaks where possible.
TELEGRAM_MAX_UNITS = 4096
# A conversation key is stored with every turn.
MAX_CONVERSATION = 256
# A Teams webhook refuses payloads over about 28 KB.
TEAMS_MAX_BYTES = 24_000

# Slack message events that a person wrote; any other subtype (bot_message, message_changed,
# message_deleted, channel_join, ...) is not relayed.
_SLACK_USER_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "me_message"})
# chat.postMessage errors worth another try (everything else is a configuration problem).
_SLACK_RETRYABLE = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
_ERROR_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
_TEAMS_REFUSED = re.compile(r"returned HTTP error (\d{3})", re.IGNORECASE)


# --- inbound -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inbound:
    """One message to relay to an agent."""

    conversation: str
    text: str
    user: str | None
    delivery_id: str | None
    reply: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Challenge:
    """Slack's `url_verification`: answer `{"challenge": ...}` (200) and relay nothing."""

    challenge: str


def _bad(field_name: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"{field_name}: {message}",
        extra={"fields": [{"field": field_name, "message": message}]},
    )


def _object(payload: Any, what: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise _bad("body", f"a JSON object ({what})")
    return payload


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _id(value: Any) -> str | None:
    """A platform id given as a string or a number, as a string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value:
        return value
    return None


# --- Slack ---------------------------------------------------------------------------------


def parse_slack(payload: Any) -> Inbound | Challenge | None:
    """An Events API request body (JSON). `conversation` is the channel, or
    `<channel>:<thread_ts>` inside a thread, where the answer then goes too."""
    body = _object(payload, "a Slack Events API payload")
    kind = body.get("type")
    if kind == "url_verification":
        challenge = body.get("challenge")
        if not isinstance(challenge, str) or not challenge:
            raise _bad("challenge", "required for url_verification")
        return Challenge(challenge)
    if kind != "event_callback":
        return None  # app_rate_limited and future envelope types
    event = _dict(body.get("event"))
    if event.get("type") not in ("message", "app_mention"):
        return None
    if event.get("bot_id") or event.get("bot_profile"):
        return None  # a bot's message, our own answers included
    if event.get("subtype") not in _SLACK_USER_SUBTYPES:
        return None
    channel = _id(event.get("channel"))
    user = _id(event.get("user"))
    # The app's own bot user(s), from the envelope's authorizations.
    bot_users = {
        a["user_id"]
        for a in body.get("authorizations") or []
        if isinstance(a, dict) and a.get("is_bot") is True and isinstance(a.get("user_id"), str)
    }
    if channel is None or (user is not None and user in bot_users):
        return None
    text = _text(_strip_mentions(event.get("text"), bot_users))
    if text is None:
        return None
    thread_ts = _id(event.get("thread_ts"))
    reply: dict[str, Any] = {"channel": channel}
    if thread_ts:
        reply["thread_ts"] = thread_ts
    return Inbound(
        conversation=f"{channel}:{thread_ts}" if thread_ts else channel,
        text=text,
        user=user,
        delivery_id=_id(body.get("event_id")),
        reply=reply,
        metadata=_present(
            {
                "team_id": body.get("team_id"),
                "api_app_id": body.get("api_app_id"),
                "event_id": body.get("event_id"),
                "event_time": body.get("event_time"),
                "event_type": event.get("type"),
                "channel_type": event.get("channel_type"),
                "ts": event.get("ts"),
            }
        ),
    )


def _strip_mentions(text: Any, bot_users: set[str]) -> Any:
    """`<@U0BOT> hello` -> `hello`: the mention of our own bot user is addressing, not content."""
    if not isinstance(text, str):
        return text
    for user in bot_users:
        text = re.sub(rf"<@{re.escape(user)}(\|[^>]*)?>", "", text)
    return text


# --- Telegram ------------------------------------------------------------------------------


def _telegram_message(update: Mapping[str, Any]) -> dict[str, Any] | None:
    # Only new messages: an edit would ask the agent again, and channel posts have no sender.
    message = update.get("message")
    return message if isinstance(message, dict) else None


def telegram_chat_allowed(update: Any, chat_ids: Sequence[str] | None) -> bool:
    """Whether the update's chat is one of `chat_ids` (ids as strings, or `@username`s). No
    `chat_ids` (or an update without a chat) allows everything."""
    if not chat_ids or not isinstance(update, dict):
        return True
    message = _telegram_message(update)
    if message is None:
        return True
    chat = _dict(message.get("chat"))
    allowed = {str(c).strip() for c in chat_ids}
    chat_id = _id(chat.get("id"))
    username = chat.get("username")
    return (chat_id is not None and chat_id in allowed) or (
        isinstance(username, str) and f"@{username}" in allowed
    )


def parse_telegram(update: Any, chat_ids: Sequence[str] | None) -> Inbound | None:
    """A Bot API `Update`. `chat_ids`: the channel's allowed chats (None or empty: all)."""
    body = _object(update, "a Telegram Update")
    message = _telegram_message(body)
    if message is None:
        return None
    text = _text(message.get("text"))
    chat = _dict(message.get("chat"))
    chat_id = chat.get("id")
    sender = _dict(message.get("from"))
    if text is None or _id(chat_id) is None or sender.get("is_bot") is True:
        return None
    if not telegram_chat_allowed(body, chat_ids):
        return None
    user = sender.get("username") or sender.get("first_name") or _id(sender.get("id"))
    reply: dict[str, Any] = {"chat_id": chat_id}
    if isinstance(message.get("message_id"), int):
        reply["message_id"] = message["message_id"]
    return Inbound(
        conversation=str(chat_id),
        text=text,
        user=user if isinstance(user, str) else None,
        delivery_id=_id(body.get("update_id")),
        reply=reply,
        metadata=_present(
            {
                "update_id": body.get("update_id"),
                "chat_type": chat.get("type"),
                "from_id": sender.get("id"),
                "date": message.get("date"),
            }
        ),
    )


# --- Teams (Bot Framework) -----------------------------------------------------------------


def parse_teams(activity: Any) -> Inbound | None:
    """A Bot Framework `Activity`. Mentions of the bot (`<at>Bot</at>`) are removed from the
    text. `metadata.tenant_id` is the sender's tenant, to compare with the channel's."""
    body = _object(activity, "a Bot Framework Activity")
    if body.get("type") != "message":
        return None
    sender = _dict(body.get("from"))
    recipient = _dict(body.get("recipient"))
    conversation = _dict(body.get("conversation"))
    conversation_id = _id(conversation.get("id"))
    if conversation_id is None:
        return None
    if sender.get("id") is not None and sender.get("id") == recipient.get("id"):
        return None  # our own message echoed back
    text = _text(_strip_teams_mentions(body.get("text"), body.get("entities"), recipient))
    if text is None:
        return None
    tenant = conversation.get("tenantId") or _dict(
        _dict(body.get("channelData")).get("tenant")
    ).get("id")
    name = sender.get("name") or sender.get("id")
    return Inbound(
        conversation=conversation_id,
        text=text,
        user=name if isinstance(name, str) else None,
        delivery_id=_id(body.get("id")),
        reply={
            "service_url": body.get("serviceUrl"),
            "conversation_id": conversation_id,
            "activity_id": body.get("id"),
            "from": sender,
            "recipient": recipient,
        },
        metadata=_present(
            {
                "channel_id": body.get("channelId"),
                "tenant_id": tenant,
                "conversation_type": conversation.get("conversationType"),
                "from_id": sender.get("id"),
                "aad_object_id": sender.get("aadObjectId"),
                "timestamp": body.get("timestamp"),
                "locale": body.get("locale"),
            }
        ),
    )


def _strip_teams_mentions(text: Any, entities: Any, recipient: Mapping[str, Any]) -> Any:
    if not isinstance(text, str) or not isinstance(entities, list):
        return text
    for entity in entities:
        if (
            isinstance(entity, dict)
            and entity.get("type") == "mention"
            and _dict(entity.get("mentioned")).get("id") == recipient.get("id")
            and isinstance(entity.get("text"), str)
        ):
            text = text.replace(entity["text"], "")
    return text


# --- generic webhook -----------------------------------------------------------------------


def parse_webhook(body: Any) -> Inbound:
    """`{text, user?, metadata?}`. The conversation is `metadata.conversation`, else the user,
    else `"default"`; `metadata.message_id` (when given) deduplicates redeliveries."""
    payload = _object(body, "{text, user, metadata}")
    text = payload.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _bad("text", "required, a non-empty string")
    user = payload.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", "a string")
    metadata = payload.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise _bad("metadata", "an object")
    conversation = _id(metadata.get("conversation")) or user or "default"
    if len(conversation) > MAX_CONVERSATION:
        raise _bad(
            "metadata.conversation" if metadata.get("conversation") else "user",
            f"at most {MAX_CONVERSATION} characters",
        )
    return Inbound(
        conversation=conversation,
        text=text.strip(),
        user=user or None,
        delivery_id=_id(metadata.get("message_id")),
        reply={"conversation": conversation, "user": user, "metadata": metadata},
        metadata=metadata,
    )


# --- outbound ------------------------------------------------------------------------------


class DeliveryFailed(Exception):
    """An answer could not be delivered. `retryable`: try again later (after at least
    `retry_after` seconds when the platform said so)."""

    def __init__(
        self, message: str, retryable: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message, self.retryable, self.retry_after))

    def __repr__(self) -> str:
        return (
            f"DeliveryFailed({self.message!r}, retryable={self.retryable}, "
            f"retry_after={self.retry_after})"
        )


def _retry_after(value: str | None) -> float | None:
    """`Retry-After`: seconds, or an HTTP date."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _redact(text: str, secrets: Mapping[str, str]) -> str:
    for value in secrets.values():
        if isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _short_code(value: Any) -> str | None:
    """A platform's error code (`channel_not_found`), never a free-form echo of the body."""
    if isinstance(value, str) and _ERROR_CODE.fullmatch(value.strip()):
        return value.strip()
    return None


async def _post(
    http: httpx.AsyncClient,
    url: str,
    payload: Any,
    what: str,
    *,
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
) -> httpx.Response:
    """POST (or `method`) JSON; transport failures become retryable `DeliveryFailed` without
    the URL."""
    body = json.dumps(payload, ensure_ascii=False).encode()
    sent = {"content-type": "application/json; charset=utf-8", **(headers or {})}
    try:
        # The client's own timeouts apply; a timeout is retried with backoff by the relay.
        return await http.request(method, url, content=body, headers=sent)
    except DestinationNotAllowed:
        # Said without the address or any answer: this must not map the internal network.
        raise DeliveryFailed(f"{what}: destination not allowed", False) from None
    except httpx.TimeoutException as exc:
        raise DeliveryFailed(f"{what}: timed out ({type(exc).__name__})", True) from None
    except (httpx.UnsupportedProtocol, httpx.InvalidURL):
        raise DeliveryFailed(f"{what}: the configured URL is not valid", False) from None
    except (UnicodeError, ValueError) as exc:  # e.g. a header value that is not ASCII
        raise DeliveryFailed(f"{what}: cannot be sent ({type(exc).__name__})", False) from None
    except httpx.TransportError as exc:
        # str(exc) may name the URL (which holds a token for Telegram and Slack webhooks).
        raise DeliveryFailed(f"{what}: connection failed ({type(exc).__name__})", True) from None


def _status_failure(response: httpx.Response, what: str, code: str | None) -> DeliveryFailed:
    status = response.status_code
    detail = f" {code}" if code else ""
    message = f"{what}: HTTP {status}{detail}"
    if status == 429:
        return DeliveryFailed(message, True, _retry_after(response.headers.get("retry-after")))
    if status >= 500 or status == 408:
        return DeliveryFailed(message, True)
    return DeliveryFailed(message, False)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _config_url(config: Mapping[str, Any], key: str, what: str) -> str:
    url = config.get(key)
    if not isinstance(url, str) or not url:
        raise DeliveryFailed(f"{what}: no {key} configured", False)
    return url


async def send_slack(
    http: httpx.AsyncClient,
    config: Mapping[str, Any],
    secrets: Mapping[str, str],
    reply: Mapping[str, Any],
    text: str,
    *,
    base_url: str | None = None,
) -> None:
    """With a `bot_token` secret: `chat.postMessage` into the message's channel (and thread);
    else the channel's incoming webhook (`config.webhook_url`)."""
    token = secrets.get("bot_token")
    if token:
        await _slack_post_message(http, token, reply, text, base_url or SLACK_API)
        return
    what = "slack webhook"
    url = _config_url(config, "webhook_url", what)
    payload: dict[str, Any] = {"text": text}
    if reply.get("thread_ts"):
        payload["thread_ts"] = reply["thread_ts"]
    response = await _post(http, url, payload, what)
    if not response.is_success:
        raise _status_failure(response, what, _short_code(response.text))


async def _slack_post_message(
    http: httpx.AsyncClient, token: str, reply: Mapping[str, Any], text: str, base: str
) -> None:
    what = "slack chat.postMessage"
    channel = reply.get("channel")
    if not channel:
        raise DeliveryFailed(f"{what}: no channel to answer in", False)
    payload: dict[str, Any] = {"channel": channel, "text": text}
    if reply.get("thread_ts"):
        payload["thread_ts"] = reply["thread_ts"]
    response = await _post(
        http,
        f"{base.rstrip('/')}/chat.postMessage",
        payload,
        what,
        headers={"authorization": f"Bearer {token}"},
    )
    data = _json(response)
    if not response.is_success:
        raise _status_failure(response, what, _short_code(data.get("error")))
    if data.get("ok") is True:
        return
    # Slack reports most failures as 200 {"ok": false, "error": "<code>"}.
    code = _short_code(data.get("error")) or "unknown_error"
    retry_after = _retry_after(response.headers.get("retry-after"))
    raise DeliveryFailed(f"{what}: {code}", code in _SLACK_RETRYABLE, retry_after)


def _teams_payload(url: str, text: str) -> dict[str, Any]:
    """A Power Automate / Logic Apps "Workflows" webhook (the successor of Office 365
    connectors) only takes a message with an Adaptive Card attachment; a classic Office 365
    connector webhook takes the simplest MessageCard, `{"text": ...}` (Markdown)."""
    if "/workflows/" in urlsplit(url).path:
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard",
            "version": "1.4",
            "body": [{"type": "TextBlock", "text": text, "wrap": True}],
        }
        return {
            "type": "message",
            "attachments": [
                {
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "contentUrl": None,
                    "content": card,
                }
            ],
        }
    return {"text": text}


def _truncate_bytes(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    note = "\n\n(answer truncated)"
    return data[: limit - len(note.encode())].decode(errors="ignore") + note


async def send_teams(
    http: httpx.AsyncClient,
    config: Mapping[str, Any],
    secrets: Mapping[str, str],
    reply: Mapping[str, Any],
    text: str,
    *,
    base_url: str | None = None,
) -> None:
    """Posts the answer to the channel's incoming webhook (`config.webhook_url`). The webhook
    names one Teams channel: the answer goes there, not into the originating conversation
    (that would need the Bot Connector API and the bot's credentials)."""
    what = "teams webhook"
    url = _config_url(config, "webhook_url", what)
    response = await _post(
        http, url, _teams_payload(url, _truncate_bytes(text, TEAMS_MAX_BYTES)), what
    )
    if not response.is_success:
        raise _status_failure(response, what, None)
    # An Office 365 connector answers 200 even when Teams refused the message, with the
    # reason as text: "Webhook message delivery failed with error: Microsoft Teams endpoint
    # returned HTTP error 429 with ContextId ...".
    refused = _TEAMS_REFUSED.search(response.text)
    if refused is not None:
        status = int(refused.group(1))
        raise DeliveryFailed(
            f"{what}: delivery failed (Teams answered HTTP {status})",
            status == 429 or status >= 500,
        )


def _utf16_prefix(text: str, limit: int) -> int:
    """The length of the longest prefix of `text` within `limit` UTF-16 code units."""
    units = 0
    for i, ch in enumerate(text):
        units += 2 if ord(ch) > 0xFFFF else 1
        if units > limit:
            return i
    return len(text)


def _telegram_chunks(text: str, limit: int = TELEGRAM_MAX_UNITS) -> list[str]:
    """`text` in pieces Telegram accepts, cut at a line break (else a space) in the second
    half of each piece when there is one."""
    chunks: list[str] = []
    rest = text
    while (end := _utf16_prefix(rest, limit)) < len(rest):
        cut = max(rest.rfind("\n", 0, end), rest.rfind(" ", 0, end))
        if cut < end // 2:
            cut = end
        chunks.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    chunks.append(rest)
    return [c for c in chunks if c.strip()] or [text]


async def send_telegram(
    http: httpx.AsyncClient,
    config: Mapping[str, Any],
    secrets: Mapping[str, str],
    reply: Mapping[str, Any],
    text: str,
    *,
    base_url: str | None = None,
) -> None:
    """`sendMessage` to the chat the message came from, as a reply to it. An answer longer
    than Telegram's 4096 characters goes out as several messages (a retry after a partial
    failure sends the earlier parts again). The bot token is part of the URL: it never
    appears in an error."""
    what = "telegram sendMessage"
    token = secrets.get("bot_token")
    if not token:
        raise DeliveryFailed(f"{what}: no bot_token configured", False)
    chat_id = reply.get("chat_id")
    if chat_id is None:
        raise DeliveryFailed(f"{what}: no chat to answer in", False)
    url = f"{(base_url or TELEGRAM_API).rstrip('/')}/bot{token}/sendMessage"
    hide = {"bot_token": token}
    for n, part in enumerate(_telegram_chunks(text)):
        payload: dict[str, Any] = {"chat_id": chat_id, "text": part}
        if n == 0 and reply.get("message_id") is not None:
            payload["reply_to_message_id"] = reply["message_id"]
            payload["allow_sending_without_reply"] = True
        try:
            response = await _post(http, url, payload, what)
        except DeliveryFailed as exc:
            raise DeliveryFailed(_redact(exc.message, hide), exc.retryable) from None
        data = _json(response)
        if response.is_success and data.get("ok") is True:
            continue
        raise _telegram_failure(response, data, what, hide)


def _telegram_failure(
    response: httpx.Response, data: Mapping[str, Any], what: str, hide: Mapping[str, str]
) -> DeliveryFailed:
    code = data.get("error_code")
    status = code if isinstance(code, int) and code >= 400 else response.status_code
    description = data.get("description")
    detail = ""
    if isinstance(description, str) and description:
        detail = ": " + _redact(description[:200], hide)
    message = f"{what}: HTTP {status}{detail}"
    if status == 429:
        after = _dict(data.get("parameters")).get("retry_after")
        retry_after = (
            float(after)
            if isinstance(after, int | float) and not isinstance(after, bool)
            else _retry_after(response.headers.get("retry-after"))
        )
        return DeliveryFailed(message, True, retry_after)
    if status >= 500 or status == 408 or (response.is_success and not data):
        return DeliveryFailed(message, True)
    return DeliveryFailed(message, False)


async def send_webhook(
    http: httpx.AsyncClient,
    config: Mapping[str, Any],
    secrets: Mapping[str, str],
    reply: Mapping[str, Any],
    text: str,
    *,
    base_url: str | None = None,
) -> None:
    """POSTs `{text, conversation, user, in_reply_to}` (`in_reply_to`: the inbound message's
    metadata) to `config.callback_url`. Without a callback URL there is nowhere to deliver:
    a non-retryable failure (synchronous callers get the answer in the HTTP response and
    never reach this)."""
    what = "webhook callback"
    url = _config_url(config, "callback_url", what)
    payload = {
        "text": text,
        "conversation": reply.get("conversation"),
        "user": reply.get("user"),
        "in_reply_to": reply.get("metadata") or {},
    }
    response = await _post(http, url, payload, what)
    if not response.is_success:
        raise _status_failure(response, what, None)
