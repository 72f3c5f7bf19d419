"""Intervention questions on channels (issue 32): the presses each platform sends parsed
(Slack's form `payload`, Telegram's `callback_query`, Teams' card submit and invoke), the
questions and their updates as built for each platform, and Telegram's 64-byte limit on
`callback_data`; the senders against the loopback fakes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from orchestrator.channels import parse_slack_action, parse_teams_action, parse_telegram_callback
from orchestrator.channels._asks import (
    TeamsTokens,
    ask_text,
    outcome_text,
    send_ask,
    send_outcome,
    slack_ask_blocks,
    teams_card,
    telegram_keyboard,
)
from orchestrator.channels._interactive import CALLBACK_DATA_MAX, callback_data
from orchestrator.channels._platforms import DeliveryFailed
from orchestrator.interventions import Intervention
from tests.fakes import slack_server, teams_server, telegram_server

BIGGEST = "iv-" + "9" * 18


def iv(**kw: Any) -> Intervention:
    values: dict[str, Any] = {
        "id": "iv-7",
        "kind": "tool",
        "status": "pending",
        "user_uuid": "ann",
        "deciders": ("ann",),
        "workflow_id": "wf-3",
        "step": "pay",
        "task_id": "wf-3:pay:1",
        "seq": 1,
        "question": "Run http__pay? <b>&",
        "expires_at": 1_900_000_000_000,
        "created_at": 1_800_000_000_000,
        "tool": "http__pay",
        "arguments": {"amount": 5, "api_key": "***"},
        "notify_channel": "ch-1",
    }
    values.update(kw)
    return Intervention(**values)


# --- parsing --------------------------------------------------------------------------------


def test_slack_block_actions_form_is_a_press() -> None:
    payload = slack_server.block_actions(
        "approve", "iv-7", user="U1", response_url="https://hooks.slack.com/actions/T/1/x"
    )
    press = parse_slack_action(slack_server.interaction_body(payload))
    assert press is not None
    assert (press.intervention_id, press.approve, press.user) == ("iv-7", True, "U1")
    assert press.interaction_id == f"U1:{payload['actions'][0]['action_ts']}"
    assert press.reply["response_url"] == "https://hooks.slack.com/actions/T/1/x"
    assert press.reply["channel"] == "C0CHAN0001"
    reject = parse_slack_action(
        slack_server.interaction_body(slack_server.block_actions("reject", "iv-7"))
    )
    assert reject is not None and reject.approve is False


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"payload=not-json",
        b"text=hello",
        slack_server.interaction_body({"type": "view_submission", "actions": []}),
        slack_server.interaction_body(slack_server.block_actions("other", "iv-7")),
        slack_server.interaction_body(slack_server.block_actions("approve", "wf-7")),
        slack_server.interaction_body(slack_server.block_actions("approve", "iv-7x")),
        b"\xff\xfe",
    ],
)
def test_other_slack_interactions_are_not_presses(raw: bytes) -> None:
    assert parse_slack_action(raw) is None


def test_telegram_callback_query_is_a_press() -> None:
    update = telegram_server.callback_update("iv:7:r", user_id=4242, message_id=9)
    press = parse_telegram_callback(update)
    assert press is not None
    assert (press.intervention_id, press.approve, press.user) == ("iv-7", False, "4242")
    assert press.interaction_id == update["callback_query"]["id"]
    assert press.reply["callback_query_id"] == update["callback_query"]["id"]
    assert press.reply["message_id"] == 9


@pytest.mark.parametrize("data", ["iv:7:x", "iv:x:a", "something", "iv:7:a:b", ""])
def test_other_callback_data_is_not_a_press(data: str) -> None:
    assert parse_telegram_callback(telegram_server.callback_update(data)) is None
    assert parse_telegram_callback(telegram_server.text_update("hi")) is None


def test_teams_submit_and_invoke_are_presses() -> None:
    data = {"intervention_id": "iv-7", "decision": "approve"}
    submit = parse_teams_action(teams_server.submit_activity(data, activity_id="a1"))
    assert submit is not None and submit.reply["invoke"] is False
    assert (submit.user, submit.interaction_id) == (teams_server.AAD_USER, "a1")
    assert submit.reply["tenant_id"] == teams_server.TENANT
    assert submit.reply["service_url"] == teams_server.SERVICE_URL
    invoke = parse_teams_action(
        teams_server.invoke_activity({**data, "decision": "reject"}, aad_object_id=None)
    )
    assert invoke is not None and invoke.reply["invoke"] is True and invoke.approve is False
    assert invoke.user.startswith("29:")  # no aadObjectId: the channel account id
    # A text message, another card's data: not presses.
    assert parse_teams_action(teams_server.message_activity("hello")) is None
    assert parse_teams_action(teams_server.submit_activity({"x": 1})) is None


# --- building -------------------------------------------------------------------------------


def test_callback_data_fits_telegram() -> None:
    for one in ("iv-1", BIGGEST):
        for approve in (True, False):
            data = callback_data(one, approve)
            assert 1 <= len(data.encode()) <= CALLBACK_DATA_MAX
            parsed = parse_telegram_callback(telegram_server.callback_update(data))
            assert parsed is not None
            assert (parsed.intervention_id, parsed.approve) == (one, approve)
    keyboard = telegram_keyboard(iv(id=BIGGEST))["inline_keyboard"][0]
    assert [b["callback_data"] for b in keyboard] == [f"iv:{'9' * 18}:a", f"iv:{'9' * 18}:r"]


def test_slack_blocks_escape_and_end_in_buttons() -> None:
    blocks = slack_ask_blocks(iv())
    assert "&lt;b&gt;&amp;" in blocks[0]["text"]["text"]
    assert blocks[-1]["type"] == "actions" and blocks[-1]["block_id"] == "iv-7"
    assert {e["value"] for e in blocks[-1]["elements"]} == {"iv-7"}
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in blocks)
    huge = slack_ask_blocks(iv(question="x" * 5000, arguments={"a": "y" * 9000}))
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in huge)


def test_teams_card_and_its_outcome() -> None:
    card = teams_card(iv())
    assert [a["data"]["decision"] for a in card["actions"]] == ["approve", "reject"]
    decided = iv(
        status="rejected",
        via="teams",
        reason="too much",
        decided_by={"platform": "teams", "platform_user": "u1", "channel_id": "ch-1"},
    )
    done = teams_card(decided, outcome=True)
    assert "actions" not in done
    assert done["body"][-1]["text"] == "Rejected by teams:u1: too much."


def test_texts() -> None:
    assert "Run http__pay?" in ask_text(iv()) and '"api_key": "***"' in ask_text(iv())
    assert outcome_text(iv(status="expired")) == "Expired: nobody decided in time."
    approved = iv(status="approved", via="api", decided_by={"user_uuid": "bob"})
    assert outcome_text(approved) == "Approved by user:bob."
    cancelled = iv(status="rejected", via="cancel", reason="workflow cancelled")
    assert outcome_text(cancelled) == "Rejected: the workflow ended (workflow cancelled)."


# --- sending against the fakes --------------------------------------------------------------


async def test_slack_ask_and_update_against_the_fake() -> None:
    async with slack_server.SlackFake() as s, httpx.AsyncClient() as http:
        config = {"bot_token": s.bot_token, "notify_channel": "C9"}
        bases = {"slack": s.api_url}
        ref = await send_ask(http, "slack", config, iv(), bases=bases, tokens=TeamsTokens())
        assert ref["channel"] == "C9" and ref["ts"]
        decided = iv(
            status="approved", via="slack", decided_by={"platform": "slack", "platform_user": "U1"}
        )
        await send_outcome(http, "slack", config, decided, ref, bases=bases, tokens=TeamsTokens())
        assert s.updated[0]["ts"] == ref["ts"]
        # An unknown message, a revoked token: Slack's codes, not retried.
        with pytest.raises(DeliveryFailed) as err:
            await send_outcome(
                http,
                "slack",
                config,
                decided,
                {**ref, "ts": "1.2"},
                bases=bases,
                tokens=TeamsTokens(),
            )
        assert "message_not_found" in str(err.value) and not err.value.retryable
        s.fail_next(1, 503)
        with pytest.raises(DeliveryFailed) as err:
            await send_ask(http, "slack", config, iv(), bases=bases, tokens=TeamsTokens())
        assert err.value.retryable


async def test_telegram_ask_and_edit_against_the_fake() -> None:
    async with telegram_server.TelegramFake() as g, httpx.AsyncClient() as http:
        config = {"bot_token": g.bot_token, "notify_chat_id": "-100123"}
        bases = {"telegram": g.url}
        ref = await send_ask(http, "telegram", config, iv(), bases=bases, tokens=TeamsTokens())
        assert ref["chat_id"] == "-100123" and isinstance(ref["message_id"], int)
        assert g.requests[-1].headers["content-type"].startswith("application/json")
        await send_outcome(
            http, "telegram", config, iv(status="expired"), ref, bases=bases, tokens=TeamsTokens()
        )
        assert g.edited[0]["reply_markup"] == {"inline_keyboard": []}
        with pytest.raises(DeliveryFailed) as err:
            await send_outcome(
                http,
                "telegram",
                {**config, "bot_token": "1:" + "x" * 30},
                iv(status="expired"),
                ref,
                bases=bases,
                tokens=TeamsTokens(),
            )
        assert g.bot_token not in str(err.value) and "x" * 30 not in str(err.value)


async def test_teams_token_is_cached_and_a_wrong_password_fails() -> None:
    async with teams_server.TeamsFake() as t, httpx.AsyncClient() as http:
        tokens = TeamsTokens()
        config = {
            "app_id": t.app_id,
            "app_password": t.app_password,
            "service_url": t.url,
            "notify_conversation_id": "19:a;b@thread",
        }
        bases = {"teams_login": t.login_url}
        first = await send_ask(http, "teams", config, iv(), bases=bases, tokens=tokens)
        second = await send_ask(http, "teams", config, iv(id="iv-8"), bases=bases, tokens=tokens)
        assert t.tokens_issued == 1 and first["activity_id"] != second["activity_id"]
        assert [c for c, _ in t.activities] == ["19:a;b@thread"] * 2
        await send_outcome(
            http, "teams", config, iv(status="expired"), first, bases=bases, tokens=tokens
        )
        assert t.updates[0][1] == first["activity_id"]
        with pytest.raises(DeliveryFailed) as err:
            await send_ask(
                http,
                "teams",
                {**config, "app_password": "nope"},
                iv(),
                bases=bases,
                tokens=TeamsTokens(),
            )
        assert "nope" not in str(err.value) and not err.value.retryable
        assert json.dumps(t.activities[0][1]).count("Action.Submit") == 2
