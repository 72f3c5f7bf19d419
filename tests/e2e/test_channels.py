"""Channels through `scripts/serve`, the real path end to end (HAProxy, Serve, the ChannelHub
and AgentWorker actors, WorkflowShards, embedded Postgres), every platform a loopback server
speaking its wire format. One service start for the module (the suite's time is mostly service
starts): the settings every test needs together, each test's data its own user's.

Interventions decided from channels (issue 32): workflows park (an approval step, a tool call
under an `ask` rule), the channel's hub posts each question to the platform fake, a signed
press (or a webhook's signed link) through the service's HTTP port decides it, the workflow
goes on, and the question's message is updated with the outcome.

- Slack, an approval step: a press with a wrong signature is a 401; an unlisted user's
  press is told no (ephemeral, through the press's `response_url`) and changes nothing; an
  approver's press decides it, the workflow completes, `chat.update` shows who decided; the
  same press replayed decides nothing twice.
- A generic webhook: the callback carries signed links; POSTing the reject link fails the
  approval step and compensation runs.
- Slack, a tool call under `ask` (the workflow's `notify`): the question shows the tool and
  its masked arguments; approved from Slack, the tool runs once and the workflow completes.
- Decided through the API: the Slack message is updated at once (the poster is woken as
  for a press), not at the poster's next poll.
- Telegram: the question with an inline keyboard (`sendMessage`); a `callback_query` with a
  wrong secret token is a 401, an unlisted user's gets an alert and decides nothing, an
  approver's decides it (`answerCallbackQuery` in the webhook's answer) and its redelivery
  nothing more, `editMessageText` shows the outcome.
- Teams: an Adaptive Card posted through the Bot Connector with a client-credentials token;
  a badly signed `Action.Submit` is a 401, an approver's decides it (a retry of it nothing
  more), the card is updated (PUT of its activity) without its buttons.

Relaying (SPEC part 4 "Channels"): for each type an inbound message becomes an agent task
run as the channel owner and its answer is delivered to the platform; duplicates once; a
disallowed address is 401; a ChannelHub killed with SIGKILL is restarted and delivers what
was waiting; no secret appears in any answer or in the log; a burst to one channel past its
inbound messages per minute gets 429s and runs no more agent tasks than the limit (issue 29).

On the e2e modules' shared service (tests/e2e/shared.py, whose settings hold the platforms'
URLs, the Teams issuer and the inbound limit): its users' names carry this run's suffix."""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.shared import CHANNEL_INBOUND_PER_MINUTE, PUBLIC_URL, SharedService
from tests.e2e.test_workflows import Orchestrator, _actors
from tests.fakes import slack_server as slack
from tests.fakes import teams_server as teams
from tests.fakes import telegram_server as telegram
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes.webhook_server import CallbackFake

pytestmark = pytest.mark.e2e

SIGNING_SECRET = "e2e-signing-secret-0123456789abcdef"
TG_SECRET = "e2e_tg_secret"
INBOUND_PER_MINUTE = CHANNEL_INBOUND_PER_MINUTE
PUBLIC = PUBLIC_URL
RUN = uuid.uuid4().hex[:8]  # in its users' names: the shared service outlives the module
BOSS = "U0BOSS0001"  # the Slack channel's approver
TG_APPROVER = 4242  # the Telegram channel's approver (a Telegram user id)
TG_CHAT = -1001234567890  # where the Telegram questions go
TEAMS_CONVERSATION = "19:ops0channel0id@thread.tacv2"
# The poster polls at least every 5 s (orchestrator/channels/_approvals.py POLL_CLAMP_S): an
# update that comes well before that was woken by the decision, not found by a poll (the
# poll after the question was posted comes ~5 s after it; 1.5 s of margin for a loaded CI).
PROMPT_S = 3.5


class PayApi(LoopbackServer):
    """What the user's `pay` tool calls: records each payment."""

    label = "pay-api"

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        await self.send_json(send, 200, {"paid": request.json.get("amount")})


class Fakes:
    def __init__(
        self,
        s: slack.SlackFake,
        t: teams.TeamsFake,
        g: telegram.TelegramFake,
        hook: CallbackFake,
        pay: PayApi,
    ) -> None:
        self.slack, self.teams, self.telegram, self.hook, self.pay = s, t, g, hook, pay


