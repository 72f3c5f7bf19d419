"""The scheduler over HTTP (the app with its in-process scheduler, real Postgres) against a
loopback model steered by the prompt: endpoints and errors, firing, run-now, overlap, auto-pause,
limits, catch-up with stagger, the lease, interrupted runs."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator.agents import AgentTask, TaskResult
from orchestrator.db import connect
from orchestrator.errors import Conflict
from orchestrator.events import EventStore
from orchestrator.runtime.supervisor import Supervisor
from orchestrator.scheduler import JobSpec, JobStore, SchedulerService, at, every
from tests.conftest import ADMIN_TOKEN, ServedApp, make_supervisor
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings, user

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as server:
        yield server


async def _events(c: httpx.AsyncClient, types: str, h: dict[str, str] = ADMIN) -> list[Any]:
    r = await c.get("/events", headers=h, params={"types": types, "limit": 1000})
    return list(r.json()["data"])


async def _until(check: Any, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


@pytest.fixture
async def api(make_settings: Any, llm: OpenAIFake) -> AsyncIterator[httpx.AsyncClient]:
    settings = agent_settings(make_settings, llm, max_consecutive_errors=3, max_scheduled_jobs=6)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def test_endpoints_and_errors(api: httpx.AsyncClient) -> None:
    bob = await user(api, "bob")
    made = await api.post(
        "/schedules", headers=ADMIN, json={"prompt": "report", "cron": "0 9 * * 1-5"}
    )
    assert made.status_code == 200, made.text
    body = made.json()
    assert body["status"] == "ok" and isinstance(body["id"], int) and body["next_run"] > 0
    jid = body["id"]
    detail = (await api.get(f"/schedules/{jid}", headers=ADMIN)).json()
    for field in (
        "id",
        "name",
        "schedule_type",
        "cron_expr",
        "prompt",
        "model",
        "enabled",
        "next_run",
        "last_run",
        "last_result",
        "consecutive_errors",
        "user_uuid",
        "created_at",
    ):
        assert field in detail, field
    assert detail["schedule_type"] == "cron" and detail["cron_expr"] == "0 9 * * 1-5"
    assert detail["enabled"] is True and detail["user_uuid"] == "admin"
    listed = (await api.get("/schedules", headers=ADMIN, params={"per_page": 10})).json()
    assert listed["total"] == 1 and listed["page"] == 1 and listed["per_page"] == 10
    assert listed["items"][0]["id"] == jid and "prompt" not in listed["items"][0]
    assert (await api.get("/schedules", headers=bob)).json() == {
        "items": [],
        "total": 0,
        "page": 1,
        "per_page": 50,
    }
    # Non-admins: 403 on every mutation; the detail of a job that is not theirs is 404.
    for method, path in (
        ("POST", "/schedules"),
        ("DELETE", f"/schedules/{jid}"),
        ("POST", f"/schedules/{jid}/pause"),
        ("POST", f"/schedules/{jid}/unpause"),
        ("POST", f"/schedules/{jid}/run"),
    ):
        r = await api.request(method, path, headers=bob, json={"prompt": "x", "every": 5000})
        assert r.status_code == 403, (path, r.text)
    assert (await api.get(f"/schedules/{jid}", headers=bob)).status_code == 404
    assert (await api.get("/schedules/abc", headers=ADMIN)).status_code == 400
    assert (await api.get("/schedules/999999", headers=ADMIN)).status_code == 404
    for method, path in (
        ("DELETE", "/schedules/999999"),
        ("POST", "/schedules/999999/run"),
        ("POST", "/schedules/999999/pause"),
    ):
        assert (await api.request(method, path, headers=ADMIN)).status_code == 404
    # Pause, run while paused, unpause (next run from now), delete.
    assert (await api.post(f"/schedules/{jid}/pause", headers=ADMIN)).json()["status"] == "paused"
    assert (await api.get(f"/schedules/{jid}", headers=ADMIN)).json()["enabled"] is False
    r = await api.post(f"/schedules/{jid}/run", headers=ADMIN)
    assert r.status_code == 400 and "unpause" in r.json()["error"]
    r = await api.post(f"/schedules/{jid}/unpause", headers=ADMIN)
    assert r.json()["status"] == "active" and r.json()["next_run"] > time.time() * 1000
    assert (await api.delete(f"/schedules/{jid}", headers=ADMIN)).json()["status"] == "deleted"
    assert (await api.get(f"/schedules/{jid}", headers=ADMIN)).status_code == 404


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"every": 5000}, "missing prompt"),
        ({"prompt": "x"}, "exactly one of"),
        ({"prompt": "x", "every": 5000, "cron": "* * * * *"}, "exactly one of"),
        ({"prompt": "x", "cron": "61 * * * *"}, "invalid cron expression"),
        ({"prompt": "x", "cron": "* * * *"}, "invalid cron expression"),
        ({"prompt": "x", "every": 0}, "every"),
        ({"prompt": "x", "every": "5000"}, "every"),
        ({"prompt": "x", "at": 1000}, "future"),
        ({"prompt": "x", "schedule": "whenever you like"}, "cannot understand"),
        ({"prompt": "x", "cron": "0 9 * * *", "delete_after_run": True}, "only for at"),
        ({"prompt": "x", "cron": "0 9 * * *", "tz": "Nowhere/Else"}, "time zone"),
    ],
)
async def test_create_400s(api: httpx.AsyncClient, body: dict[str, Any], needle: str) -> None:
    r = await api.post("/schedules", headers=ADMIN, json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]


async def test_every_job_fires_as_its_creator_and_run_now(api: httpx.AsyncClient) -> None:
    made = await api.post("/tokens", headers=ADMIN, json={"user_uuid": "carol", "admin": True})
    carol = {"Authorization": f"Bearer {made.json()['token']}"}
    jid = (
        await api.post("/schedules", headers=carol, json={"prompt": "tick", "every": 1000})
    ).json()["id"]
    runs = await _until(lambda: _events(api, "scheduler.job_executed"), within=10)
    await _until(lambda: _count(api, "scheduler.job_executed", 2), within=10)
    runs = await _events(api, "scheduler.job_executed")
    assert all(e["data"]["result"] == "ok" for e in runs)
    tasks = await _events(api, "task.completed", carol)
    assert tasks and all(e["data"]["task_id"].startswith(f"job-{jid}-run-") for e in tasks)
    detail = (await api.get(f"/schedules/{jid}", headers=carol)).json()
    assert detail["last_result"] == "ok" and detail["last_run"] > 0
    assert detail["consecutive_errors"] == 0
    # Run now: a slow job dispatched at once, then 409 while it runs (run and delete).
    slow = (
        await api.post(
            "/schedules", headers=ADMIN, json={"prompt": "[sleep 3]", "cron": "0 0 1 1 *"}
        )
    ).json()["id"]
    assert (await api.post(f"/schedules/{slow}/run", headers=ADMIN)).json()[
        "status"
    ] == "dispatched"
    await _until(lambda: _running(api, slow))
    assert (await api.post(f"/schedules/{slow}/run", headers=ADMIN)).status_code == 409
    assert (await api.delete(f"/schedules/{slow}", headers=ADMIN)).status_code == 409


async def _count(api: httpx.AsyncClient, types: str, n: int) -> bool:
    return len(await _events(api, types)) >= n


async def _running(api: httpx.AsyncClient, jid: int) -> bool:
    return bool((await api.get(f"/schedules/{jid}", headers=ADMIN)).json()["running"])


async def test_auto_pause_after_consecutive_errors_and_limit(api: httpx.AsyncClient) -> None:
    jid = (
        await api.post("/schedules", headers=ADMIN, json={"prompt": "[fail]", "every": 1000})
    ).json()["id"]

    async def paused() -> bool:
        return not (await api.get(f"/schedules/{jid}", headers=ADMIN)).json()["enabled"]

    await _until(paused, within=20)
    detail = (await api.get(f"/schedules/{jid}", headers=ADMIN)).json()
    assert detail["consecutive_errors"] == 3 and detail["last_result"] == "error"
    executed = await _events(api, "scheduler.job_executed")
    assert executed[-1]["data"].get("auto_paused") is True
    assert "3 consecutive errors" in executed[-1]["data"]["reason"]
    # max_scheduled_jobs (6 here): paused jobs do not count.
    for i in range(6):
        r = await api.post(
            "/schedules", headers=ADMIN, json={"prompt": f"p{i}", "cron": "0 0 1 1 *"}
        )
        assert r.status_code == 200
    r = await api.post("/schedules", headers=ADMIN, json={"prompt": "one more", "every": 60000})
    assert r.status_code == 409 and "max_scheduled_jobs" in r.json()["error"]


async def test_overlap_skip(api: httpx.AsyncClient) -> None:
    jid = (
        await api.post("/schedules", headers=ADMIN, json={"prompt": "[sleep 2.5]", "every": 1000})
    ).json()["id"]
    await asyncio.sleep(4.5)
    dispatched = [
        e for e in await _events(api, "scheduler.task_dispatched") if e["data"]["job_id"] == jid
    ]
    # Fired at ~1 s and again after the first run ended (~3.5 s): the slots at 2 and 3 s
    # were skipped because the run was still going.
    assert len(dispatched) == 2, dispatched


class _Recorder:
    """A dispatcher that records when each task came (the runs' agent work is not the
    point of these tests)."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, AgentTask]] = []

    async def run(self, task: AgentTask) -> TaskResult:
        self.seen.append((time.monotonic(), task))
        return TaskResult(task.task_id, "completed", "ok", None, 1, "test")


