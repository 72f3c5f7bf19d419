"""Interventions decided from channels through `scripts/serve` (issue 32): the question is
posted by the ChannelHub actor of the channel's shard (its `intervention-posts` loop, under
Ray), a signed Slack press through HAProxy decides it, the hub is woken and updates the
message; a webhook's signed link decides another. The service runs on the test's own
Postgres so the test can create the pending interventions the way the agent runner does
(`create_in` while the step attempt runs, the workflow held by the test's claim)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.interventions import Intervention, InterventionStore
from orchestrator.runtime.claims import ClaimStore
from orchestrator.workflows import WorkflowSpec, WorkflowStore
from tests.e2e.test_workflows import running
from tests.fakes import slack_server as slack
from tests.fakes.webhook_server import CallbackFake

pytestmark = pytest.mark.e2e

SIGNING_SECRET = "e2e-signing-secret-0123456789abcdef"
PUBLIC = "https://orch.example.com"


async def _until(check: Any, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_slack_press_and_webhook_link_through_the_service(
    database_url: str, clean_redis: str, tmp_path: Path
) -> None:
    with slack.SlackFake() as s, CallbackFake() as hook:
        settings = {
            "database_url": database_url,
            "redis_url": clean_redis,
            "rate_limit_per_minute": 0,
            "outbound_allowed_cidrs": ["127.0.0.0/8"],
            "channel_api_base_urls": {"slack": s.api_url},
            "channel_retry_base_s": 0.2,
            "public_url": PUBLIC,
        }
        with running(tmp_path, settings) as orch:
            db = await connect(database_url)
            try:
                await _scenario(orch, db, s, hook)
            finally:
                await db.close()


async def _scenario(orch: Any, db: Any, s: slack.SlackFake, hook: CallbackFake) -> None:
    events = EventStore(db.pool)
    workflows = WorkflowStore(db.pool, events)
    store = InterventionStore(db.pool, events)
    claims = ClaimStore(db.pool, ttl_ms=3_600_000)

    async def pending(channel_id: str) -> Intervention:
        spec = WorkflowSpec.parse("pay", [{"name": "a", "prompt": "pay"}])
        workflow_id = await workflows.create(spec, "ann")
        fence = await claims.acquire("workflow", workflow_id, "e2e-test-driver")
        assert fence is not None
        await workflows.mark_started(workflow_id, fence)
        _, key = await workflows.start_step(workflow_id, 0, fence=fence)
        async with events.transaction() as tx:
            return await store.create_in(
                tx,
                task_id=key,
                workflow_id=workflow_id,
                step="a",
                user_uuid="ann",
                kind="tool",
                tool="http__pay",
                arguments={"amount": 5},
                question="Pay 5 EUR?",
                notify_channel=channel_id,
            )

    async with httpx.AsyncClient(base_url=orch.url, timeout=60) as c:
        made = (await c.post("/tokens", headers=orch.admin, json={"user_uuid": "ann"})).json()
        ann = {"Authorization": f"Bearer {made['token']}"}

        async def channel(kind: str, config: Any) -> Any:
            r = await c.post(
                "/channels", headers=ann, json={"type": kind, "name": kind, "config": config}
            )
            assert r.status_code == 200, r.text
            return r.json()["data"]

        ops = await channel(
            "slack",
            {
                "signing_secret": SIGNING_SECRET,
                "bot_token": s.bot_token,
                "notify_channel": "C0OPS",
                "approvers": ["U0BOSS"],
            },
        )
        iv = await pending(ops["id"])
        await _until(lambda: s.posted)  # by the ChannelHub, through its egress client
        assert s.posted[0]["blocks"][-1]["block_id"] == iv.id
        press = slack.block_actions("approve", iv.id, user="U0BOSS", response_url=s.response_url())
        body = slack.interaction_body(press)
        r = await c.post(
            f"/channels/webhook/{ops['webhook_token']}",
            content=body,
            headers=slack.sign_form(SIGNING_SECRET, body),
        )
        assert r.status_code == 200
        decided = await store.load(iv.id)
        assert decided is not None and decided.status == "approved" and decided.via == "slack"
        # The hub was woken (RayChannels.wake_posts): the update follows at once.
        await _until(lambda: s.updated, within=30)
        assert "Approved by slack:U0BOSS" in json.dumps(s.updated[0]["blocks"])

        hooked = await channel(
            "webhook", {"callback_url": hook.callback_url, "approvers": ["ops@example.com"]}
        )
        other = await pending(hooked["id"])
        await _until(lambda: hook.received)
        link = hook.received[0]["decisions"][0]["reject_url"]
        assert link.startswith(PUBLIC)
        local = orch.url.removesuffix("/api/v1") + link[len(PUBLIC) :]
        async with httpx.AsyncClient(timeout=60) as web:
            assert (await web.get(local)).status_code == 200
            assert (await store.load(other.id)).status == "pending"  # type: ignore[union-attr]
            r = await web.post(local)
            assert r.status_code == 200 and r.json()["status"] == "rejected", r.text
            assert (await web.post(local)).status_code == 409
        await _until(lambda: len(hook.received) == 2)
        assert hook.received[1]["type"] == "intervention_decided"