@pytest.fixture(scope="module")
def fakes(shared_service: SharedService) -> Iterator[Fakes]:
    """The platforms' fakes the shared service's settings point at, and this module's own."""
    s = shared_service
    with CallbackFake() as hook, PayApi() as pay:
        yield Fakes(s.slack, s.teams, s.telegram, hook, pay)


@pytest.fixture(scope="module")
def service(shared_service: SharedService, fakes: Fakes) -> Orchestrator:
    """The shared service: provider_retries 0, loopback allowed outbound (the fakes listen
    there), the platforms' API base URLs, PUBLIC as its public URL, the Teams fake's issuer,
    127.0.0.1 a trusted proxy (HAProxy keeps a loopback client's X-Forwarded-For: the relay
    tests play Telegram's front with it; the approval test's presses come from loopback
    itself), loopback among Telegram's addresses, and INBOUND_PER_MINUTE."""
    return shared_service.orch


@contextlib.contextmanager
def _as(service: Orchestrator, user: str) -> Iterator[httpx.Client]:
    """A client with `user`'s token (a user, not an admin)."""
    with service.client() as admin:
        made = admin.post("/tokens", json={"user_uuid": f"{user}-{RUN}"})
        assert made.status_code == 200, made.text
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def ann(service: Orchestrator) -> Iterator[httpx.Client]:
    """Owns the Slack approval channel and its workflows, decides in the API."""
    with _as(service, "ann") as c:
        yield c


@pytest.fixture(scope="module")
def platform(service: Orchestrator) -> Iterator[httpx.Client]:
    """What the platforms' servers send with: no bearer token, only the request's proof."""
    with httpx.Client(base_url=service.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def ops(ann: httpx.Client, fakes: Fakes) -> dict[str, Any]:
    """ann's Slack channel: questions go to #ops (C0OPS), BOSS decides."""
    config = {
        "signing_secret": SIGNING_SECRET,
        "bot_token": fakes.slack.bot_token,
        "notify_channel": "C0OPS",
        "approvers": [BOSS],
    }
    return _channel(ann, "slack", config)


def _channel(c: httpx.Client, kind: str, config: dict[str, Any]) -> dict[str, Any]:
    r = c.post("/channels", json={"type": kind, "name": f"{kind}-approvals", "config": config})
    assert r.status_code == 200, r.text
    return dict(r.json()["data"])


def _until(check: Any, within: float = 90.0) -> Any:
    deadline = time.monotonic() + within
    while not (found := check()):
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)
    return found


def _create(c: httpx.Client, steps: list[dict[str, Any]], **extra: Any) -> str:
    r = c.post("/workflows", json={"name": "ask", "steps": steps, **extra})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _pending(c: httpx.Client, workflow_id: str, step: str) -> dict[str, Any]:
    """The pending intervention of `step` (the engine parked the workflow there)."""

    def found() -> dict[str, Any] | None:
        r = c.get("/interventions", params={"workflow_id": workflow_id, "status": "pending"})
        assert r.status_code == 200, r.text
        return next((iv for iv in r.json()["data"] if iv["step"] == step), None)

    return dict(_until(found))


