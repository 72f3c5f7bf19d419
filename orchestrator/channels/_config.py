"""A channel's config checked for its type (400 naming the field `config.<key>`): the
settings each platform takes, which of them are required, and their formats. Its own module
so that the store (orchestrator/channels/_store.py) holds only records and their queries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from orchestrator.errors import Unprocessable, ValidationFailed

CHANNEL_TYPES = ("slack", "teams", "telegram", "webhook")

_TELEGRAM_TOKEN = re.compile(r"^\d{1,20}:[A-Za-z0-9_-]{20,100}$")
_TELEGRAM_SECRET = re.compile(r"^[A-Za-z0-9_-]{1,256}$")


# --- config validation -------------------------------------------------------------------


def bad_config(field_name: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"config.{field_name}: {message}",
        extra={"fields": [{"field": f"config.{field_name}", "message": message}]},
    )


def _url(config: Mapping[str, Any], key: str, *, required: bool) -> None:
    value = config.get(key)
    if value is None:
        if required:
            raise bad_config(key, "required (an http or https URL)")
        return
    if not isinstance(value, str) or len(value) > 2048 or not value.isprintable():
        raise bad_config(key, "an http or https URL")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise bad_config(key, "an http or https URL") from None
    if parts.scheme not in ("http", "https") or not parts.netloc or not parts.hostname:
        raise bad_config(key, "an http or https URL")


def _string(config: Mapping[str, Any], key: str, *, required: bool, max_len: int = 512) -> None:
    value = config.get(key)
    if value is None:
        if required:
            raise bad_config(key, "required")
        return
    if not isinstance(value, str) or not value.strip() or len(value) > max_len:
        raise bad_config(key, f"a non-empty string of at most {max_len} characters")
    if not value.isprintable() or (key in _HEADER_VALUES and not value.isascii()):
        raise bad_config(
            key, "printable characters only" + (" (ASCII)" if key in _HEADER_VALUES else "")
        )


_HEADER_VALUES = frozenset({"bot_token", "signing_secret"})  # sent in or keyed on headers

# Issue 32: every type takes `approvers` (the platform users who may decide interventions
# posted to it) and says where questions go: Slack `notify_channel`, Telegram
# `notify_chat_id`, Teams `notify_conversation_id` (through the bot: `app_password`,
# `service_url`), a generic webhook its `callback_url`.
MAX_APPROVERS = 100
_ALLOWED: dict[str, frozenset[str]] = {
    "slack": frozenset(
        {"webhook_url", "signing_secret", "bot_token", "approvers", "notify_channel"}
    ),
    "teams": frozenset(
        {
            "webhook_url",
            "tenant_id",
            "app_id",
            "approvers",
            "app_password",
            "service_url",
            "notify_conversation_id",
        }
    ),
    "telegram": frozenset({"bot_token", "chat_ids", "secret_token", "approvers", "notify_chat_id"}),
    "webhook": frozenset({"callback_url", "approvers"}),
}
_CHAT_ID = re.compile(r"-?\d{1,20}|@[A-Za-z0-9_]{1,64}")


def check_type(kind: Any) -> str:
    if not isinstance(kind, str) or kind not in CHANNEL_TYPES:
        raise Unprocessable(
            f"unsupported channel type {kind!r}: one of {', '.join(CHANNEL_TYPES)}",
            extra={"fields": [{"field": "type", "message": "unsupported channel type"}]},
        )
    return kind


def validate_config(kind: str, config: Any) -> dict[str, Any]:
    """The config checked for its type (400 naming the field); `chat_ids` normalised to
    strings."""
    if not isinstance(config, dict):
        raise ValidationFailed(
            "config: an object", extra={"fields": [{"field": "config", "message": "an object"}]}
        )
    unknown = sorted(set(config) - _ALLOWED[kind])
    if unknown:
        raise bad_config(
            unknown[0], f"not a {kind} setting (allowed: {', '.join(sorted(_ALLOWED[kind]))})"
        )
    out = dict(config)
    if "approvers" in out:
        out["approvers"] = _approvers(out["approvers"])
    if kind == "slack":
        _string(out, "signing_secret", required=True)
        _string(out, "bot_token", required=False)
        _url(out, "webhook_url", required="bot_token" not in out)
        _string(out, "notify_channel", required=False, max_len=64)
        if "notify_channel" in out and "bot_token" not in out:
            raise bad_config("notify_channel", "needs bot_token (questions are posted by the bot)")
    elif kind == "teams":
        _url(out, "webhook_url", required=True)
        _string(out, "tenant_id", required=True, max_len=128)
        _string(out, "app_id", required=False, max_len=128)
        _string(out, "app_password", required=False)
        _url(out, "service_url", required=False)
        _string(out, "notify_conversation_id", required=False)
        if "notify_conversation_id" in out:
            for needed in ("app_password", "service_url"):
                if needed not in out:
                    raise bad_config(
                        needed, "required with notify_conversation_id (the bot posts questions)"
                    )
    elif kind == "telegram":
        token = out.get("bot_token")
        if not isinstance(token, str) or not _TELEGRAM_TOKEN.match(token):
            raise bad_config(
                "bot_token", "required: a Telegram bot token (<digits>:<35 characters>)"
            )
        chats = out.get("chat_ids")
        if chats is not None:
            if not isinstance(chats, list) or len(chats) > 1000:
                raise bad_config("chat_ids", "an array of chat ids (strings)")
            normal: list[str] = []
            for chat in chats:
                if isinstance(chat, bool) or not isinstance(chat, str | int):
                    raise bad_config("chat_ids", "an array of chat ids (strings)")
                text = str(chat).strip()
                if not _CHAT_ID.fullmatch(text):
                    raise bad_config("chat_ids", f"{text!r} is not a chat id")
                normal.append(text)
            out["chat_ids"] = normal
        secret = out.get("secret_token")
        if secret is not None and (
            not isinstance(secret, str) or not _TELEGRAM_SECRET.match(secret)
        ):
            raise bad_config("secret_token", "1-256 characters of A-Z a-z 0-9 _ -")
        notify = out.get("notify_chat_id")
        if notify is not None:
            text = "" if isinstance(notify, bool) else str(notify).strip()
            if not isinstance(notify, str | int) or not _CHAT_ID.fullmatch(text):
                raise bad_config("notify_chat_id", "a chat id")
            out["notify_chat_id"] = text
    else:
        _url(out, "callback_url", required=False)
    return out


def _approvers(value: Any) -> list[str]:
    """Platform user ids (Slack `U…`, Telegram numeric ids, Teams AAD object ids, any name a
    webhook's receiver uses), as strings, at most MAX_APPROVERS."""
    message = f"an array of at most {MAX_APPROVERS} platform user ids (strings of 1-256)"
    if not isinstance(value, list) or len(value) > MAX_APPROVERS:
        raise bad_config("approvers", message)
    out: list[str] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise bad_config("approvers", message)
        text = str(item).strip()
        if not text or len(text) > 256 or not text.isprintable():
            raise bad_config("approvers", message)
        if text not in out:
            out.append(text)
    return out
