"""POST /schedules/preview (the app, real Postgres): the next runs a job with this schedule
would have if created now, by the scheduler's own schedule code, storing nothing; the same
400s as create for a bad schedule; admin only, as creating is."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from croniter import croniter

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.integration.test_workflows_api import user

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HOUR_MS = 3_600_000


@pytest.fixture
async def api(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with ServedApp(make_settings(rate_limit_per_minute=0)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def test_cron_phrase_and_interval_previews(api: httpx.AsyncClient) -> None:
    before = int(time.time() * 1000)
    r = await api.post("/schedules/preview", headers=ADMIN, json={"cron": "0 9 * * 1-5"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["schedule_type"] == "cron" and body["cron_expr"] == "0 9 * * 1-5"
    assert body["tz"] == "UTC" and len(body["next_runs"]) == 5
    # The five next weekday 9:00 UTC after now, as croniter counts them.
    it = croniter("0 9 * * 1-5", before / 1000)
    assert body["next_runs"] == [int(it.get_next(float)) * 1000 for _ in range(5)]

    phrase = await api.post(
        "/schedules/preview",
        headers=ADMIN,
        json={"schedule": "every day at 9:00", "tz": "Europe/Paris", "count": 3},
    )
    assert phrase.status_code == 200, phrase.text
    runs = phrase.json()["next_runs"]
    assert phrase.json()["cron_expr"] == "0 9 * * *" and phrase.json()["tz"] == "Europe/Paris"
    assert len(runs) == 3 and all(b - a == 24 * HOUR_MS for a, b in itertools.pairwise(runs))

    interval = await api.post("/schedules/preview", headers=ADMIN, json={"every": HOUR_MS})
    runs = interval.json()["next_runs"]
    assert interval.json()["interval_ms"] == HOUR_MS and len(runs) == 5
    assert before + HOUR_MS <= runs[0] <= int(time.time() * 1000) + HOUR_MS
    assert all(b - a == HOUR_MS for a, b in itertools.pairwise(runs))

    # A one-time job runs once; nothing was stored by any preview.
    at = before + 2 * HOUR_MS
    once = await api.post("/schedules/preview", headers=ADMIN, json={"at": at})
    assert once.json()["next_runs"] == [at]
    assert (await api.get("/schedules", headers=ADMIN)).json()["total"] == 0


async def test_the_preview_of_a_created_job_starts_at_its_next_run(
    api: httpx.AsyncClient,
) -> None:
    spec = {"cron": "*/10 * * * *"}
    preview = (await api.post("/schedules/preview", headers=ADMIN, json=spec)).json()
    made = (await api.post("/schedules", headers=ADMIN, json={"prompt": "p", **spec})).json()
    assert made["next_run"] == preview["next_runs"][0]


async def test_bad_schedules_and_non_admins(api: httpx.AsyncClient) -> None:
    for body, field in [
        ({"cron": "61 * * * *"}, "cron"),
        ({"schedule": "whenever you like"}, "schedule"),
        ({}, "schedule"),
        ({"cron": "* * * * *", "every": 60_000}, "schedule"),
        ({"cron": "* * * * *", "count": 0}, "count"),
        ({"cron": "* * * * *", "count": 51}, "count"),
        ({"cron": "* * * * *", "prompt": "not a preview field"}, "prompt"),
    ]:
        r = await api.post("/schedules/preview", headers=ADMIN, json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["ok"] is False and field in r.text, (body, r.text)
    bob = await user(api, "bob")
    r = await api.post("/schedules/preview", headers=bob, json={"cron": "* * * * *"})
    assert r.status_code == 403
