"""A real loopback HTTP server that plays Slack for channel tests, plus what Slack sends us.

    with SlackFake(bot_token="xoxb-test") as slack:     # or `async with`
        config = {"webhook_url": slack.webhook_url}
        ...  # send_slack(..., base_url=slack.api_url)
        slack.posted[-1]          # the JSON bodies Slack accepted, in order
        slack.requests[-1]        # every request: method, path, headers, raw body

Routes:
- `POST /services/T000/B000/XXXX` (`webhook_url`, an incoming webhook): answers `200 ok`
  (text/html, as Slack does); another `/services/...` path gets `404 no_service`; a body
  without `text` gets `400 no_text`.
- `POST /api/chat.postMessage` (`api_url` + "/chat.postMessage"): JSON or form body. Without
  `Authorization: Bearer <bot_token>`: `200 {"ok": false, "error": "not_authed"}` (no header)
  or `"invalid_auth"` (another token); no `channel`: `channel_not_found`; no `text`: `no_text`.
  Otherwise `{"ok": true, "channel", "ts", "message": {...}}`.

Web API answers are `application/json; charset=utf-8` with the JSON escaped as Slack's
servers write it (non-ASCII as `\\uXXXX`, `/` as `\\/`); webhook answers `text/html`, no
charset (api.slack.com/messaging/webhooks#handling_errors).

Failures: `fail_next(n, status, retry_after=, error=)` makes the next n requests (either
route) fail: 429 answers with `Retry-After`; on the Web API a 4xx/5xx carries
`{"ok": false, "error": <error>}`, and `status=200` gives Slack's `{"ok": false, "error"}`
with HTTP 200 (e.g. `error="ratelimited"` or `"channel_not_found"`); the webhook answers the
error code as text.

`sign(secret, body, timestamp)` returns the headers Slack sends with an Events API request;
`url_verification`, `message_event`, `app_mention_event` and `bot_message_event` build its
documented JSON bodies.

Interactivity (issue 32; api.slack.com/interactivity/handling, docs.slack.dev
reference/interaction-payloads/block_actions-payload, api.slack.com/methods/chat.update):
- `POST /api/chat.update` (bearer as chat.postMessage): `channel` and `ts` of a message this
  fake posted, else `channel_not_found` / `message_not_found`; `{"ok": true, "channel", "ts",
  "text", "message"}`. Accepted bodies in `updated`.
- `POST /actions/<team>/<id>/<token>` (a `response_url`, `slack.response_url()`): JSON
  `{"response_type", "replace_original", "text"}` recorded in `responses`, answered
  `{"ok": true}`.
- `block_actions(action_id, value, user=, ...)` builds a `block_actions` payload as Slack
  sends it; `interaction_body(payload)` the form body (`payload=<JSON>`, URL-encoded);
  `sign_form(secret, body)` its headers (the same v0 signature, form content type).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode

from tests.fakes._channel_fake import ChannelFake, Failure
from tests.fakes._loopback import RecordedRequest, Send

__all__ = [
    "BOT_USER",
    "SlackFake",
    "app_mention_event",
    "block_actions",
    "bot_message_event",
    "interaction_body",
    "message_event",
    "sign",
    "sign_form",
    "url_verification",
]

TEAM = "T0TEAM0001"
APP = "A0APP00001"
BOT_USER = "U0BOT00001"
BOT_ID = "B0BOT00001"
WEBHOOK_PATH = "/services/T000/B000/XXXXXXXXXXXXXXXXXXXXXXXX"
_events = itertools.count(1)
_ts = itertools.count(1)


def sign(
    secret: str, body: bytes, timestamp: int | str | None = None, *, retry_num: int | None = None
) -> dict[str, str]:
    """The headers of a signed Events API request: `v0=` HMAC-SHA256 of
    `v0:<timestamp>:<body>` keyed with the signing secret."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={digest}",
    }
    if retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(retry_num)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    return headers


def sign_form(secret: str, body: bytes, timestamp: int | str | None = None) -> dict[str, str]:
    """The headers of a signed interaction request (form-encoded, signed like the rest)."""
    headers = sign(secret, body, timestamp)
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    return headers


def interaction_body(payload: Any) -> bytes:
    """`payload=<JSON>`, URL-encoded, as Slack posts an interaction."""
    return urlencode({"payload": json.dumps(payload)}).encode()


_actions = itertools.count(1)


