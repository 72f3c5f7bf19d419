"""A real loopback HTTP server that plays the Telegram Bot API for channel tests.

    with TelegramFake() as tg:                              # or `async with`
        ...  # send_telegram(..., secrets={"bot_token": tg.bot_token}, base_url=tg.url)
        tg.sent[-1]            # the sendMessage bodies accepted, in order
        tg.requests[-1]        # every request: method, path, headers, raw body

Routes:
- `POST /bot<token>/sendMessage` (JSON or form): with another token, Telegram's `401
  {"ok": false, "error_code": 401, "description": "Unauthorized"}`; no `chat_id`, empty
  `text` or a text over 4096 characters (UTF-16 units): `400 Bad Request: ...`; otherwise
  `{"ok": true, "result": {message_id, from, chat, date, text[, reply_to_message]}}`.
- anything else: `404 {"ok": false, "error_code": 404, "description": "Not Found"}`.

Failures: `fail_next(n, status, retry_after=, error=)` makes the next n sendMessage calls
fail with Telegram's error body (`error` as description); 429 carries
`parameters.retry_after`; 502 answers nginx's HTML page, as Telegram's front does.

`text_update(text, ...)` builds an `Update` with a text message; `photo_update` and
`edited_update` build updates without a new text message.

Buttons (issue 32; core.telegram.org/bots/api#inlinekeyboardmarkup, #callbackquery,
#editmessagetext, #answercallbackquery): sendMessage keeps `reply_markup` (an
`inline_keyboard` whose `callback_data` is over 64 bytes is `400 Bad Request:
BUTTON_DATA_INVALID`) and returns it in the message; `editMessageText` edits a message this
fake sent (`400 Bad Request: message to edit not found` otherwise), recorded in `edited`;
`answerCallbackQuery` (`callback_query_id` required) answers `true`, recorded in `answered`.
`callback_update(data, ...)` builds an `Update` with the `callback_query` of a press.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any
from urllib.parse import parse_qsl

from tests.fakes._channel_fake import ChannelFake
from tests.fakes._loopback import RecordedRequest, Send

__all__ = [
    "TOKEN",
    "TelegramFake",
    "callback_update",
    "edited_update",
    "photo_update",
    "text_update",
]

TOKEN = "110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
_updates = itertools.count(10000)
_messages = itertools.count(1365)
_NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.18.0</center>\r\n"
    b"</body>\r\n</html>\r\n"
)


def _chat(chat_id: int, chat_type: str) -> dict[str, Any]:
    if chat_type == "private":
        return {
            "id": chat_id,
            "first_name": "Test",
            "last_name": "Lastname",
            "username": "testuser",
            "type": "private",
        }
    return {"id": chat_id, "title": "Ops team", "type": chat_type}


def _message(text: str | None, chat_id: int, chat_type: str, user_id: int) -> dict[str, Any]:
    message: dict[str, Any] = {
        "message_id": next(_messages),
        "from": {
            "id": user_id,
            "is_bot": False,
            "first_name": "Test",
            "last_name": "Lastname",
            "username": "testuser",
            "language_code": "en",
        },
        "chat": _chat(chat_id, chat_type),
        "date": int(time.time()),
    }
    if text is not None:
        message["text"] = text
    return message


def text_update(
    text: str,
    *,
    chat_id: int = 1111111,
    chat_type: str = "private",
    user_id: int = 1111111,
    update_id: int | None = None,
) -> Any:
    """An Update with a new text message (`chat_type`: private, group, supergroup)."""
    return {
        "update_id": next(_updates) if update_id is None else update_id,
        "message": _message(text, chat_id, chat_type, user_id),
    }


def photo_update(*, chat_id: int = 1111111) -> Any:
    message = _message(None, chat_id, "private", chat_id)
    message["photo"] = [
        {
            "file_id": "AgACAgIAAxkBAAIBZ2Zl",
            "file_unique_id": "AQADr7gxG",
            "file_size": 1453,
            "width": 90,
            "height": 67,
        }
    ]
    return {"update_id": next(_updates), "message": message}


def edited_update(text: str, *, chat_id: int = 1111111) -> Any:
    message = _message(text, chat_id, "private", chat_id)
    message["edit_date"] = message["date"] + 5
    return {"update_id": next(_updates), "edited_message": message}


def callback_update(
    data: str,
    *,
    user_id: int = 1111111,
    chat_id: int = -1001234567890,
    message_id: int = 77,
    query_id: str | None = None,
) -> Any:
    """An Update with the `callback_query` of a pressed inline button (`data` its
    callback_data) on the bot's message `message_id`."""
    message = _message("Approval needed", chat_id, "supergroup", 0)
    message["message_id"] = message_id
    message["from"] = {
        "id": int(TOKEN.split(":")[0]),
        "is_bot": True,
        "first_name": "Test Bot",
        "username": "test_orchestrator_bot",
    }
    return {
        "update_id": next(_updates),
        "callback_query": {
            "id": query_id or str(4382000000000000000 + next(_updates)),
            "from": {
                "id": user_id,
                "is_bot": False,
                "first_name": "Test",
                "username": "testuser",
                "language_code": "en",
            },
            "message": message,
            "chat_instance": "-5286126371829379821",
            "data": data,
        },
    }


def _units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


