"""An intervention's question on a channel, with buttons, and its update once decided (issue
32): what each platform is sent, and the calls that send it. The outbox loop
(orchestrator/channels/_approvals.py) decides when; this module only speaks the platforms.

- Slack (bot token): `chat.postMessage {channel, text, blocks}`; the blocks end with an
  `actions` block of two buttons (`action_id` approve/reject, `value` the intervention id).
  The update is `chat.update {channel, ts, text, blocks}`: new blocks replace the buttons
  (api.slack.com/methods/chat.update).
- Telegram: `sendMessage` with an inline keyboard (`callback_data` `iv:<n>:a|r`, at most
  64 bytes); the update is `editMessageText` with an empty keyboard.
- Teams (the bot: `app_id` + `app_password`): an access token by client credentials, then
  `POST {service_url}/v3/conversations/{id}/activities` with an Adaptive Card whose
  `Action.Submit` buttons carry `{intervention_id, decision}`; the update is `PUT
  .../activities/{activityId}` with the card less its actions.
- Generic webhook: `POST callback_url {type: "intervention", ..., decisions: [{approver,
  approve_url, reject_url}]}` (signed one-time links, orchestrator/interventions/_links.py),
  then `{type: "intervention_decided", ...}`.

Each ask returns its `ref` (what the update edits). Failures raise `DeliveryFailed` as the
relay's senders do (retryable for 5xx, 429, timeouts), never naming a token or a URL.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from orchestrator.channels._interactive import callback_data
from orchestrator.channels._platforms import (
    _SLACK_RETRYABLE,
    SLACK_API,
    TELEGRAM_API,
    DeliveryFailed,
    _json,
    _post,
    _redact,
    _retry_after,
    _short_code,
    _status_failure,
    _telegram_failure,
)
from orchestrator.interventions import Intervention
from orchestrator.interventions._links import LinkSigner

__all__ = [
    "TEAMS_LOGIN",
    "TeamsTokens",
    "ask_text",
    "outcome_text",
    "send_ask",
    "send_outcome",
    "send_teams_note",
    "slack_ask_blocks",
    "teams_card",
    "telegram_keyboard",
]

TEAMS_LOGIN = "https://login.microsoftonline.com"
TEAMS_TOKEN_PATH = "/botframework.com/oauth2/v2.0/token"
TEAMS_SCOPE = "https://api.botframework.com/.default"
ADAPTIVE = "application/vnd.microsoft.card.adaptive"
MAX_ARGUMENTS = 2500  # of the arguments' JSON shown with a question
SLACK_SECTION_MAX = 3000  # Slack refuses a section text over 3000 characters


def _arguments(iv: Intervention) -> str | None:
    if not iv.arguments:
        return None
    text = json.dumps(iv.arguments, indent=2, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= MAX_ARGUMENTS else text[:MAX_ARGUMENTS] + "\n…"


def _about(iv: Intervention) -> str:
    tool = f", tool {iv.tool}" if iv.tool else ""
    return f"Workflow {iv.workflow_id}, step {iv.step}{tool} ({iv.id})"


def ask_text(iv: Intervention) -> str:
    """The question as plain text (notification text, Telegram, the card's fallback)."""
    lines = [f"Approval needed: {iv.question}", _about(iv)]
    arguments = _arguments(iv)
    if arguments:
        lines.append(f"Arguments:\n{arguments}")
    return "\n".join(lines)


def outcome_text(iv: Intervention) -> str:
    """`Approved by slack:U123: note`, `Rejected by user:bob: reason`, `Expired`."""
    if iv.status == "expired":
        return "Expired: nobody decided in time."
    who = iv.decided_by_label
    verb = "Approved" if iv.status == "approved" else "Rejected"
    if iv.via == "cancel":
        return f"Rejected: the workflow ended ({iv.reason})."
    said = iv.note if iv.status == "approved" else iv.reason
    return f"{verb}{f' by {who}' if who else ''}{f': {said}' if said else ''}."


def _mrkdwn(text: str) -> str:
    # Slack's control characters in mrkdwn (api.slack.com/reference/surfaces/formatting).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:SLACK_SECTION_MAX]}}


def slack_ask_blocks(iv: Intervention) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [
        _section(f"*Approval needed:* {_mrkdwn(iv.question)}"),
        {"type": "context", "elements": [{"type": "mrkdwn", "text": _mrkdwn(_about(iv))}]},
    ]
    arguments = _arguments(iv)
    if arguments:
        blocks.append(_section(f"```{_mrkdwn(arguments)}```"))
    blocks.append(
        {
            "type": "actions",
            "block_id": iv.id,
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": iv.id,
                },
                {
                    "type": "button",
                    "action_id": "reject",
                    "style": "danger",
                    "text": {"type": "plain_text", "text": "Reject"},
                    "value": iv.id,
                },
            ],
        }
    )
    return blocks