def _finished(c: httpx.Client, workflow_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = c.get(f"/workflows/{workflow_id}").json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    return dict(_until(done, 120))


def _question(s: slack.SlackFake, iv_id: str) -> dict[str, Any]:
    """The message the hub posted for `iv_id` (its buttons' block is named by the id)."""

    def found() -> dict[str, Any] | None:
        return next(
            (p for p in list(s.posted) if (p.get("blocks") or [{}])[-1].get("block_id") == iv_id),
            None,
        )

    return dict(_until(found))


def _updates(s: slack.SlackFake, iv_id: str) -> list[dict[str, Any]]:
    """The chat.update calls for `iv_id`'s question (the fake accepts one only for a
    message it posted: `channel` and `ts` of it)."""
    return [u for u in list(s.updated) if f"({iv_id})" in json.dumps(u.get("blocks"))]


def _press(c: httpx.Client, channel: dict[str, Any], payload: Any) -> httpx.Response:
    """A block_actions press as Slack sends it: form-encoded, v0-signed, to the channel's
    webhook URL (the Slack app's Interactivity Request URL) on the service's port."""
    body = slack.interaction_body(payload)
    return c.post(
        f"/channels/webhook/{channel['webhook_token']}",
        content=body,
        headers=slack.sign_form(SIGNING_SECRET, body),
    )


# --- interventions decided from channels (issue 32) -----------------------------------------


def test_slack_approval_step_decided_by_a_press(
    ann: httpx.Client, platform: httpx.Client, ops: dict[str, Any], fakes: Fakes
) -> None:
    s = fakes.slack
    steps: list[dict[str, Any]] = [
        {"name": "prepare", "prompt": "[answer READY]"},
        {
            "name": "sign-off",
            "type": "approval",
            "prompt": "Ship {{prepare.result}}?",
            "notify": {"channel_id": ops["id"]},
        },
        {"name": "ship", "prompt": "[answer SHIPPED]"},
    ]
    workflow_id = _create(ann, steps)
    iv = _pending(ann, workflow_id, "sign-off")
    assert iv["notify_channel"] == ops["id"] and iv["question"] == "Ship READY?"
    question = _question(s, iv["id"])  # posted by the ChannelHub, through its egress client
    assert question["channel"] == "C0OPS"
    buttons = question["blocks"][-1]["elements"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [
        ("approve", iv["id"]),
        ("reject", iv["id"]),
    ]

    # Someone not in the channel's approvers: told so, nothing decided.
    stranger = slack.block_actions(
        "approve",
        iv["id"],
        user="U0STRANGER",
        channel="C0OPS",
        response_url=s.response_url(1),
    )
    assert _press(platform, ops, stranger).status_code == 200
    told = _until(lambda: [r for r in list(s.responses) if "not an approver" in r["text"]])
    assert told[0]["response_type"] == "ephemeral"
    assert ann.get(f"/interventions/{iv['id']}").json()["status"] == "pending"

    # The approver: decided at once (before the 200), the workflow goes on and completes;
    # not before the request is signed with the channel's signing secret.
    press = slack.block_actions(
        "approve",
        iv["id"],
        user=BOSS,
        channel="C0OPS",
        response_url=s.response_url(2),
    )
    forged = slack.interaction_body(press)
    r = platform.post(
        f"/channels/webhook/{ops['webhook_token']}",
        content=forged,
        headers=slack.sign_form("not-the-signing-secret", forged),
    )
    assert r.status_code == 401, r.text
    assert ann.get(f"/interventions/{iv['id']}").json()["status"] == "pending"
    assert _press(platform, ops, press).status_code == 200
    decided = ann.get(f"/interventions/{iv['id']}").json()
    assert decided["status"] == "approved" and decided["via"] == "slack", decided
    assert decided["decided_by"] == {
        "platform": "slack",
        "platform_user": BOSS,
        "channel_id": ops["id"],
    }
    final = _finished(ann, workflow_id)
    assert final["status"] == "completed", final
    assert final["steps"][1]["result"].startswith("approved by slack:")
    assert final["steps"][2]["result"] == "SHIPPED"
    update = _until(lambda: _updates(s, iv["id"]))[0]
    assert update["channel"] == "C0OPS"
    shown = json.dumps(update["blocks"])
    assert f"Approved by slack:{BOSS}" in shown and '"actions"' not in shown

    # Slack redelivers the same press (a retry): nothing is decided twice. A second press
    # (a new interaction) is told who decided; by then the replay was handled as well.
    assert _press(platform, ops, press).status_code == 200
    again = slack.block_actions(
        "reject",
        iv["id"],
        user=BOSS,
        channel="C0OPS",
        response_url=s.response_url(3),
    )
    assert _press(platform, ops, again).status_code == 200
    late = _until(lambda: [r for r in list(s.responses) if "Already approved" in r["text"]])
    assert BOSS in late[0]["text"]
    after = ann.get(f"/interventions/{iv['id']}").json()
    assert after["status"] == "approved" and after["decided_at"] == decided["decided_at"]
    audit = ann.get(
        "/events",
        params={"aggregate": iv["task_id"], "type": "audit.intervention_approved"},
    ).json()["data"]
    assert len(audit) == 1 and audit[0]["data"]["decided_by"] == f"slack:{BOSS}"
    assert len(_updates(s, iv["id"])) == 1


def test_webhook_reject_link_fails_the_step_and_compensates(
    ann: httpx.Client, fakes: Fakes, service: Orchestrator
) -> None:
    hook = fakes.hook
    hooked = _channel(
        ann, "webhook", {"callback_url": hook.callback_url, "approvers": ["ops@example.com"]}
    )
    steps: list[dict[str, Any]] = [
        {"name": "prepare", "prompt": "[answer READY]", "compensate": {"notify": "undo"}},
        {
            "name": "sign-off",
            "type": "approval",
            "prompt": "Ship {{prepare.result}}?",
            "notify": {"channel_id": hooked["id"]},
        },
        {"name": "ship", "prompt": "[answer SHIPPED]"},
    ]
    workflow_id = _create(ann, steps)
    iv = _pending(ann, workflow_id, "sign-off")
    asked = _until(
        lambda: [b for b in list(hook.received) if b.get("intervention_id") == iv["id"]]
    )[0]
    assert asked["type"] == "intervention" and asked["question"] == "Ship READY?"
    [links] = asked["decisions"]
    assert links["approver"] == "ops@example.com"
    link = links["reject_url"]
    assert link.startswith(f"{PUBLIC}/api/v1/channels/webhook/decide/")
    local = service.url.removesuffix("/api/v1") + link[len(PUBLIC) :]
    with httpx.Client(timeout=60) as person:  # no bearer token: the link is the credential
        assert person.get(local).status_code == 200  # a confirmation page; decides nothing
        assert ann.get(f"/interventions/{iv['id']}").json()["status"] == "pending"
        r = person.post(local)
        assert r.status_code == 200 and r.json()["status"] == "rejected", r.text
        assert person.post(local).status_code == 409

    final = _finished(ann, workflow_id)
    assert final["status"] == "failed", final
    assert "rejected" in final["steps"][1]["error"]
    trail = ann.get("/events", params={"aggregate": workflow_id, "limit": 500}).json()["data"]
    seen = [(e["type"], e["data"].get("step")) for e in trail]
    assert ("workflow.compensating", "prepare") in seen
    decided = ann.get(f"/interventions/{iv['id']}").json()
    assert decided["via"] == "webhook"
    assert decided["decided_by"]["platform_user"] == "ops@example.com"
    told = _until(
        lambda: [
            b
            for b in list(hook.received)
            if b.get("type") == "intervention_decided" and b.get("intervention_id") == iv["id"]
        ]
    )
    assert told[0]["status"] == "rejected"


def test_slack_approves_a_tool_call_which_runs_once(
    ann: httpx.Client, platform: httpx.Client, ops: dict[str, Any], fakes: Fakes
) -> None:
    s, pay = fakes.slack, fakes.pay
    tool = {
        "name": "pay",
        "description": "Pay an amount",
        "parameters": {
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "api_key": {"type": "string"}},
        },
        "method": "POST",
        "url": f"{pay.url}/pay",
    }
    assert ann.post("/tools/http", json=tool).status_code == 201
    rules = {"rules": [{"tool": "http__pay", "action": "ask"}]}
    assert ann.put("/tools/policy", json=rules).status_code == 200
    # The arguments the model sends appear nowhere in the prompt (the question quotes it).
    arguments = {"amount": 7, "api_key": "sk-live-4242"}
    call = f"[tool http__pay b64:{base64.b64encode(json.dumps(arguments).encode()).decode()}]"
    workflow_id = _create(
        ann, [{"name": "settle", "prompt": call}], notify={"channel_id": ops["id"]}
    )
    iv = _pending(ann, workflow_id, "settle")
    assert iv["kind"] == "tool" and iv["tool"] == "http__pay"
    question = _question(s, iv["id"])
    shown = json.dumps(question["blocks"])
    assert "http__pay" in shown and '\\"amount\\": 7' in shown
    assert "sk-live-4242" not in shown and "***" in shown  # masked
    assert pay.requests == []

    press = slack.block_actions(
        "approve",
        iv["id"],
        user=BOSS,
        channel="C0OPS",
        response_url=s.response_url(4),
    )
    assert _press(platform, ops, press).status_code == 200
    final = _finished(ann, workflow_id)
    assert final["status"] == "completed", final
    assert final["steps"][0]["result"].startswith("tool http__pay said:")
    # Exactly once, with the real arguments (masked only where people see them).
    assert [r.json for r in pay.requests] == [arguments]


def test_an_api_decision_updates_the_slack_message_at_once(
    ann: httpx.Client, ops: dict[str, Any], fakes: Fakes
) -> None:
    s = fakes.slack
    steps: list[dict[str, Any]] = [
        {"name": "first", "type": "approval", "prompt": "Go on?"},
        {"name": "second", "type": "approval", "prompt": "Really?"},
    ]
    workflow_id = _create(ann, steps, notify={"channel_id": ops["id"]})
    for step, verb, body in (
        ("first", "approve", {"note": "fine"}),
        ("second", "reject", {"reason": "not today"}),
    ):
        iv = _pending(ann, workflow_id, step)
        _question(s, iv["id"])
        r = ann.post(f"/interventions/{iv['id']}/{verb}", json=body)
        assert r.status_code == 200, r.text
        decided_at = time.monotonic()
        update = _until(lambda: _updates(s, iv["id"]), within=30)[0]  # noqa: B023 - used at once
        took = time.monotonic() - decided_at
        assert took < PROMPT_S, f"{step}: the message was updated after {took:.1f}s"
        ann_uuid = f"ann-{RUN}"
        said = (
            f"Approved by user:{ann_uuid}: fine"
            if verb == "approve"
            else f"Rejected by user:{ann_uuid}"
        )
        assert said in json.dumps(update["blocks"])
    final = _finished(ann, workflow_id)
    assert final["status"] == "failed", final
    assert final["steps"][0]["status"] == "completed"


def test_telegram_approval_decided_by_a_press(
    service: Orchestrator, platform: httpx.Client, fakes: Fakes
) -> None:
    g = fakes.telegram
    with _as(service, "gus") as gus:
        chat = _channel(
            gus,
            "telegram",
            {
                "bot_token": g.bot_token,
                "secret_token": TG_SECRET,
                "notify_chat_id": TG_CHAT,
                "approvers": [TG_APPROVER],
            },
        )
        steps: list[dict[str, Any]] = [
            {
                "name": "sign-off",
                "type": "approval",
                "prompt": "Deploy to production?",
                "notify": {"channel_id": chat["id"]},
            },
            {"name": "deploy", "prompt": "[answer DEPLOYED]"},
        ]
        workflow_id = _create(gus, steps)
        iv = _pending(gus, workflow_id, "sign-off")
        number = iv["id"].removeprefix("iv-")
        keyboard = [
            [
                {"text": "Approve", "callback_data": f"iv:{number}:a"},
                {"text": "Reject", "callback_data": f"iv:{number}:r"},
            ]
        ]
        # sendMessage with the inline keyboard, by the channel's hub through its egress client.
        ask = _until(
            lambda: [
                m
                for m in list(g.sent)
                if (m.get("reply_markup") or {}).get("inline_keyboard") == keyboard
            ]
        )[0]
        assert str(ask["chat_id"]) == str(TG_CHAT) and "Deploy to production?" in ask["text"]

        # Presses as Telegram sends them: the update to the channel's webhook URL with the
        # secret token (from loopback, inside telegram_allowed_cidrs here). The press names a
        # message of the bot's; the edit below goes to the one the question was posted as
        # (the fake edits only messages it sent).
        hook = f"/channels/webhook/{chat['webhook_token']}"
        from_telegram = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}
        press = telegram.callback_update(f"iv:{number}:a", user_id=TG_APPROVER, chat_id=TG_CHAT)
        wrong = {"X-Telegram-Bot-Api-Secret-Token": "not-the-secret"}
        assert platform.post(hook, json=press, headers=wrong).status_code == 401

        stranger = telegram.callback_update(f"iv:{number}:a", user_id=999, chat_id=TG_CHAT)
        r = platform.post(hook, json=stranger, headers=from_telegram)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["method"] == "answerCallbackQuery" and answer["show_alert"] is True
        assert answer["callback_query_id"] == stranger["callback_query"]["id"]
        assert "not an approver" in answer["text"]
        assert gus.get(f"/interventions/{iv['id']}").json()["status"] == "pending"

        r = platform.post(hook, json=press, headers=from_telegram)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["method"] == "answerCallbackQuery" and answer["show_alert"] is False
        assert answer["callback_query_id"] == press["callback_query"]["id"]
        assert answer["text"].startswith("Approved")
        decided = gus.get(f"/interventions/{iv['id']}").json()
        assert decided["status"] == "approved" and decided["via"] == "telegram", decided
        assert decided["decided_by"] == {
            "platform": "telegram",
            "platform_user": str(TG_APPROVER),
            "channel_id": chat["id"],
        }
        # Telegram redelivers the update: answered, nothing decided twice.
        r = platform.post(hook, json=press, headers=from_telegram)
        assert r.status_code == 200 and "Already approved" in r.json()["text"], r.text
        after = gus.get(f"/interventions/{iv['id']}").json()
        assert after["decided_at"] == decided["decided_at"]
        audit = gus.get(
            "/events", params={"aggregate": iv["task_id"], "type": "audit.intervention_approved"}
        ).json()["data"]
        assert [e["data"]["decided_by"] for e in audit] == [f"telegram:{TG_APPROVER}"]
        final = _finished(gus, workflow_id)
        assert final["status"] == "completed", final
        assert final["steps"][1]["result"] == "DEPLOYED"

        edit = _until(
            lambda: [e for e in list(g.edited) if f"by telegram:{TG_APPROVER}" in e["text"]]
        )[0]
        assert str(edit["chat_id"]) == str(TG_CHAT) and "Approved" in edit["text"]
        assert edit["reply_markup"] == {"inline_keyboard": []}


