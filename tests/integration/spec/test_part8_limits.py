"""SPEC part 8, "Limits": every row, first as the default of the setting that holds it, then
(where a request can show it) as the service's behaviour with those defaults. Each case's id
is the row it checks. The scheduler's catch-up, stagger, timer clamp and per-tick rows are
behaviours of a (re)starting scheduler and are exercised with small values in
tests/integration/test_scheduler.py and test_scheduler_tick.py; here their defaults."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from orchestrator.config import Settings
from tests.integration.spec._kit import ADMIN, Spec, error_body, until

DEFAULTS = [
    ("max_scheduled_jobs", "max_scheduled_jobs", 1000),
    ("max_consecutive_errors", "max_consecutive_errors", 10),
    ("max_catchup_runs", "max_catchup_runs", 5),
    ("catchup_stagger_ms", "catchup_stagger_ms", 5000),
    ("timer_clamp_ms", "timer_clamp_ms", 60000),
    ("max_dispatch_per_tick", "max_dispatch_per_tick", 5),
    ("Schedule list per_page default", "schedules_per_page", 50),
    ("Marketplace publish rate", "marketplace_publish_per_hour", 10),
    ("Skill body", "skill_body_max", 4096),
    ("Marketplace browse limit", "marketplace_browse_limit", 50),
    ("Memory agent_id", "memory_agent_id_max", 128),
    ("Memory list limit", "memory_list_limit", 50),
    ("Memory search limit", "memory_search_limit", 20),
    ("Vector threshold", "memory_vector_threshold", 0.75),
    ("Events limit", "events_limit", 100),
]


@pytest.mark.parametrize(
    ("setting", "value"),
    [pytest.param(s, v, id=f"SPEC part 8: {row} {v} (default)") for row, s, v in DEFAULTS],
)
def test_defaults(setting: str, value: object) -> None:
    assert getattr(Settings.load(environ={}), setting) == value


# --- GET /schedules, /marketplace/browse, /events: the page size they answer with ---------


async def test_schedule_per_page_default(spec: Spec) -> None:
    """SPEC part 8: Schedule list per_page default 50 (GET /schedules)."""
    body = (await spec.c.get("/schedules", headers=ADMIN)).json()
    assert body["per_page"] == 50 and body["page"] == 1


async def test_browse_limit_default(spec: Spec) -> None:
    """SPEC part 8: Marketplace browse limit 50 default."""
    h = await spec.user("p8-browse")
    body = (await spec.c.get("/marketplace/browse", headers=h)).json()
    assert body["limit"] == 50 and body["offset"] == 0


async def test_events_limit_default(spec: Spec) -> None:
    """SPEC part 8: Events limit 100 default (GET /events), and a page holds at most that."""
    body = (await spec.c.get("/events", headers=ADMIN)).json()
    assert body["limit"] == 100 and body["offset"] == 0
    assert len(body["data"]) <= 100
    if body["total"] > 100:
        assert len(body["data"]) == 100


# --- Memory -------------------------------------------------------------------------------


async def test_memory_agent_id_max(spec: Spec) -> None:
    """SPEC part 8: Memory agent_id 128 characters max, default `default`."""
    h = await spec.user("p8-ns")
    body = {"key": "k", "value": "v"}
    assert (
        await spec.c.post(f"/memory/{'n' * 128}/store", headers=h, json=body)
    ).status_code == 200
    r = await spec.c.post(f"/memory/{'n' * 129}/store", headers=h, json=body)
    assert r.status_code == 400, r.text
    error_body(r)
    assert (await spec.c.post("/memory/default/store", headers=h, json=body)).status_code == 200


async def test_memory_list_and_search_limits(spec: Spec) -> None:
    """SPEC part 8: Memory list limit 50 default; Memory search limit 20 default (search)."""
    h = await spec.user("p8-mem")
    sem = asyncio.Semaphore(8)

    async def store(i: int) -> None:
        async with sem:
            r = await spec.c.post(
                "/memory/p8-mem/store",
                headers=h,
                json={"key": f"k{i:02d}", "value": f"apple note number {i}"},
            )
            assert r.status_code == 200, r.text

    await asyncio.gather(*(store(i) for i in range(55)))
    listed = (await spec.c.get("/memory/p8-mem/list", headers=h)).json()["entries"]
    assert len(listed) == 50
    rest = (await spec.c.get("/memory/p8-mem/list", headers=h, params={"offset": 50})).json()
    assert len(rest["entries"]) == 5
    found = (await spec.c.get("/memory/p8-mem/search", headers=h, params={"q": "apple"})).json()
    assert len(found["results"]) == 20


def _unit(angle: float, dim: int) -> list[float]:
    return [math.cos(angle), math.sin(angle)] + [0.0] * (dim - 2)


async def test_vector_limit_and_threshold(spec: Spec) -> None:
    """SPEC part 8: Memory search limit 20 default (vector search); Vector threshold 0.75
    default: entries at cosine similarity 0.8 are found, those at 0.7 are not."""
    h = await spec.user("p8-vec")
    dim = spec.settings.memory_embedding_dim
    sem = asyncio.Semaphore(8)

    async def store(key: str, vec: list[float]) -> None:
        async with sem:
            r = await spec.c.post(
                "/memory/p8-vec/store", headers=h, json={"key": key, "value": key, "embedding": vec}
            )
            assert r.status_code == 200, r.text

    near, far = math.acos(0.8), math.acos(0.7)
    await asyncio.gather(
        *(store(f"near{i}", _unit(near, dim)) for i in range(22)),
        *(store(f"far{i}", _unit(far, dim)) for i in range(3)),
    )
    r = await spec.c.post(
        "/memory/p8-vec/vector-search", headers=h, json={"embedding": _unit(0, dim)}
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 20
    assert all(hit["key"].startswith("near") for hit in results)
    assert all(hit["similarity"] == pytest.approx(0.8, abs=1e-3) for hit in results)
    r = await spec.c.post(
        "/memory/p8-vec/vector-search",
        headers=h,
        json={"embedding": _unit(0, dim), "limit": 100, "threshold": 0.5},
    )
    assert {hit["key"][:3] for hit in r.json()["results"]} == {"nea", "far"}


# --- Marketplace --------------------------------------------------------------------------


async def test_skill_body_max(spec: Spec) -> None:
    """SPEC part 8: Skill body 4096 characters max (publish; characters, not bytes)."""
    h = await spec.user("p8-body")
    ok = await spec.c.post(
        "/marketplace/publish", headers=h, json={"name": "p8-b", "body": "é" * 4096}
    )
    assert ok.status_code == 200, ok.text
    over = await spec.c.post(
        "/marketplace/publish", headers=h, json={"name": "p8-c", "body": "x" * 4097}
    )
    assert over.status_code == 400, over.text
    error_body(over)


async def test_publish_rate(spec: Spec) -> None:
    """SPEC part 8: Marketplace publish rate 10 per hour (POST /marketplace/publish); SPEC
    part 7 names the rejection without a status: 429 with Retry-After (DESIGN)."""
    h = await spec.user("p8-rate")
    for i in range(10):
        r = await spec.c.post(
            "/marketplace/publish", headers=h, json={"name": f"r{i}", "body": "b"}
        )
        assert r.status_code == 200, r.text
    r = await spec.c.post("/marketplace/publish", headers=h, json={"name": "r10", "body": "b"})
    assert r.status_code == 429, r.text
    error_body(r)
    assert 0 < int(r.headers["Retry-After"]) <= 3600
    other = await spec.user("p8-rate-other")
    r = await spec.c.post("/marketplace/publish", headers=other, json={"name": "r10", "body": "b"})
    assert r.status_code == 200, r.text


# --- Workspace ----------------------------------------------------------------------------


async def test_workspace_max_results(spec: Spec) -> None:
    """SPEC part 8: Workspace search max_results caller-supplied."""
    h = await spec.user("p8-ws")
    for i in range(4):
        await spec.c.post("/workspace/write", headers=h, json={"path": f"f{i}.txt", "content": "x"})
    for n in (1, 3, 10):
        r = await spec.c.post(
            "/workspace/search", headers=h, json={"query": "*.txt", "max_results": n}
        )
        assert r.status_code == 200, r.text
        assert r.json()["count"] == min(n, 4) == len(r.json()["results"])


# --- Scheduler ----------------------------------------------------------------------------


async def test_max_consecutive_errors_auto_pause(spec: Spec) -> None:
    """SPEC part 8: max_consecutive_errors 10 auto-pause threshold (and SPEC part 3: active
    -> paused on 10 or more consecutive errors)."""
    r = await spec.c.post(
        "/schedules", headers=ADMIN, json={"name": "p8-fail", "prompt": "[fail]", "every": 50}
    )
    assert r.status_code == 200, r.text
    jid = r.json()["id"]

    async def paused() -> Any:
        job = (await spec.c.get(f"/schedules/{jid}", headers=ADMIN)).json()
        return job if not job["enabled"] else None

    job = await until(paused, 60)
    assert job["consecutive_errors"] == 10 and job["last_result"] == "error"


async def test_max_scheduled_jobs(spec: Spec) -> None:
    """SPEC part 8: max_scheduled_jobs 1000 maximum active jobs: the 1001st active job is
    refused (409, DESIGN); a paused job does not count."""
    # Jobs that can still run already (other cases of this module made some).
    active, page = 0, 1
    while True:
        got = await spec.c.get("/schedules", headers=ADMIN, params={"page": page, "per_page": 500})
        items = got.json()["items"]
        active += sum(1 for job in items if job["enabled"] and job["next_run"] is not None)
        if len(items) < 500:
            break
        page += 1
    at = int(time.time() * 1000) + 86_400_000
    sem = asyncio.Semaphore(8)

    async def make(i: int) -> int:
        async with sem:
            r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "x", "at": at + i})
            assert r.status_code == 200, r.text
            return int(r.json()["id"])

    ids = await asyncio.gather(*(make(i) for i in range(1000 - active)))
    over = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "x", "at": at})
    assert over.status_code == 409, over.text
    error_body(over)
    assert (await spec.c.post(f"/schedules/{ids[0]}/pause", headers=ADMIN)).status_code == 200
    r = await spec.c.post("/schedules", headers=ADMIN, json={"prompt": "x", "at": at})
    assert r.status_code == 200, r.text
    unpause = await spec.c.post(f"/schedules/{ids[0]}/unpause", headers=ADMIN)
    assert unpause.status_code == 409, unpause.text