def _slack_outcome_blocks(iv: Intervention) -> list[dict[str, Any]]:
    return [
        _section(f"*Approval needed:* {_mrkdwn(iv.question)}"),
        {"type": "context", "elements": [{"type": "mrkdwn", "text": _mrkdwn(_about(iv))}]},
        _section(_mrkdwn(outcome_text(iv))),
    ]


def telegram_keyboard(iv: Intervention) -> dict[str, Any]:
    return {
        "inline_keyboard": [
            [
                {"text": "Approve", "callback_data": callback_data(iv.id, True)},
                {"text": "Reject", "callback_data": callback_data(iv.id, False)},
            ]
        ]
    }


def teams_card(iv: Intervention, *, outcome: bool = False) -> dict[str, Any]:
    """The Adaptive Card of a question; with `outcome`, its decided form (no actions)."""
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "text": "Approval needed", "weight": "Bolder", "wrap": True},
        {"type": "TextBlock", "text": iv.question, "wrap": True},
        {"type": "TextBlock", "text": _about(iv), "isSubtle": True, "wrap": True},
    ]
    arguments = _arguments(iv)
    if arguments:
        body.append({"type": "TextBlock", "text": arguments, "fontType": "Monospace", "wrap": True})
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if outcome:
        body.append(
            {"type": "TextBlock", "text": outcome_text(iv), "weight": "Bolder", "wrap": True}
        )
    else:
        card["actions"] = [
            {
                "type": "Action.Submit",
                "title": title,
                "data": {"intervention_id": iv.id, "decision": decision},
            }
            for title, decision in (("Approve", "approve"), ("Reject", "reject"))
        ]
    return card


# --- sending -------------------------------------------------------------------------------


async def _slack_call(
    http: httpx.AsyncClient, token: str, method: str, payload: dict[str, Any], base: str | None
) -> dict[str, Any]:
    what = f"slack {method}"
    response = await _post(
        http,
        f"{(base or SLACK_API).rstrip('/')}/{method}",
        payload,
        what,
        headers={"authorization": f"Bearer {token}"},
    )
    data = _json(response)
    if not response.is_success:
        raise _status_failure(response, what, _short_code(data.get("error")))
    if data.get("ok") is not True:
        code = _short_code(data.get("error")) or "unknown_error"
        retry = _retry_after(response.headers.get("retry-after"))
        raise DeliveryFailed(f"{what}: {code}", code in _SLACK_RETRYABLE, retry)
    return data


async def _telegram_call(
    http: httpx.AsyncClient, token: str, method: str, payload: dict[str, Any], base: str | None
) -> dict[str, Any]:
    what = f"telegram {method}"
    hide = {"bot_token": token}
    url = f"{(base or TELEGRAM_API).rstrip('/')}/bot{token}/{method}"
    try:
        response = await _post(http, url, payload, what)
    except DeliveryFailed as exc:
        raise DeliveryFailed(_redact(exc.message, hide), exc.retryable) from None
    data = _json(response)
    if response.is_success and data.get("ok") is True:
        return data
    raise _telegram_failure(response, data, what, hide)


class TeamsTokens:
    """Bot Framework access tokens by client credentials, cached per app id until shortly
    before `expires_in` (learn.microsoft.com bot-framework-rest-connector-authentication)."""

    def __init__(self) -> None:
        # Keyed by the app id and a digest of the password: a channel with a wrong password
        # never rides on the token another channel of the same bot obtained.
        self._cache: dict[tuple[str, str], tuple[str, float]] = {}

    @staticmethod
    def _key(app_id: str, password: str) -> tuple[str, str]:
        return app_id, hashlib.sha256(password.encode()).hexdigest()

    async def token(
        self, http: httpx.AsyncClient, app_id: str, password: str, base: str | None
    ) -> str:
        cached = self._cache.get(self._key(app_id, password))
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        what = "teams token"
        url = (base or TEAMS_LOGIN).rstrip("/") + TEAMS_TOKEN_PATH
        form = {
            "grant_type": "client_credentials",
            "client_id": app_id,
            "client_secret": password,
            "scope": TEAMS_SCOPE,
        }
        try:
            response = await http.post(url, data=form)
        except httpx.HTTPError as exc:
            raise DeliveryFailed(
                f"{what}: connection failed ({type(exc).__name__})", True
            ) from None
        data = _json(response)
        if not response.is_success or not isinstance(data.get("access_token"), str):
            raise _status_failure(response, what, _short_code(data.get("error")))
        lifetime = data.get("expires_in")
        seconds = float(lifetime) if isinstance(lifetime, int | float) else 3600.0
        expiry = time.monotonic() + max(0.0, seconds - 300)
        self._cache[self._key(app_id, password)] = (data["access_token"], expiry)
        return str(data["access_token"])

    def forget(self, app_id: str, password: str) -> None:
        self._cache.pop(self._key(app_id, password), None)