async def test_catch_up_lease_and_interrupted_runs(make_settings: Any) -> None:
    settings = make_settings(catchup_stagger_ms=200, max_catchup_runs=5)
    assert settings.database_url
    db = await connect(settings.database_url)
    try:
        store = JobStore(db.pool, EventStore(db.pool))
        ids = []
        for i in range(8):
            job = await store.create(
                JobSpec(name=f"j{i}", prompt=f"p{i}", schedule=every(3_600_000)), "admin", 100
            )
            ids.append(job.id)
        now = int(time.time() * 1000)
        # Missed: next_run in the past, job i overdue by 8 - i minutes.
        for i, jid in enumerate(ids):
            await db.pool.execute(
                "UPDATE scheduled_jobs SET next_run = $2 WHERE id = $1", jid, now - (8 - i) * 60_000
            )
        # One run interrupted by a crash.
        await db.pool.execute(
            "INSERT INTO scheduled_runs (job_id, task_id, started_at) VALUES ($1, 'job-x', $2)",
            ids[7],
            now - 1000,
        )
        await db.pool.execute("UPDATE scheduled_jobs SET running = 1 WHERE id = $1", ids[7])
        first, second = _Recorder(), _Recorder()
        # Two processes: a supervisor each.
        sups = [make_supervisor("one"), make_supervisor("two")]
        one = SchedulerService(store, first, settings, settings.database_url, sups[0], name="one")
        two = SchedulerService(store, second, settings, settings.database_url, sups[1], name="two")
        one.start()
        two.start()
        try:
            await _until(lambda: _settled(first, second, 5), within=15)
            await asyncio.sleep(0.5)
            assert [one.active, two.active].count(True) == 1
            fired = first.seen or second.seen
            assert not (first.seen and second.seen)  # never both
            assert len(fired) == 5
            names = [t.prompt for _, t in fired]
            assert names == ["p0", "p1", "p2", "p3", "p4"]  # most overdue first
            gaps = [b - a for (a, _), (b, _) in itertools.pairwise(fired)]
            assert all(g >= 0.19 for g in gaps), gaps
            later = [await store.get(j) for j in ids[5:]]
            assert all(j is not None and j.next_run and j.next_run > now for j in later)
            interrupted = await store.get(ids[7])
            assert interrupted is not None
            assert interrupted.last_result == "error" and interrupted.consecutive_errors == 1
            assert interrupted.running == 0
            # The active one stops: the other takes the lease over.
            active, waiting = (one, two) if one.active else (two, one)
            await active.shutdown()
            await _until(lambda: _is_active(waiting), within=10)
        finally:
            await one.shutdown()
            await two.shutdown()
            for sup in sups:
                await sup.aclose()
    finally:
        await db.close()