def test_teams_approval_decided_by_a_card(
    service: Orchestrator, platform: httpx.Client, fakes: Fakes
) -> None:
    t = fakes.teams
    with _as(service, "tess") as tess:
        made = _channel(
            tess,
            "teams",
            {
                "webhook_url": t.webhook_url,
                "tenant_id": teams.TENANT,
                "app_id": t.app_id,
                "app_password": t.app_password,
                "service_url": t.url,
                "notify_conversation_id": TEAMS_CONVERSATION,
                "approvers": [teams.AAD_USER],
            },
        )
        assert made["config"]["app_password"] == "***"
        steps: list[dict[str, Any]] = [
            {
                "name": "sign-off",
                "type": "approval",
                "prompt": "Rotate the keys?",
                "notify": {"channel_id": made["id"]},
            },
            {"name": "rotate", "prompt": "[answer ROTATED]"},
        ]
        workflow_id = _create(tess, steps)
        iv = _pending(tess, workflow_id, "sign-off")

        # The card, posted through the Bot Connector with the fake's client-credentials token
        # (the fake's connector accepts no other).
        where, activity = _until(
            lambda: [a for a in list(t.activities) if iv["id"] in json.dumps(a[1])]
        )[0]
        assert where == TEAMS_CONVERSATION and t.tokens_issued >= 1
        attachment = activity["attachments"][0]
        assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
        card = attachment["content"]
        assert card["type"] == "AdaptiveCard" and "Rotate the keys?" in json.dumps(card)
        assert [(a["type"], a["title"], a["data"]) for a in card["actions"]] == [
            ("Action.Submit", "Approve", {"intervention_id": iv["id"], "decision": "approve"}),
            ("Action.Submit", "Reject", {"intervention_id": iv["id"], "decision": "reject"}),
        ]

        hook = f"/channels/webhook/{made['webhook_token']}"

        def signed(activity: Any, token: str) -> httpx.Response:
            return platform.post(
                hook,
                content=json.dumps(activity).encode(),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )

        submit = teams.submit_activity({"intervention_id": iv["id"], "decision": "approve"})
        # Signed by a key the JWKS does not publish: 401, nothing decided.
        assert signed(submit, t.mint(key=teams.rsa_key())).status_code == 401
        assert tess.get(f"/interventions/{iv['id']}").json()["status"] == "pending"

        r = signed(submit, t.mint())
        assert r.status_code == 200 and r.json()["accepted"] is True, r.text
        decided = tess.get(f"/interventions/{iv['id']}").json()
        assert decided["status"] == "approved" and decided["via"] == "teams", decided
        assert decided["decided_by"] == {
            "platform": "teams",
            "platform_user": teams.AAD_USER,
            "channel_id": made["id"],
        }
        # The same activity again (Bot Framework retries): nothing decided twice.
        assert signed(submit, t.mint()).status_code == 200
        after = tess.get(f"/interventions/{iv['id']}").json()
        assert after["decided_at"] == decided["decided_at"]
        audit = tess.get(
            "/events", params={"aggregate": iv["task_id"], "type": "audit.intervention_approved"}
        ).json()["data"]
        assert [e["data"]["decided_by"] for e in audit] == [f"teams:{teams.AAD_USER}"]
        final = _finished(tess, workflow_id)
        assert final["status"] == "completed", final
        assert final["steps"][1]["result"] == "ROTATED"

        # The card updated in place (PUT of its activity), without its buttons.
        where, activity_id, update = _until(
            lambda: [u for u in list(t.updates) if "Approved by teams:" in json.dumps(u[2])]
        )[0]
        assert where == TEAMS_CONVERSATION and update["id"] == activity_id
        content = update["attachments"][0]["content"]
        assert "actions" not in content