def _teams_url(service_url: str, conversation_id: str, activity_id: str | None = None) -> str:
    url = f"{service_url.rstrip('/')}/v3/conversations/{quote(conversation_id, safe='')}/activities"
    return url if activity_id is None else f"{url}/{quote(activity_id, safe='')}"


def _teams_activity(card: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "summary": text[:200],
        "attachments": [{"contentType": ADAPTIVE, "content": card}],
    }


async def _teams_call(
    http: httpx.AsyncClient,
    config: Mapping[str, Any],
    tokens: TeamsTokens,
    bases: Mapping[str, str],
    method: str,
    url: str,
    payload: dict[str, Any],
) -> dict[str, Any]:
    what = f"teams {'update' if method == 'PUT' else 'post'} activity"
    app_id, password = config.get("app_id"), config.get("app_password")
    if not app_id or not password:
        raise DeliveryFailed(f"{what}: no app_id and app_password configured", False)
    bearer = await tokens.token(http, str(app_id), str(password), bases.get("teams_login"))
    response = await _post(
        http, url, payload, what, headers={"authorization": f"Bearer {bearer}"}, method=method
    )
    if response.status_code in (401, 403):
        tokens.forget(str(app_id), str(password))  # revoked or rotated: a fresh one next time
    if not response.is_success:
        raise _status_failure(response, what, None)
    return _json(response)


async def send_teams_note(
    http: httpx.AsyncClient,
    config: Mapping[str, Any],
    conversation_id: str,
    text: str,
    *,
    bases: Mapping[str, str],
    tokens: TeamsTokens,
) -> None:
    """A plain message from the bot into a conversation (through the channel's own
    `service_url`): how a Teams user whose card submit was refused is told."""
    service = config.get("service_url")
    if not service:
        raise DeliveryFailed("teams post activity: no service_url configured", False)
    url = _teams_url(str(service), conversation_id)
    await _teams_call(http, config, tokens, bases, "POST", url, {"type": "message", "text": text})


def _links(
    iv: Intervention, approvers: list[str], signer: LinkSigner | None, public_url: str | None
) -> list[dict[str, str]]:
    if signer is None or not public_url:
        return []
    expires = iv.expires_at // 1000
    return [
        {
            "approver": who,
            "approve_url": signer.url(public_url, iv.id, True, who, expires),
            "reject_url": signer.url(public_url, iv.id, False, who, expires),
        }
        for who in approvers
    ]


def _webhook_body(iv: Intervention) -> dict[str, Any]:
    return {
        "intervention_id": iv.id,
        "workflow_id": iv.workflow_id,
        "step": iv.step,
        "kind": iv.kind,
        "tool": iv.tool,
        "arguments": iv.arguments,
        "question": iv.question,
        "expires_at": iv.expires_at,
    }


# Where each type posts a question: the settings it needs (a secret's name among them).
_ASK_NEEDS: dict[str, tuple[str, ...]] = {
    "slack": ("bot_token", "notify_channel"),
    "telegram": ("bot_token", "notify_chat_id"),
    "teams": ("app_password", "service_url", "notify_conversation_id"),
    "webhook": ("callback_url",),
}


def ask_missing(kind: str, settings: set[str]) -> list[str]:
    """The config fields a channel of type `kind` lacks to post a question and take its
    answers (`settings`: the names of its config and secrets): [] when it can; a workflow
    naming it in `notify` is refused at creation otherwise (a question nobody would see)."""
    needs = [*_ASK_NEEDS.get(kind, ()), "approvers"]
    return [name for name in needs if name not in settings]