async def _settled(a: _Recorder, b: _Recorder, n: int) -> bool:
    return len(a.seen) + len(b.seen) >= n


async def _is_active(s: SchedulerService) -> bool:
    return s.active


class _Slow(_Recorder):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.ended: list[float] = []

    async def run(self, task: AgentTask) -> TaskResult:
        self.seen.append((time.monotonic(), task))
        await asyncio.sleep(self.seconds)
        self.ended.append(time.monotonic())
        return TaskResult(task.task_id, "completed", "ok", None, 1, "test")


@pytest.mark.parametrize("overlap", ["allow", "queue"])
async def test_overlap_allow_and_queue(
    make_settings: Any, supervisor: Supervisor, overlap: str
) -> None:
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    slow = _Slow(2.2)
    store = JobStore(db.pool, EventStore(db.pool))
    service = SchedulerService(store, slow, settings, settings.database_url, supervisor)
    service.start()
    try:
        await store.create(
            JobSpec(name="o", prompt="p", schedule=every(1000), overlap=overlap), "admin", 10
        )
        await asyncio.sleep(4.6)
        starts = [t for t, _ in slow.seen]
        if overlap == "allow":
            assert len(starts) >= 4  # every second, side by side
        else:
            # The first run (~1 s) is still going at 2 s: one run waits and starts the moment
            # the first ends (~3.2 s); nothing else runs meanwhile.
            assert len(starts) == 2, starts
            assert abs(starts[1] - slow.ended[0]) < 0.3
    finally:
        await service.shutdown()
        await db.close()