def block_actions(
    action_id: str,
    value: str,
    *,
    user: str = "U0USER0001",
    channel: str = "C0CHAN0001",
    message_ts: str = "1700000000.000100",
    response_url: str = "https://hooks.slack.com/actions/T0TEAM0001/1/x",
    action_ts: str | None = None,
) -> Any:
    """A `block_actions` payload: a button of a message pressed."""
    stamp = action_ts or f"{int(time.time())}.{next(_actions):06d}"
    return {
        "type": "block_actions",
        "user": {"id": user, "username": "megan", "name": "megan", "team_id": TEAM},
        "api_app_id": APP,
        "token": "Shh_its_a_seekrit",
        "container": {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel,
            "is_ephemeral": False,
        },
        "trigger_id": "12466734323.1395872398.7ad2ec6cf5a2ef3b7fbd32de0d5f1e8a",
        "team": {"id": TEAM, "domain": "example"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": "ops"},
        "message": {"type": "message", "ts": message_ts, "bot_id": BOT_ID, "text": "..."},
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [
            {
                "action_id": action_id,
                "block_id": value,
                "text": {"type": "plain_text", "text": action_id.title(), "emoji": True},
                "value": value,
                "style": "primary" if action_id == "approve" else "danger",
                "type": "button",
                "action_ts": stamp,
            }
        ],
    }


def url_verification(
    challenge: str = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
) -> Any:
    return {"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge, "type": "url_verification"}


def _ts_now() -> str:
    return f"{int(time.time())}.{next(_ts):06d}"


def _envelope(event: dict[str, Any], event_id: str | None) -> dict[str, Any]:
    return {
        "token": "XXYYZZ",
        "team_id": TEAM,
        "api_app_id": APP,
        "event": event,
        "type": "event_callback",
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": TEAM,
                "user_id": BOT_USER,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "event_id": event_id or f"Ev{next(_events):08d}",
        "event_context": "4-eyJldCI6Im1lc3NhZ2UiLCJ0aWQiOiJUMFRFQU0wMDAxIn0",
        "event_time": int(time.time()),
        "is_ext_shared_channel": False,
    }


def message_event(
    text: str,
    *,
    channel: str = "C0CHAN0001",
    user: str = "U0USER0001",
    thread_ts: str | None = None,
    event_id: str | None = None,
    channel_type: str = "channel",
    subtype: str | None = None,
) -> Any:
    """An `event_callback` carrying a user's `message` event."""
    ts = _ts_now()
    event: dict[str, Any] = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts,
        "client_msg_id": "5f1c2a4e-6b0e-4f3a-9d51-2a3c4b5d6e7f",
        "team": TEAM,
        "event_ts": ts,
        "channel_type": channel_type,
    }
    if subtype is not None:
        event["subtype"] = subtype
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    return _envelope(event, event_id)


def app_mention_event(text: str, *, channel: str = "C0CHAN0001", user: str = "U0USER0001") -> Any:
    """An `app_mention`: the text starts with the mention of the app's bot user."""
    ts = _ts_now()
    event = {
        "type": "app_mention",
        "user": user,
        "text": f"<@{BOT_USER}> {text}",
        "ts": ts,
        "team": TEAM,
        "channel": channel,
        "event_ts": ts,
    }
    return _envelope(event, None)


def bot_message_event(text: str, *, channel: str = "C0CHAN0001", own: bool = True) -> Any:
    """A bot's message: our own answer (user = our bot user, with `bot_id`), or another
    integration's `bot_message`."""
    ts = _ts_now()
    event: dict[str, Any]
    if own:
        event = {
            "type": "message",
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "app_id": APP,
            "text": text,
            "ts": ts,
            "team": TEAM,
            "bot_profile": {"id": BOT_ID, "app_id": APP, "name": "orchestrator", "deleted": False},
            "channel": channel,
            "event_ts": ts,
            "channel_type": "channel",
        }
    else:
        event = {
            "type": "message",
            "subtype": "bot_message",
            "text": text,
            "ts": ts,
            "username": "deploy-bot",
            "bot_id": "B0OTHER001",
            "channel": channel,
            "event_ts": ts,
            "channel_type": "channel",
        }
    return _envelope(event, None)


class SlackFake(ChannelFake):
    label = "Slack"

    @classmethod
    def json_text(cls, obj: Any) -> str:
        return json.dumps(obj).replace("/", "\\/")

    def __init__(self, *, bot_token: str = "xoxb-0000000000-0000000000000-test") -> None:
        super().__init__()
        self.bot_token = bot_token
        self.webhook_url = f"{self.url}{WEBHOOK_PATH}"
        self.api_url = f"{self.url}/api"
        self.posted: list[dict[str, Any]] = []
        self.updated: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []
        self._messages: set[tuple[str, str]] = set()

    def response_url(self, n: int = 1) -> str:
        return f"{self.url}/actions/{TEAM}/{n}/resp0nse-t0ken"

    def reset(self) -> None:
        super().reset()
        self.posted.clear()
        self.updated.clear()
        self.responses.clear()

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if request.method == "POST" and request.path.startswith("/services/"):
            await self._webhook(request, send)
        elif request.method == "POST" and request.path == "/api/chat.postMessage":
            await self._post_message(request, send)
        elif request.method == "POST" and request.path == "/api/chat.update":
            await self._update(request, send)
        elif request.method == "POST" and request.path.startswith("/actions/"):
            try:
                body = request.json
            except ValueError:
                body = None
            if not isinstance(body, dict) or not (body.get("text") or body.get("blocks")):
                await self._text(send, 400, "no_text")
                return
            self.responses.append(body)
            await self.send_json(send, 200, {"ok": True})
        else:
            await self.send_json(send, 404, {"ok": False, "error": "unknown_method"})

    async def _text(self, send: Send, status: int, text: str, headers: Any = ()) -> None:
        await self.send_body(send, status, text.encode(), [("content-type", "text/html"), *headers])

    async def _webhook(self, request: RecordedRequest, send: Send) -> None:
        failure = await self.next_failure()
        if failure is not None:
            await self._text(send, failure.status, failure.error or "rollup_error", _after(failure))
            return
        if request.path != WEBHOOK_PATH:
            await self._text(send, 404, "no_service")
            return
        try:
            body = request.json
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await self._text(send, 400, "invalid_payload")
            return
        if not body.get("text") and not body.get("blocks"):
            await self._text(send, 400, "no_text")
            return
        self.posted.append(body)
        await self._text(send, 200, "ok")

    async def _post_message(self, request: RecordedRequest, send: Send) -> None:
        failure = await self.next_failure()
        if failure is not None:
            error = failure.error or ("ratelimited" if failure.status == 429 else "internal_error")
            await self.send_json(
                send, failure.status, {"ok": False, "error": error}, _after(failure)
            )
            return
        auth = request.headers.get("authorization")
        if not auth:
            await self.send_json(send, 200, {"ok": False, "error": "not_authed"})
            return
        if auth != f"Bearer {self.bot_token}":
            await self.send_json(send, 200, {"ok": False, "error": "invalid_auth"})
            return
        if request.headers.get("content-type", "").startswith("application/json"):
            body = json.loads(request.raw or b"{}")
        else:
            body = dict(parse_qsl(request.raw.decode()))
        if not body.get("channel"):
            await self.send_json(send, 200, {"ok": False, "error": "channel_not_found"})
            return
        if not body.get("text") and not body.get("blocks"):
            await self.send_json(send, 200, {"ok": False, "error": "no_text"})
            return
        self.posted.append(body)
        ts = _ts_now()
        message = {
            "bot_id": BOT_ID,
            "type": "message",
            "text": body["text"],
            "user": BOT_USER,
            "ts": ts,
            "app_id": APP,
            "team": TEAM,
        }
        if body.get("thread_ts"):
            message["thread_ts"] = body["thread_ts"]
        if body.get("blocks"):
            message["blocks"] = body["blocks"]
        self._messages.add((body["channel"], ts))
        await self.send_json(
            send, 200, {"ok": True, "channel": body["channel"], "ts": ts, "message": message}
        )

    async def _update(self, request: RecordedRequest, send: Send) -> None:
        failure = await self.next_failure()
        if failure is not None:
            error = failure.error or ("ratelimited" if failure.status == 429 else "internal_error")
            await self.send_json(
                send, failure.status, {"ok": False, "error": error}, _after(failure)
            )
            return
        auth = request.headers.get("authorization")
        if auth != f"Bearer {self.bot_token}":
            await self.send_json(
                send, 200, {"ok": False, "error": "not_authed" if not auth else "invalid_auth"}
            )
            return
        body = json.loads(request.raw or b"{}")
        channel, ts = body.get("channel"), body.get("ts")
        if not channel:
            await self.send_json(send, 200, {"ok": False, "error": "channel_not_found"})
            return
        if (channel, ts) not in self._messages:
            await self.send_json(send, 200, {"ok": False, "error": "message_not_found"})
            return
        if not body.get("text") and not body.get("blocks"):
            await self.send_json(send, 200, {"ok": False, "error": "no_text"})
            return
        self.updated.append(body)
        message = {"text": body.get("text", ""), "user": BOT_USER, "bot_id": BOT_ID}
        if body.get("blocks"):
            message["blocks"] = body["blocks"]
        await self.send_json(
            send,
            200,
            {
                "ok": True,
                "channel": channel,
                "ts": ts,
                "text": body.get("text", ""),
                "message": message,
            },
        )


def _after(failure: Failure) -> list[tuple[str, str]]:
    return [("retry-after", str(failure.retry_after))] if failure.retry_after is not None else []