# --- relaying messages ----------------------------------------------------------------------


def _wait(check: Any, within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
    return got


def _token(c: httpx.Client, user: str) -> dict[str, str]:
    made = c.post("/tokens", json={"user_uuid": f"{user}-{RUN}"}).json()
    return {"Authorization": f"Bearer {made['token']}"}


def _chan(c: httpx.Client, h: dict[str, str], kind: str, config: Any) -> Any:
    r = c.post("/channels", headers=h, json={"type": kind, "name": f"{kind} e2e", "config": config})
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_every_type_relays_as_the_owner(service: Orchestrator, fakes: Fakes) -> None:
    s, t, g = fakes.slack, fakes.teams, fakes.telegram
    with service.client() as c:
        rae, bob = _token(c, "rae"), _token(c, "bob")
        sl = _chan(
            c, rae, "slack", {"signing_secret": SIGNING_SECRET, "webhook_url": s.webhook_url}
        )
        tg = _chan(
            c,
            rae,
            "telegram",
            {"bot_token": g.bot_token, "chat_ids": ["1111111"], "secret_token": TG_SECRET},
        )
        tm = _chan(c, rae, "teams", {"webhook_url": t.webhook_url, "tenant_id": teams.TENANT})
        wh = _chan(c, rae, "webhook", {})

        def hook(ch: Any) -> str:
            return f"/channels/webhook/{ch['webhook_token']}"

        body = json.dumps(slack.message_event("[answer from slack]", event_id="EvE2E1")).encode()
        r = c.post(hook(sl), content=body, headers=slack.sign(SIGNING_SECRET, body))
        assert r.json()["accepted"] is True, r.text
        r = c.post(hook(sl), content=body, headers=slack.sign(SIGNING_SECRET, body, retry_num=1))
        assert r.json()["duplicate"] is True
        tg_headers = {
            "X-Forwarded-For": "91.108.4.7",
            "X-Telegram-Bot-Api-Secret-Token": TG_SECRET,
        }
        update = telegram.text_update("[answer from telegram]", update_id=9001)
        assert c.post(hook(tg), json=update, headers=tg_headers).json()["accepted"] is True
        assert c.post(hook(tg), json=update, headers=tg_headers).json()["duplicate"] is True
        r = c.post(hook(tg), json=update, headers={**tg_headers, "X-Forwarded-For": "10.0.0.1"})
        assert r.status_code == 401
        activity = teams.message_activity("[answer from teams]", activity_id="e2e-1")
        bearer = {"Authorization": f"Bearer {t.mint({'serviceurl': activity['serviceUrl']})}"}
        assert c.post(hook(tm), json=activity, headers=bearer).json()["accepted"] is True
        r = c.post(f"{hook(wh)}?sync=true", json={"text": "[answer from the webhook]"})
        assert r.json()["answer"] == "from the webhook"

        # (The fakes also hold the approval tests' questions: count the answers by text.)
        def answered() -> tuple[int, int, int]:
            return (
                len([m for m in list(s.posted) if m.get("text") == "from slack"]),
                len([m for m in list(g.sent) if m.get("text") == "from telegram"]),
                len([m for m in list(t.posted) if "from teams" in json.dumps(m)]),
            )

        _wait(lambda: all(answered()))
        time.sleep(1)
        assert answered() == (1, 1, 1)

        def chan_tasks(h: dict[str, str]) -> list[str]:
            data = c.get("/events", headers=h, params={"types": "task.completed"}).json()["data"]
            return [e["aggregate_id"] for e in data if e["aggregate_id"].startswith("chan-")]

        assert len(_wait(lambda: len(chan_tasks(rae)) >= 4 and chan_tasks(rae))) == 4
        assert chan_tasks(bob) == []

        # No secret in any answer, nor in the service's log.
        answers = json.dumps(
            [c.get("/channels", headers=rae).json(), c.get("/channels").json()]
            + [c.get(f"/channels/{ch['id']}", headers=rae).json() for ch in (sl, tg, tm, wh)]
        )
        log = (service.work / "serve.log").read_text(errors="replace")
        for secret in (SIGNING_SECRET, g.bot_token, TG_SECRET, sl["webhook_token"]):
            assert secret not in answers
            assert secret not in log


def test_a_killed_hub_delivers_what_waited(service: Orchestrator, fakes: Fakes) -> None:
    g = fakes.telegram
    with service.client() as c:
        cy = _token(c, "cy")
        tg = _chan(c, cy, "telegram", {"bot_token": g.bot_token, "secret_token": TG_SECRET})
        hook = f"/channels/webhook/{tg['webhook_token']}"
        headers = {"X-Forwarded-For": "149.154.160.1", "X-Telegram-Bot-Api-Secret-Token": TG_SECRET}
        g.fail_next(1000, 502)  # the Bot API is down: the answer waits to be re-sent
        before, tried = len(g.sent), len(g.requests)
        r = c.post(
            hook, json=telegram.text_update("[answer survived]", chat_id=4242), headers=headers
        )
        assert r.json()["accepted"] is True
        _wait(lambda: len(g.requests) >= tried + 2)  # two failed deliveries so far
        hubs = _actors("ChannelHub", service)
        assert hubs
        for hub in hubs:
            hub.send_signal(signal.SIGKILL)
        g.clear_failures()  # the outage is over
        _wait(lambda: len(g.sent) > before, within=60)
        assert g.sent[-1]["text"] == "survived" and str(g.sent[-1]["chat_id"]) == "4242"
        time.sleep(1)
        assert len([m for m in g.sent if m.get("text") == "survived"]) == 1
        assert all(h.pid not in {p.pid for p in _actors("ChannelHub", service)} for h in hubs)


def test_a_burst_past_the_channels_inbound_limit_is_refused(service: Orchestrator) -> None:
    """Issue 29 item 7: 700 messages to one generic webhook were all accepted in 3 s, each an
    agent task. Past `channel_inbound_per_minute`, 429 with Retry-After naming the limit, and
    nothing of those runs."""
    with service.client() as c:
        dee = _token(c, "dee")
        hook = f"/channels/webhook/{_chan(c, dee, 'webhook', {})['webhook_token']}"
        # The limit counts per wall-clock minute: not across a minute's end.
        left = 60 - time.time() % 60
        if left < 5:
            time.sleep(left + 0.05)
        sent = INBOUND_PER_MINUTE + 5
        answers = [
            c.post(hook, json={"text": f"[answer n{i}]", "metadata": {"message_id": f"n{i}"}})
            for i in range(sent)
        ]
        accepted = [r for r in answers if r.status_code == 200 and r.json()["accepted"]]
        refused = [r for r in answers if r.status_code == 429]
        assert len(accepted) == INBOUND_PER_MINUTE, [r.text for r in answers]
        assert len(refused) == sent - INBOUND_PER_MINUTE
        for r in refused:
            assert 1 <= int(r.headers["Retry-After"]) <= 61
            assert r.json()["limit"] == "channel_inbound_per_minute"

        def tasks(kind: str) -> list[str]:
            data = c.get("/events", headers=dee, params={"types": kind}).json()["data"]
            return [e["aggregate_id"] for e in data if e["aggregate_id"].startswith("chan-")]

        _wait(lambda: len(tasks("task.completed")) >= INBOUND_PER_MINUTE)
        # The refused messages never reached the inbox: no task of theirs can appear later.
        assert len(set(tasks("task.created"))) == INBOUND_PER_MINUTE