async def test_catch_up_switched_off(make_settings: Any, supervisor: Supervisor) -> None:
    settings = make_settings(catchup_enabled=False)
    assert settings.database_url
    db = await connect(settings.database_url)
    seen = _Recorder()
    store = JobStore(db.pool, EventStore(db.pool))
    job = await store.create(JobSpec(name="m", prompt="p", schedule=every(3_600_000)), "admin", 10)
    now = int(time.time() * 1000)
    await db.pool.execute(
        "UPDATE scheduled_jobs SET next_run = $2 WHERE id = $1", job.id, now - 5000
    )
    service = SchedulerService(store, seen, settings, settings.database_url, supervisor)
    service.start()
    try:
        await _until(lambda: _is_active(service))
        await asyncio.sleep(0.5)
        assert seen.seen == []
        later = await store.get(job.id)
        assert later is not None and later.next_run is not None and later.next_run > now
    finally:
        await service.shutdown()
        await db.close()


async def test_lease_lost_mid_run_counts_the_run_once(
    make_settings: Any, supervisor: Supervisor
) -> None:
    """The scheduler's connection dies while a run is in flight: it takes the lease back
    without calling its own run interrupted, and the run's end is recorded exactly once."""
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    slow = _Slow(3.0)
    store = JobStore(db.pool, EventStore(db.pool))
    service = SchedulerService(store, slow, settings, settings.database_url, supervisor)
    service.start()
    try:
        job = await store.create(
            JobSpec(name="l", prompt="p", schedule=every(3_600_000)), "admin", 10
        )
        await _until(lambda: _is_active(service))
        await store.request_run(job.id)
        service.poke()
        await _until(lambda: _started(slow))
        # Kill the scheduler's own connection (its LISTEN) under it: it gives the lease up
        # and takes it again.
        killed = await db.pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()"
        )
        assert killed == 1
        await _until(lambda: _ended(slow), within=10)
        await asyncio.sleep(0.5)
        after = await store.get(job.id)
        assert after is not None
        assert after.running == 0 and after.last_result == "ok", after
        assert after.consecutive_errors == 0
        runs = await db.pool.fetch("SELECT result FROM scheduled_runs WHERE job_id = $1", job.id)
        assert [r["result"] for r in runs] == ["ok"]
        # Recording an end twice changes nothing the second time.
        run_id = await db.pool.fetchval("SELECT id FROM scheduled_runs WHERE job_id = $1", job.id)
        twice = await store.finish_run(
            job.id,
            run_id,
            result="error",
            error="late",
            task_id="t",
            duration_ms=1,
            max_errors=3,
        )
        assert twice is not None and twice.last_result == "ok" and twice.consecutive_errors == 0
    finally:
        await service.shutdown()
        await db.close()