async def send_ask(
    http: httpx.AsyncClient,
    kind: str,
    config: Mapping[str, Any],
    iv: Intervention,
    *,
    bases: Mapping[str, str],
    tokens: TeamsTokens,
    signer: LinkSigner | None = None,
    public_url: str | None = None,
) -> dict[str, Any]:
    """Post the question of `iv` on a channel of type `kind` (`config`: its settings and
    secrets together); the `ref` of the message posted."""
    text = ask_text(iv)
    if kind == "slack":
        token, channel = config.get("bot_token"), config.get("notify_channel")
        if not token or not channel:
            raise DeliveryFailed("slack chat.postMessage: no bot_token and notify_channel", False)
        payload = {"channel": channel, "text": text, "blocks": slack_ask_blocks(iv)}
        data = await _slack_call(http, str(token), "chat.postMessage", payload, bases.get("slack"))
        return {"channel": data.get("channel") or channel, "ts": data.get("ts")}
    if kind == "telegram":
        token, chat = config.get("bot_token"), config.get("notify_chat_id")
        if not token or not chat:
            raise DeliveryFailed("telegram sendMessage: no notify_chat_id configured", False)
        payload = {"chat_id": chat, "text": text[:4096], "reply_markup": telegram_keyboard(iv)}
        data = await _telegram_call(http, str(token), "sendMessage", payload, bases.get("telegram"))
        result = data.get("result")
        message: dict[str, Any] = result if isinstance(result, dict) else {}
        return {"chat_id": chat, "message_id": message.get("message_id")}
    if kind == "teams":
        service, conversation = config.get("service_url"), config.get("notify_conversation_id")
        if not service or not conversation:
            raise DeliveryFailed("teams post activity: no notify_conversation_id", False)
        url = _teams_url(str(service), str(conversation))
        payload = _teams_activity(teams_card(iv), text)
        data = await _teams_call(http, config, tokens, bases, "POST", url, payload)
        return {"conversation_id": conversation, "activity_id": data.get("id")}
    callback = config.get("callback_url")
    if not callback:
        raise DeliveryFailed("webhook callback: no callback_url configured", False)
    approvers = list(config.get("approvers") or [])
    body = {
        "type": "intervention",
        **_webhook_body(iv),
        "decisions": _links(iv, approvers, signer, public_url),
    }
    response = await _post(http, str(callback), body, "webhook callback")
    if not response.is_success:
        raise _status_failure(response, "webhook callback", None)
    return {}


async def send_outcome(
    http: httpx.AsyncClient,
    kind: str,
    config: Mapping[str, Any],
    iv: Intervention,
    ref: Mapping[str, Any],
    *,
    bases: Mapping[str, str],
    tokens: TeamsTokens,
) -> None:
    """Update the question `ref` names with how `iv` was decided (its buttons removed)."""
    text = outcome_text(iv)
    if kind == "slack":
        payload = {
            "channel": ref.get("channel"),
            "ts": ref.get("ts"),
            "text": f"{iv.question}: {text}",
            "blocks": _slack_outcome_blocks(iv),
        }
        await _slack_call(
            http, str(config.get("bot_token") or ""), "chat.update", payload, bases.get("slack")
        )
    elif kind == "telegram":
        payload = {
            "chat_id": ref.get("chat_id"),
            "message_id": ref.get("message_id"),
            "text": f"{ask_text(iv)}\n\n{text}"[:4096],
            "reply_markup": {"inline_keyboard": []},
        }
        await _telegram_call(
            http,
            str(config.get("bot_token") or ""),
            "editMessageText",
            payload,
            bases.get("telegram"),
        )
    elif kind == "teams":
        service = config.get("service_url")
        if not service or not ref.get("activity_id"):
            raise DeliveryFailed("teams update activity: nothing to update", False)
        url = _teams_url(str(service), str(ref["conversation_id"]), str(ref["activity_id"]))
        payload = {
            **_teams_activity(teams_card(iv, outcome=True), text),
            "id": ref["activity_id"],
        }
        await _teams_call(http, config, tokens, bases, "PUT", url, payload)
    else:
        what = "webhook callback"
        callback = config.get("callback_url")
        if not callback:
            raise DeliveryFailed(f"{what}: no callback_url configured", False)
        body = {
            "type": "intervention_decided",
            **_webhook_body(iv),
            "status": iv.status,
            "decided_by": iv.decided_by_label,
            "via": iv.via,
            "note": iv.note,
            "reason": iv.reason,
            "decided_at": iv.decided_at,
            "text": text,
        }
        response = await _post(http, str(callback), body, what)
        if not response.is_success:
            raise _status_failure(response, what, None)
