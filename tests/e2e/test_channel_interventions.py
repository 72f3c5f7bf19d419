"""Interventions decided from channels through `scripts/serve` (issue 32), the real path end
to end: workflows park (an approval step, a tool call under an `ask` rule), the ChannelHub
actor of the channel's shard posts each question to the platform fake, a signed press (or a
webhook's signed link) through the service's HTTP port decides it, the workflow goes on,
and the question's message is updated with the outcome. One service start for the module
(Serve, WorkflowShard, AgentWorker and ChannelHub actors, embedded Postgres), against a
loopback OpenAI-format model, a Slack fake, a generic-webhook receiver and a user's HTTP
tool that counts its calls.

- Slack, an approval step: a press with a wrong signature is a 401; an unlisted user's
  press is told no (ephemeral, through the press's `response_url`) and changes nothing; an
  approver's press decides it, the workflow completes, `chat.update` shows who decided; the
  same press replayed decides nothing twice.
- A generic webhook: the callback carries signed links; POSTing the reject link fails the
  approval step and compensation runs.
- Slack, a tool call under `ask` (the workflow's `notify`): the question shows the tool and
  its masked arguments; approved from Slack, the tool runs once and the workflow completes.
- Decided through the API: the Slack message is updated at once (the poster is woken as
  for a press), not at the poster's next poll."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_workflows import Orchestrator, agent_config, running
from tests.fakes import slack_server as slack
from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.fakes.webhook_server import CallbackFake

pytestmark = pytest.mark.e2e

SIGNING_SECRET = "e2e-signing-secret-0123456789abcdef"
PUBLIC = "https://orch.example.com"
BOSS = "U0BOSS0001"  # the Slack channel's approver
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
    def __init__(self, s: slack.SlackFake, hook: CallbackFake, pay: PayApi) -> None:
        self.slack, self.hook, self.pay = s, hook, pay


@pytest.fixture(scope="module")
def fakes() -> Iterator[Fakes]:
    with slack.SlackFake() as s, CallbackFake() as hook, PayApi() as pay:
        yield Fakes(s, hook, pay)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, fakes: Fakes) -> Iterator[Orchestrator]:
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        work = tmp_path_factory.mktemp("channel-interventions-e2e")
        settings = agent_config(
            llm,
            provider_retries=0,
            agent_workers=1,
            workflow_shards=1,
            outbound_allowed_cidrs=["127.0.0.0/8"],
            channel_api_base_urls={"slack": fakes.slack.api_url},
            channel_retry_base_s=0.2,
            public_url=PUBLIC,
        )
        with running(work, settings) as orch:
            yield orch


@pytest.fixture(scope="module")
def ann(service: Orchestrator) -> Iterator[httpx.Client]:
    """A user (not an admin): owns the channels and the workflows, decides in the API."""
    with service.client() as admin:
        made = admin.post("/tokens", json={"user_uuid": "ann"})
        assert made.status_code == 200, made.text
    headers = {"Authorization": f"Bearer {made.json()['token']}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def platform(service: Orchestrator) -> Iterator[httpx.Client]:
    """What Slack's servers send with: no bearer token, only the request's signature."""
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
        return next((p for p in list(s.posted) if p["blocks"][-1].get("block_id") == iv_id), None)

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
        said = "Approved by user:ann: fine" if verb == "approve" else "Rejected by user:ann"
        assert said in json.dumps(update["blocks"])
    final = _finished(ann, workflow_id)
    assert final["status"] == "failed", final
    assert final["steps"][0]["status"] == "completed"