async def test_queued_run_survives_a_scheduler_restart(
    make_settings: Any, supervisor: Supervisor
) -> None:
    """A run waiting (overlap `queue`) behind one that a dead scheduler left unfinished goes
    as soon as the next scheduler records that run as interrupted."""
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    seen = _Recorder()
    store = JobStore(db.pool, EventStore(db.pool))
    job = await store.create(
        JobSpec(name="q", prompt="queued", schedule=every(3_600_000), overlap="queue"),
        "admin",
        10,
    )
    await db.pool.execute(
        "INSERT INTO scheduled_runs (job_id, task_id, started_at) VALUES ($1, 'job-y', $2)",
        job.id,
        int(time.time() * 1000) - 1000,
    )
    await db.pool.execute(
        "UPDATE scheduled_jobs SET running = 1, queued = true WHERE id = $1", job.id
    )
    service = SchedulerService(store, seen, settings, settings.database_url, supervisor)
    service.start()
    try:
        await _until(lambda: _settled(seen, _Recorder(), 1))
        assert [t.prompt for _, t in seen.seen] == ["queued"]
    finally:
        await service.shutdown()
        await db.close()


async def _started(s: _Slow) -> bool:
    return bool(s.seen)


async def _ended(s: _Slow) -> bool:
    return bool(s.ended)


# --- issue 33 ---------------------------------------------------------------------------------


async def test_startup_catches_up_however_long_ago_and_pauses_failing_jobs(
    make_settings: Any, supervisor: Supervisor
) -> None:
    """Catch-up has no window by default (a job missed three days ago runs), and a job at
    max_consecutive_errors is paused at startup rather than caught up."""
    settings = make_settings(catchup_stagger_ms=0)
    assert settings.catchup_window_ms == 0
    assert settings.database_url
    db = await connect(settings.database_url)
    seen = _Recorder()
    store = JobStore(db.pool, EventStore(db.pool))
    old = await store.create(JobSpec(name="old", prompt="old", schedule=every(3_600_000)), "a", 9)
    bad = await store.create(JobSpec(name="bad", prompt="bad", schedule=every(3_600_000)), "a", 9)
    now = int(time.time() * 1000)
    await db.pool.execute(
        "UPDATE scheduled_jobs SET next_run = $1 WHERE id = ANY($2::bigint[])",
        now - 3 * 86_400_000,
        [old.id, bad.id],
    )
    await db.pool.execute(
        "UPDATE scheduled_jobs SET consecutive_errors = $2 WHERE id = $1",
        bad.id,
        settings.max_consecutive_errors,
    )
    service = SchedulerService(store, seen, settings, settings.database_url, supervisor)
    service.start()
    try:
        await _until(lambda: _settled(seen, _Recorder(), 1))
        paused = await store.get(bad.id)
        assert paused is not None and not paused.enabled
        assert paused.paused_reason and "consecutive errors" in paused.paused_reason
        # The pause commits before catch-up starts (`_schedule`), so once "old" was caught up
        # "bad" could only have run already: its run row would be there.
        assert [t.prompt for _, t in seen.seen] == ["old"]
        assert not await db.pool.fetchval(
            "SELECT count(*) FROM scheduled_runs WHERE job_id = $1", bad.id
        )
        caught = await db.pool.fetchval(
            "SELECT catchup FROM scheduled_runs WHERE job_id = $1", old.id
        )
        assert caught is True
    finally:
        await service.shutdown()
        await db.close()


