"""A person pressing Approve or Reject on an intervention's question (issue 32): each
platform's interaction payload parsed into one `Press`, after the request was verified like
any other delivery of its channel (orchestrator/channels/_verify.py).

- Slack: a `block_actions` interaction, POSTed to the app's Interactivity Request URL (our
  receiver) as `application/x-www-form-urlencoded` with one field, `payload`, holding JSON
  (api.slack.com/interactivity/handling; docs.slack.dev/reference/interaction-payloads). The
  button's `action_id` is approve/reject and its `value` the intervention id; `action_ts`
  identifies the press (a replay carries the same).
- Telegram: an `Update` with a `callback_query` whose `data` is `iv:<n>:a` or `iv:<n>:r`
  (core.telegram.org/bots/api#callbackquery); its `id` identifies the press.
- Teams: an Adaptive Card `Action.Submit` arrives as a `message` activity whose `value` is
  the action's `data`, or (Universal Actions) as an `invoke` named `adaptiveCard/action` with
  the data in `value.action.data`; the activity id identifies the press. The decider is the
  user's `aadObjectId`, else their channel account id.

Anything else is None: not a press (the caller goes on to parse a message).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "CALLBACK_DATA_MAX",
    "Press",
    "callback_data",
    "parse_slack_action",
    "parse_teams_action",
    "parse_telegram_callback",
]

# Telegram refuses an inline button whose callback_data is over 64 bytes.
CALLBACK_DATA_MAX = 64
_IV = re.compile(r"iv-[0-9]{1,18}")
_CALLBACK = re.compile(r"iv:([0-9]{1,18}):([ar])")
MAX_INTERACTION = 200


@dataclass(frozen=True)
class Press:
    """One press of Approve/Reject. `user`: the platform's id of who pressed (what a
    channel's `approvers` lists); `interaction_id`: the platform's id of the press (a replay
    decides nothing twice); `reply`: what answering the person needs (Slack `response_url`,
    Telegram `callback_query_id`, Teams `invoke`, `service_url` and `tenant_id`)."""

    intervention_id: str
    approve: bool
    user: str
    interaction_id: str
    reply: dict[str, Any] = field(default_factory=dict)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _id(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value and len(value) <= MAX_INTERACTION:
        return value
    return None


def callback_data(intervention_id: str, approve: bool) -> str:
    """A Telegram button's `callback_data` (at most 64 bytes: `iv:<n>:a`)."""
    data = f"iv:{intervention_id[3:]}:{'a' if approve else 'r'}"
    assert len(data.encode()) <= CALLBACK_DATA_MAX
    return data


# --- Slack ---------------------------------------------------------------------------------


def parse_slack_action(raw: bytes) -> Press | None:
    """A form-encoded interaction request body (the raw bytes, already signature-checked)."""
    try:
        fields = parse_qs(raw.decode(), max_num_fields=10)
        payload = json.loads(fields["payload"][0])
    except (UnicodeDecodeError, ValueError, KeyError, IndexError):
        return None
    body = _dict(payload)
    if body.get("type") != "block_actions":
        return None
    actions = body.get("actions")
    if not isinstance(actions, list) or not actions:
        return None
    action = _dict(actions[0])
    kind, value = action.get("action_id"), action.get("value")
    user = _id(_dict(body.get("user")).get("id"))
    stamp = _id(action.get("action_ts"))
    if kind not in ("approve", "reject") or not isinstance(value, str):
        return None
    if not _IV.fullmatch(value) or user is None or stamp is None:
        return None
    reply: dict[str, Any] = {}
    if isinstance(body.get("response_url"), str):
        reply["response_url"] = body["response_url"]
    channel = _id(_dict(body.get("channel")).get("id"))
    if channel is not None:
        reply["channel"] = channel
    message_ts = _id(_dict(body.get("container")).get("message_ts"))
    if message_ts is not None:
        reply["message_ts"] = message_ts
    return Press(value, kind == "approve", user, f"{user}:{stamp}", reply)


# --- Telegram ------------------------------------------------------------------------------


def parse_telegram_callback(update: Any) -> Press | None:
    """A Bot API `Update` holding a `callback_query` from one of our buttons."""
    query = _dict(_dict(update).get("callback_query"))
    if not query:
        return None
    query_id = _id(query.get("id"))
    user = _id(_dict(query.get("from")).get("id"))
    data = query.get("data")
    matched = _CALLBACK.fullmatch(data) if isinstance(data, str) else None
    if query_id is None or user is None or matched is None:
        return None
    reply: dict[str, Any] = {"callback_query_id": query_id}
    message = _dict(query.get("message"))
    chat = _id(_dict(message.get("chat")).get("id"))
    if chat is not None:
        reply["chat_id"] = chat
    if isinstance(message.get("message_id"), int):
        reply["message_id"] = message["message_id"]
    return Press(f"iv-{matched.group(1)}", matched.group(2) == "a", user, query_id, reply)


# --- Teams ---------------------------------------------------------------------------------


def parse_teams_action(activity: Any) -> Press | None:
    """A Bot Framework activity carrying our card's submit: a `message` with `value`, or an
    `invoke` named `adaptiveCard/action`."""
    body = _dict(activity)
    kind = body.get("type")
    if kind == "message":
        data = _dict(body.get("value"))
    elif kind == "invoke" and body.get("name") == "adaptiveCard/action":
        data = _dict(_dict(_dict(body.get("value")).get("action")).get("data"))
    else:
        return None
    iv, decision = data.get("intervention_id"), data.get("decision")
    if not isinstance(iv, str) or not _IV.fullmatch(iv) or decision not in ("approve", "reject"):
        return None
    sender = _dict(body.get("from"))
    user = _id(sender.get("aadObjectId")) or _id(sender.get("id"))
    activity_id = _id(body.get("id"))
    if user is None or activity_id is None:
        return None
    conversation = _dict(body.get("conversation"))
    tenant = conversation.get("tenantId") or _dict(
        _dict(body.get("channelData")).get("tenant")
    ).get("id")
    reply = {
        "invoke": kind == "invoke",
        "service_url": body.get("serviceUrl"),
        "tenant_id": tenant,
        "conversation_id": conversation.get("id"),
    }
    return Press(iv, decision == "approve", user, activity_id, reply)
