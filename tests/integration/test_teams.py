"""Agent teams (issue 33) over HTTP: the app under uvicorn, its in-process engine and agent
runtime, real Postgres, a loopback OpenAI-format model whose agents are scripted with
`[steps ...]` directives (tests/fakes/agent_llm.py): a coordinator spawns members, they
mail each other and the coordinator, it dismisses one; the limits are tool errors the model
sees; the team stops with its step; and (the engine with a dispatcher that loses the first
attempt, as tests/integration/test_step_retries.py does) unread mail waits for the
coordinator's next run."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from orchestrator.agents import (
    AgentRunner,
    AgentTask,
    LocalDispatcher,
    TaskResult,
    TeamSeat,
    default_registry,
)
from orchestrator.agents._runner import TaskParked
from orchestrator.agents._tools import ToolContext, ToolFailed
from orchestrator.db import connect
from orchestrator.events import EventStore
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import Gateway
from orchestrator.teams import MailWaker, TeamHub, TeamStore
from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore
from tests.conftest import ADMIN_TOKEN, ServedApp, make_supervisor
from tests.fakes.agent_llm import agent_reply, steps_directive, task_prompt
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings, create, events, finished, user

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TEAM_TYPES = {
    "team.created",
    "team.member_joined",
    "team.member_left",
    "team.mail_sent",
    "team.destroyed",
}


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as server:
        yield server


@pytest.fixture
async def api(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[httpx.AsyncClient]:
    settings = agent_settings(
        make_settings, llm, team_max_mails=4, team_max_message_bytes=200, team_receive_poll_s=0.5
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


def coordinate(prompt: str, **step: Any) -> dict[str, Any]:
    return {"name": "lead", "prompt": prompt, "mode": "coordinate", **step}


async def until(check: Callable[[], Awaitable[Any]], within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.05)


async def test_a_coordinator_spawns_two_members_that_mail_and_one_is_dismissed(
    api: httpx.AsyncClient,
) -> None:
    owner = await user(api, "team-owner")
    # m1 waits for m2's mail, then tells the coordinator; m2 mails m1, then waits (and is
    # dismissed while it waits). The coordinator reads m1's mail, dismisses m2, then reads
    # m1's final answer (mailed to it when m1 finished).
    m1 = steps_directive(
        ("team_receive", {"timeout_s": 20}),
        ("team_send", {"to": "coordinator", "message": "hello from m1"}),
    )
    m2 = steps_directive(
        ("team_send", {"to": "m1", "message": "ping from m2"}),
        ("team_receive", {"timeout_s": 30}),
    )
    lead = steps_directive(
        ("team_spawn", {"role": "writer", "instructions": m1}),
        ("team_spawn", {"role": "reviewer", "instructions": m2, "tools": ["calculate"]}),
        ("team_receive", {"timeout_s": 20}),
        ("team_dismiss", {"member": "m2"}),
        ("team_receive", {"timeout_s": 21}),
    )
    wid = await create(
        api,
        owner,
        name="team",
        steps=[
            coordinate(lead, tools=["calculate", "current_time"], team={"max_members": 2}),
            {"name": "after", "prompt": "[answer AFTER]"},
        ],
    )
    body = await finished(api, owner, wid, within=60)
    assert body["status"] == "completed", body
    result = body["steps"][0]["result"]
    parts = result.removeprefix("steps: ").split(" | ")
    assert json.loads(parts[0])["member"] == "m1" and json.loads(parts[1])["member"] == "m2"
    assert json.loads(parts[2]) == {"from": "m1", "text": "hello from m1"}
    assert parts[3] == "dismissed m2"
    last = json.loads(" | ".join(parts[4:]))
    assert last["from"] == "m1" and last["text"].startswith("[m1 finished] steps: ")
    team_id = body["steps"][0]["team_id"]
    assert team_id.startswith("team-") and "team_id" not in body["steps"][1]

    team = (await api.get(f"/teams/{team_id}", headers=owner)).json()
    assert team["ok"] is True and team["state"] == "destroyed"
    assert (team["workflow_id"], team["step"], team["max_members"]) == (wid, "lead", 2)
    members = {m["name"]: m for m in team["members"]}
    assert members["m1"]["role"] == "writer" and members["m1"]["state"] == "finished"
    assert members["m1"]["tools"] == ["calculate", "current_time"]  # the step's
    assert members["m2"]["state"] == "dismissed" and members["m2"]["tools"] == ["calculate"]
    assert members["m1"]["task_id"] == f"{team_id}:m1" and members["m1"]["left_at"]
    mail = [(m["from"], m["to"], m["text"]) for m in team["mail"]]
    assert mail[:2] == [("m2", "m1", "ping from m2"), ("m1", "coordinator", "hello from m1")]
    assert mail[2][:2] == ("m1", "coordinator") and len(mail) == 3
    assert all(m["read_at"] and m["size"] == len(m["text"].encode()) for m in team["mail"])

    # The five team.* types, keyed by the team, with sizes and never the text.
    seen = await events(api, team_id, owner)
    assert {e["type"] for e in seen} == TEAM_TYPES
    assert seen[0]["type"] == "team.created" and seen[-1]["type"] == "team.destroyed"
    assert all(e["aggregate_id"] == team_id for e in seen)
    left = {e["data"]["member"]: e["data"]["why"] for e in seen if e["type"] == "team.member_left"}
    assert left == {"m1": "finished", "m2": "dismissed"}
    sent = [e["data"] for e in seen if e["type"] == "team.mail_sent"]
    assert [(d["from"], d["to"], d["size"]) for d in sent[:2]] == [
        ("m2", "m1", 12),
        ("m1", "coordinator", 13),
    ]
    assert "hello from m1" not in json.dumps(seen) and "ping from m2" not in json.dumps(seen)
    # Each member ran as an agent task of its own, under the owner.
    kinds = [e["type"] for e in await events(api, f"{team_id}:m1", owner)]
    assert kinds[0] == "task.created" and "task.completed" in kinds

    # Another tenant: 404; an admin sees the team but not the text of its mail.
    other = await user(api, "team-stranger")
    missing = await api.get(f"/teams/{team_id}", headers=other)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert (await api.get("/teams/team-999999", headers=owner)).status_code == 404
    admin_view = (await api.get(f"/teams/{team_id}", headers=ADMIN)).json()
    assert len(admin_view["mail"]) == 3 and all("text" not in m for m in admin_view["mail"])
    # Nor the members' results and errors (the model's words, as the mail is).
    assert members["m1"]["result"].startswith("steps: ")
    assert [(m["result"], m["error"]) for m in admin_view["members"]] == [(None, None)] * 2


async def test_limits_are_tool_errors_the_model_sees(api: httpx.AsyncClient) -> None:
    owner = await user(api, "team-limits")
    lead = steps_directive(
        ("team_spawn", {"role": "helper", "instructions": "[sleep 30]", "tools": ["current_time"]}),
        ("team_spawn", {"role": "helper", "instructions": "[sleep 30]"}),
        ("team_spawn", {"role": "second", "instructions": "[answer x]"}),
        ("team_send", {"to": "m1", "message": "y" * 201}),
        ("team_send", {"to": "nobody", "message": "hi"}),
        ("team_send", {"to": "m1", "message": "one"}),
        ("team_send", {"to": "m1", "message": "two"}),
        ("team_send", {"to": "m1", "message": "three"}),
        ("team_send", {"to": "m1", "message": "four"}),
        ("team_send", {"to": "m1", "message": "five"}),
        ("team_receive", {"timeout_s": 0.2}),
        ("team_dismiss", {"member": "m9"}),
        ("team_dismiss", {"member": "m1"}),
    )
    wid = await create(
        api,
        owner,
        name="limits",
        steps=[coordinate(lead, tools=["calculate"], team={"max_members": 1})],
    )
    body = await finished(api, owner, wid, within=60)
    assert body["status"] == "completed", body
    parts = body["steps"][0]["result"].removeprefix("steps: ").split(" | ")
    assert parts[0].startswith("error: not among this step's tools: current_time")
    assert json.loads(parts[1])["member"] == "m1"
    assert parts[2].startswith("error: the team has 1 running members, at most 1")
    assert "201 bytes, at most 200 (team_max_message_bytes)" in parts[3]
    assert parts[4].startswith("error: no running member 'nobody'")
    assert parts[5:9] == [f"sent to m1 ({n} bytes)" for n in (3, 3, 5, 4)]
    assert "at most 4 (team_max_mails)" in parts[9]
    assert parts[10] == "no mail within 0.2s"
    assert parts[11] == "error: no running member 'm9'"
    assert parts[12] == "dismissed m1"
    team = (await api.get(f"/teams/{body['steps'][0]['team_id']}", headers=owner)).json()
    assert [m["state"] for m in team["members"]] == ["dismissed"]
    assert [m["text"] for m in team["mail"]] == ["one", "two", "three", "four"]
    assert all(m["read_at"] is None for m in team["mail"])


async def test_a_team_is_refused_on_steps_that_are_not_coordinate(api: httpx.AsyncClient) -> None:
    cases = [
        ({"name": "s", "prompt": "p", "team": {}}, "steps[0].team"),
        (coordinate("p", team={"max_members": 9}), "steps[0].team.max_members"),
        (coordinate("p", team={"max_members": True}), "steps[0].team.max_members"),
        (coordinate("p", team={"size": 2}), "steps[0].team.size"),
        (coordinate("p", team=[2]), "steps[0].team"),
    ]
    for step, field in cases:
        r = await api.post("/workflows", headers=ADMIN, json={"name": "w", "steps": [step]})
        assert r.status_code == 400, (step, r.text)
        assert r.json()["fields"][0]["field"] == field, r.json()


async def test_the_team_stops_with_its_step_when_the_workflow_is_cancelled(
    api: httpx.AsyncClient, llm: OpenAIFake
) -> None:
    owner = await user(api, "team-cancel")
    waiting = steps_directive(("team_receive", {"timeout_s": 60}))
    lead = steps_directive(
        ("team_spawn", {"role": "listener", "instructions": waiting}),
        ("team_receive", {"timeout_s": 59}),
    )
    wid = await create(api, owner, name="cancel", steps=[coordinate(lead, team={})])

    async def both_wait() -> Any:
        # The member's first turn and the coordinator's second were answered: each called
        # team_receive (a tool call follows its model answer at once) and waits.
        prompts = [task_prompt(r.json) for r in llm.chat_requests]
        if prompts.count(waiting) < 1 or prompts.count(lead) < 2:
            return None
        body = (await api.get(f"/workflows/{wid}", headers=owner)).json()
        return body["steps"][0].get("team_id")

    team_id = await until(both_wait)
    r = await api.post(f"/workflows/{wid}/cancel", headers=owner)
    assert r.status_code == 200, r.text
    assert (await finished(api, owner, wid))["status"] == "cancelled"

    async def destroyed() -> Any:
        seen = await events(api, team_id, owner)
        return seen if seen and seen[-1]["type"] == "team.destroyed" else None

    seen = await until(destroyed)
    left = [e["data"] for e in seen if e["type"] == "team.member_left"]
    assert [(d["member"], d["why"]) for d in left] == [("m1", "stopped")]
    team = (await api.get(f"/teams/{team_id}", headers=owner)).json()
    assert team["state"] == "destroyed" and team["members"][0]["state"] == "stopped"
    assert team["max_members"] == 4  # the default


class LosesFirstRun:
    """The coordinator's first attempt runs on a worker that dies (the dispatcher raises,
    as in test_step_retries.py) after its team had a member that mailed the coordinator:
    that run's part is written as it would have been, through the team store. Later
    attempts run for real."""

    def __init__(self, local: LocalDispatcher, teams: TeamStore) -> None:
        self.local = local
        self.teams = teams
        self.lost: list[str] = []

    async def run(self, task: AgentTask) -> TaskResult:
        if task.task_id.endswith(":lead:1"):
            assert task.team is not None and task.workflow_id is not None
            team = await self.teams.open(
                workflow_id=task.workflow_id,
                step="lead",
                user_uuid=task.user_uuid,
                max_members=task.team.max_members,
                task_id=task.task_id,
            )
            scout = await self.teams.join(
                team,
                role="scout",
                instructions="look",
                tools=None,
                model=None,
                task_prefix=team.id,
            )
            await self.teams.send(
                team,
                scout.name,
                "coordinator",
                "kept for the next run",
                max_mails=200,
                max_bytes=16_384,
            )
            self.lost.append(task.task_id)
            raise ConnectionError(f"agent-worker-0 died running {task.task_id}")
        return await self.local.run(task)


async def test_unread_mail_waits_for_the_coordinators_next_run(
    make_settings: Any, llm: OpenAIFake
) -> None:
    settings = agent_settings(make_settings, llm, team_receive_poll_s=0.5)
    assert settings.database_url
    db = await connect(settings.database_url)
    events_store = EventStore(db.pool)
    gateway = Gateway(settings, MetricsRecorder("test"))
    teams = TeamStore(db.pool, events_store)
    waker = MailWaker(settings.database_url, settings.team_receive_poll_s)
    local: LocalDispatcher | None = None

    async def dispatch(task: AgentTask) -> TaskResult:
        assert local is not None
        return await local.run(task)

    hub = TeamHub(teams, settings, dispatch, waker)
    runner = AgentRunner(settings, gateway, events_store, default_registry(), {"teams": hub})
    local = LocalDispatcher(runner)
    dispatcher = LosesFirstRun(local, teams)
    store = WorkflowStore(db.pool, events_store)
    engine = WorkflowEngine(store, dispatcher, settings, supervisor=make_supervisor())
    try:
        lead = steps_directive(("team_receive", {"timeout_s": 10}))
        spec = WorkflowSpec.parse("durable", [coordinate(lead, team={"max_members": 2})])
        wid = await store.create(spec, "ann")
        await engine.start(wid)
        final = await engine.wait(wid, within=60)
        assert str(final.status) == "completed", final
        assert dispatcher.lost == [f"{wid}:lead:1"]
        assert final.steps[0].result == ('steps: {"from": "m1", "text": "kept for the next run"}')
        rows = await db.pool.fetch(
            "SELECT type, data FROM events WHERE aggregate_id ="
            " (SELECT id FROM teams WHERE workflow_id = $1) ORDER BY seq",
            wid,
        )
        types = [r["type"] for r in rows]
        # One team across both attempts; the lost run's member failed when the next opened it.
        assert types == [
            "team.created",
            "team.member_joined",
            "team.mail_sent",
            "team.member_left",
            "team.destroyed",
        ]
        assert json.loads(rows[3]["data"])["why"] == "failed"
        owners = await db.pool.fetch(
            "SELECT user_uuid FROM team_mail WHERE team_id ="
            " (SELECT id FROM teams WHERE workflow_id = $1)",
            wid,
        )
        assert [r["user_uuid"] for r in owners] == ["ann"]
    finally:
        await engine.shutdown()
        await waker.close()
        await gateway.aclose()
        await db.close()


class LosesTheCoordinator:
    """The coordinator's worker is lost after its team got a member (written through the
    team store, as that run would have): the attempt fails with no retry left (`fail`), or
    never answers (`hang`, until the workflow is cancelled). The run's own end never comes
    to close the team."""

    def __init__(self, teams: TeamStore, how: str) -> None:
        self.teams = teams
        self.how = how
        self.team: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def run(self, task: AgentTask) -> TaskResult:
        assert task.team is not None and task.workflow_id is not None
        team = await self.teams.open(
            workflow_id=task.workflow_id,
            step="lead",
            user_uuid=task.user_uuid,
            max_members=task.team.max_members,
            task_id=task.task_id,
        )
        await self.teams.join(
            team, role="scout", instructions="look", tools=None, model=None, task_prefix=team.id
        )
        self.team.set_result(team)
        if self.how == "hang":
            await asyncio.Event().wait()
        return TaskResult(task.task_id, "failed", None, "lost: worker died", 5, "agent-worker-0")


@pytest.mark.parametrize("how", ["fail", "hang"])
async def test_a_lost_coordinators_team_ends_with_its_step_or_workflow(
    make_settings: Any, llm: OpenAIFake, how: str
) -> None:
    settings = agent_settings(make_settings, llm)
    assert settings.database_url
    db = await connect(settings.database_url)
    events_store = EventStore(db.pool)
    teams = TeamStore(db.pool, events_store)
    waker = MailWaker(settings.database_url, settings.team_receive_poll_s)
    dispatcher = LosesTheCoordinator(teams, how)
    store = WorkflowStore(db.pool, events_store)
    engine = WorkflowEngine(store, dispatcher, settings, supervisor=make_supervisor())
    try:
        spec = WorkflowSpec.parse("lost", [coordinate("lead", team={"max_members": 2})])
        wid = await store.create(spec, "ann")
        await engine.start(wid)
        team = await asyncio.wait_for(dispatcher.team, 30)
        if how == "hang":
            assert await engine.cancel(wid) == "cancelled"
        final = await engine.wait(wid, within=30)
        assert str(final.status) == ("failed" if how == "fail" else "cancelled"), final
        rows = await db.pool.fetch(
            "SELECT type, data FROM events WHERE aggregate_id = $1 ORDER BY seq", team.id
        )
        data = [(r["type"], json.loads(r["data"])) for r in rows]
        assert [t for t, _ in data] == [
            "team.created",
            "team.member_joined",
            "team.member_left",
            "team.destroyed",
        ]
        assert (data[2][1]["member"], data[2][1]["why"]) == ("m1", "stopped")
        reason = "step failed" if how == "fail" else "workflow cancelled"
        assert data[3][1]["reason"] == reason
        seat = await teams.seat(team.id, "m1")
        assert seat is not None and seat[0].state == "destroyed"
        assert seat[1].state == "stopped" and seat[0].reason == reason
        # The member, still running on another worker, finds its tools refused.
        hub = TeamHub(teams, settings, dispatcher.run, waker)
        member = AgentTask(
            task_id=f"{team.id}:m1",
            user_uuid="ann",
            prompt="look",
            workflow_id=wid,
            step="lead",
            team=TeamSeat(member="m1", team_id=team.id),
        )
        async with hub.session(member, "agent-worker-1") as room:
            assert room is not None
            send = next(t for t in room.tools() if t.name == "team_send")
            ctx = ToolContext(member, settings, {})
            with pytest.raises(ToolFailed, match="you are no longer in the team"):
                await send.handler(ctx, {"to": "coordinator", "message": "done?"})
    finally:
        await engine.shutdown()
        await waker.close()
        await db.close()


async def test_a_parked_coordinator_records_that_it_waits_for_a_decision(
    make_settings: Any, llm: OpenAIFake
) -> None:
    settings = agent_settings(make_settings, llm)
    assert settings.database_url
    db = await connect(settings.database_url)
    events_store = EventStore(db.pool)
    teams = TeamStore(db.pool, events_store)
    waker = MailWaker(settings.database_url, settings.team_receive_poll_s)

    async def never(task: AgentTask) -> TaskResult:
        raise AssertionError("no member is spawned here")

    hub = TeamHub(teams, settings, never, waker)
    try:
        spec = WorkflowSpec.parse("parks", [coordinate("lead", team={})])
        wid = await WorkflowStore(db.pool, events_store).create(spec, "ann")
        lead = AgentTask(
            task_id=f"{wid}:lead:1",
            user_uuid="ann",
            prompt="lead",
            workflow_id=wid,
            step="lead",
            team=TeamSeat(),
        )
        with pytest.raises(TaskParked):
            async with hub.session(lead, "agent-worker-0") as room:
                assert room is not None
                raise TaskParked("iv-1")
        reason = await db.pool.fetchval("SELECT reason FROM teams WHERE workflow_id = $1", wid)
        assert reason == "waiting for a decision"
    finally:
        await waker.close()
        await db.close()


async def test_a_mail_wakes_only_its_own_mailbox(make_settings: Any, llm: OpenAIFake) -> None:
    """The waiter for m1's mail is not woken by other events of the system, nor by mail to
    someone else: it looks once on entry and once when its mail has come."""
    settings = agent_settings(make_settings, llm)
    assert settings.database_url
    db = await connect(settings.database_url)
    events_store = EventStore(db.pool)
    teams = TeamStore(db.pool, events_store)
    waker = MailWaker(settings.database_url, poll_s=30)  # no poll within the test
    try:
        spec = WorkflowSpec.parse("mail", [coordinate("lead", team={})])
        workflows = WorkflowStore(db.pool, events_store)
        wid = await workflows.create(spec, "ann")
        team = await teams.open(
            workflow_id=wid, step="lead", user_uuid="ann", max_members=2, task_id="t"
        )
        for _ in range(2):
            await teams.join(
                team, role="r", instructions="i", tools=None, model=None, task_prefix=team.id
            )
        looks = 0

        async def look() -> Any:
            nonlocal looks
            looks += 1
            return await teams.take(team, "m1")

        waiting = asyncio.create_task(waker.wait_for(f"{team.id}:m1", look, 20))
        await until(lambda: _true(looks == 1))
        for _ in range(5):  # other events of the system (workflow.created), with their NOTIFY
            await workflows.create(spec, "bob")
        limits = {"max_mails": 10, "max_bytes": 100}
        await teams.send(team, "m1", "m2", "not for m1", **limits)
        await teams.send(team, "m2", "coordinator", "nor this", **limits)
        await teams.send(team, "coordinator", "m1", "for m1", **limits)
        mail = await asyncio.wait_for(waiting, 10)
        assert mail is not None and mail.body == "for m1"
        assert looks == 2
    finally:
        await waker.close()
        await db.close()


async def _true(value: bool) -> bool:
    return value