class TelegramFake(ChannelFake):
    label = "Telegram"
    # The Bot API server's answers (tdlib/telegram-bot-api HttpConnection.cpp send_response):
    # `Content-Type: application/json` with no charset, a Content-Length, keep-alive, and
    # `Retry-After` besides `parameters.retry_after` when it limits.
    json_type = "application/json"

    def __init__(self, *, bot_token: str = TOKEN) -> None:
        super().__init__()
        self.bot_token = bot_token
        self.bot_id = int(bot_token.split(":", 1)[0])
        self.sent: list[dict[str, Any]] = []
        self.edited: list[dict[str, Any]] = []
        self.answered: list[dict[str, Any]] = []
        self._messages: set[tuple[str, int]] = set()

    def reset(self) -> None:
        super().reset()
        self.sent.clear()
        self.edited.clear()
        self.answered.clear()

    @classmethod
    async def _error(cls, send: Send, code: int, description: str, **parameters: Any) -> None:
        body: dict[str, Any] = {"ok": False, "error_code": code, "description": description}
        headers: list[tuple[str, str]] = []
        if parameters:
            body["parameters"] = parameters
        if parameters.get("retry_after"):
            headers.append(("Retry-After", str(parameters["retry_after"])))
        await cls.send_json(send, code, body, headers)

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        prefix, _, method = request.path.rpartition("/")
        if not prefix.startswith("/bot") or request.method not in ("GET", "POST"):
            await self._error(send, 404, "Not Found")
        elif prefix != f"/bot{self.bot_token}":
            await self._error(send, 401, "Unauthorized")
        elif method == "sendMessage":
            await self._send_message(request, send)
        elif method == "editMessageText":
            await self._edit(request, send)
        elif method == "answerCallbackQuery":
            body = self._body(request)
            if not body.get("callback_query_id"):
                await self._error(send, 400, "Bad Request: query is too old or query ID is invalid")
                return
            self.answered.append(body)
            await self.send_json(send, 200, {"ok": True, "result": True})
        else:
            await self._error(send, 404, "Not Found")

    async def _send_message(self, request: RecordedRequest, send: Send) -> None:
        failure = await self.next_failure()
        if failure is not None:
            if failure.status == 502:
                await self.send_body(send, 502, _NGINX_502, [("Content-Type", "text/html")])
            elif failure.status == 429:
                after = failure.retry_after or 1
                description = failure.error or f"Too Many Requests: retry after {after}"
                await self._error(send, 429, description, retry_after=after)
            else:
                await self._error(send, failure.status, failure.error or "Internal Server Error")
            return
        body = self._body(request)
        chat_id, text = body.get("chat_id"), body.get("text")
        if chat_id in (None, ""):
            await self._error(send, 400, "Bad Request: chat_id is empty")
            return
        if not isinstance(text, str) or not text.strip():
            await self._error(send, 400, "Bad Request: message text is empty")
            return
        if _units(text) > 4096:
            await self._error(send, 400, "Bad Request: message is too long")
            return
        if not _markup_ok(body.get("reply_markup")):
            await self._error(send, 400, "Bad Request: BUTTON_DATA_INVALID")
            return
        self.sent.append(body)
        chat_type = "private" if int(chat_id) > 0 else "supergroup"
        result: dict[str, Any] = {
            "message_id": next(_messages),
            "from": {
                "id": self.bot_id,
                "is_bot": True,
                "first_name": "Test Bot",
                "username": "test_orchestrator_bot",
            },
            "chat": _chat(int(chat_id), chat_type),
            "date": int(time.time()),
            "text": text,
        }
        if body.get("reply_to_message_id") is not None:
            result["reply_to_message"] = {
                "message_id": int(body["reply_to_message_id"]),
                "chat": _chat(int(chat_id), chat_type),
                "date": int(time.time()) - 1,
            }
        if body.get("reply_markup"):
            result["reply_markup"] = body["reply_markup"]
        self._messages.add((str(chat_id), result["message_id"]))
        await self.send_json(send, 200, {"ok": True, "result": result})

    @staticmethod
    def _body(request: RecordedRequest) -> dict[str, Any]:
        if request.headers.get("content-type", "").startswith("application/json"):
            body: dict[str, Any] = json.loads(request.raw or b"{}")
            return body
        return dict(parse_qsl(request.raw.decode()))

    async def _edit(self, request: RecordedRequest, send: Send) -> None:
        failure = await self.next_failure()
        if failure is not None:
            await self._error(send, failure.status, failure.error or "Internal Server Error")
            return
        body = self._body(request)
        key = (str(body.get("chat_id")), body.get("message_id"))
        if key not in self._messages:
            await self._error(send, 400, "Bad Request: message to edit not found")
            return
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            await self._error(send, 400, "Bad Request: message text is empty")
            return
        self.edited.append(body)
        result: dict[str, Any] = {
            "message_id": body["message_id"],
            "from": {"id": self.bot_id, "is_bot": True, "first_name": "Test Bot"},
            "chat": _chat(int(body["chat_id"]), "supergroup"),
            "date": int(time.time()) - 5,
            "edit_date": int(time.time()),
            "text": text,
        }
        if (body.get("reply_markup") or {}).get("inline_keyboard"):
            result["reply_markup"] = body["reply_markup"]
        await self.send_json(send, 200, {"ok": True, "result": result})


def _markup_ok(markup: Any) -> bool:
    """Every inline button's callback_data within Telegram's 1-64 bytes."""
    if not isinstance(markup, dict):
        return True
    for row in markup.get("inline_keyboard") or []:
        for button in row:
            data = button.get("callback_data")
            if data is not None and not 1 <= len(str(data).encode()) <= 64:
                return False
    return True