async def test_job_limit_counts_runnable_jobs_and_unpause(make_settings: Any) -> None:
    """max_scheduled_jobs counts jobs that can still run (not a fired `at` job, not a paused
    one) and is checked on unpause; unpausing an active job changes nothing."""
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    try:
        store = JobStore(db.pool, EventStore(db.pool))
        fired = await store.create(
            JobSpec(name="at", prompt="p", schedule=at(int(time.time() * 1000) + 60_000)), "a", 2
        )
        # As the scheduler leaves a fired one-time job: no run ahead.
        await db.pool.execute("UPDATE scheduled_jobs SET next_run = NULL WHERE id = $1", fired.id)
        one = await store.create(JobSpec(name="1", prompt="p", schedule=every(60_000)), "a", 2)
        two = await store.create(JobSpec(name="2", prompt="p", schedule=every(60_000)), "a", 2)
        with pytest.raises(Conflict, match="max_scheduled_jobs"):
            await store.create(JobSpec(name="3", prompt="p", schedule=every(60_000)), "a", 2)
        await store.pause(one.id)
        three = await store.create(JobSpec(name="3", prompt="p", schedule=every(60_000)), "a", 2)
        with pytest.raises(Conflict, match="max_scheduled_jobs"):
            await store.unpause(one.id, 2)
        still = await store.get(one.id)
        assert still is not None and not still.enabled
        # An active job: same next run, errors count and updated_at, no event.
        await db.pool.execute(
            "UPDATE scheduled_jobs SET consecutive_errors = 2 WHERE id = $1", two.id
        )
        before = await store.require(two.id)
        events_before = await db.pool.fetchval("SELECT count(*) FROM events")
        after = await store.unpause(two.id, 2)
        assert (after.next_run, after.consecutive_errors, after.updated_at) == (
            before.next_run,
            2,
            before.updated_at,
        )
        assert await db.pool.fetchval("SELECT count(*) FROM events") == events_before
        await store.delete(three.id)
        assert (await store.unpause(one.id, 2)).enabled
    finally:
        await db.close()


async def test_run_now_answers_once_dispatched(api: httpx.AsyncClient) -> None:
    """POST /schedules/<id>/run answers after the run's dispatch: its task id is in the
    answer and the dispatch event is already there."""
    jid = (
        await api.post("/schedules", headers=ADMIN, json={"prompt": "[sleep 1]", "every": 60_000})
    ).json()["id"]
    await api.post(f"/schedules/{jid}/pause", headers=ADMIN)
    assert (await api.post(f"/schedules/{jid}/run", headers=ADMIN)).status_code == 400
    slow = (
        await api.post("/schedules", headers=ADMIN, json={"prompt": "x", "cron": "0 0 1 1 *"})
    ).json()["id"]
    r = await api.post(f"/schedules/{slow}/run", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "dispatched" and body["task_id"].startswith(f"job-{slow}-run-")
    dispatched = await _events(api, "scheduler.task_dispatched")
    assert [e["data"]["task_id"] for e in dispatched if e["data"]["job_id"] == slow] == [
        body["task_id"]
    ]


async def test_a_one_ms_interval_never_overlaps_itself(
    make_settings: Any, supervisor: Supervisor
) -> None:
    """`every: 1` is accepted; under `skip` its runs go one after another, none side by side,
    and the slots skipped meanwhile are not rewritten every millisecond."""
    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    slow = _Slow(0.6)
    store = JobStore(db.pool, EventStore(db.pool))
    service = SchedulerService(store, slow, settings, settings.database_url, supervisor)
    service.start()
    try:
        job = await store.create(JobSpec(name="fast", prompt="p", schedule=every(1)), "a", 10)
        await _until(lambda: _ended_n(slow, 2), within=10)
        await service.shutdown()
        starts = [t for t, _ in slow.seen]
        for start, end in zip(starts[1:], slow.ended, strict=False):
            assert start >= end - 0.01  # the next run began after the previous ended
        # While a run went on (0.6 s), its skipped slots were rewritten at most every 100 ms.
        updates = await db.pool.fetchval(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'scheduled_jobs'"
        )
        assert updates is None or updates < 200, updates
        assert (await store.require(job.id)).running <= 1
    finally:
        await service.shutdown()
        await db.close()


async def _ended_n(slow: _Slow, n: int) -> bool:
    return len(slow.ended) >= n
