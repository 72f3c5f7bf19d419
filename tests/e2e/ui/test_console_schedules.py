"""The console's schedules page in a real browser against `scripts/serve`: create a job with
the phrase form and the cron form, each showing the scheduler's preview of its next 5 runs
(POST /schedules/preview) before it is created; pause, unpause and run it now from the list,
the run's `scheduler.task_dispatched` event appearing on the job's page; the job's name and
prompt (untrusted) render as text."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.test_workflows import Orchestrator
from tests.e2e.ui.conftest import shot

pytestmark = pytest.mark.e2e

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
RUN_EVENT = '[data-testid="schedule-event"][data-type="scheduler.task_dispatched"]'


def _admin_token(console: Orchestrator) -> str:
    return console.admin["Authorization"].removeprefix("Bearer ")


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _job_id(console: Orchestrator, name: str) -> int:
    with console.client() as c:
        items = c.get("/schedules", params={"per_page": 1000}).json()["items"]
    return int(next(j["id"] for j in items if j["name"] == name))


def test_create_with_the_preview_of_the_next_runs(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any]
) -> None:
    page = signed_in_page(_admin_token(console))
    page.get_by_test_id("nav-schedules").click()

    # Cron form: the five runs shown are the API's preview of the same expression.
    page.get_by_test_id("schedule-form-cron").check()
    page.get_by_test_id("schedule-when").fill("30 6 * * 1-5")
    runs = page.get_by_test_id("schedule-preview-run")
    expect(runs).to_have_count(5)
    with console.client() as c:
        preview = c.post("/schedules/preview", json={"cron": "30 6 * * 1-5"}).json()
    for i, ms in enumerate(preview["next_runs"]):
        expect(runs.nth(i)).to_contain_text(_iso(ms).replace("+00:00", "Z"))

    # A schedule the scheduler refuses: its message, no preview.
    page.get_by_test_id("schedule-when").fill("30 61 * * *")
    expect(page.get_by_test_id("error-box")).to_contain_text("invalid cron expression")
    expect(runs).to_have_count(0)

    # Phrase form, in a time zone: created, with the first previewed run as its next run.
    page.get_by_test_id("schedule-form-natural").check()
    page.get_by_test_id("schedule-when").fill("every day at 9:00")
    page.get_by_test_id("schedule-tz").fill("Europe/Paris")
    expect(runs).to_have_count(5)
    expect(page.get_by_test_id("schedule-preview")).to_contain_text("Europe/Paris, cron 0 9 * * *")
    first = runs.nth(0).inner_text()
    page.get_by_test_id("schedule-prompt").fill(f"morning report {XSS}")
    page.get_by_test_id("schedule-name").fill(f"morning {XSS}")
    shot(page, "schedule-create")
    page.get_by_test_id("schedule-submit").click()
    expect(page.get_by_test_id("schedule-created")).to_be_visible()
    jid = _job_id(console, f"morning {XSS}")
    with console.client() as c:
        job = c.get(f"/schedules/{jid}").json()
    assert job["cron_expr"] == "0 9 * * *" and job["tz"] == "Europe/Paris"
    assert first.startswith(_iso(job["next_run"]).replace("+00:00", "Z"))

    # Its name and prompt are text: visible as typed, nothing created from them, nothing ran.
    expect(page.get_by_test_id(f"schedule-row-{jid}")).to_contain_text(f"morning {XSS}")
    expect(page.get_by_test_id("schedule-detail-prompt")).to_have_text(f"morning report {XSS}")
    assert page.locator("img[src=x]").count() == 0
    assert page.evaluate("window.__xss") is None
    errors = [e for e in page.errors if "400 (Bad Request)" not in e]  # the refused cron
    assert errors == [], errors


def test_pause_unpause_and_run_now(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any]
) -> None:
    with console.client() as c:
        made = c.post(
            "/schedules", json={"prompt": "hourly digest", "name": "digest", "cron": "0 * * * *"}
        )
        assert made.status_code == 200, made.text
    jid = made.json()["id"]
    page = signed_in_page(_admin_token(console))
    page.get_by_test_id("nav-schedules").click()
    row = page.get_by_test_id(f"schedule-row-{jid}")
    expect(row).to_contain_text("cron 0 * * * *")
    status = page.get_by_test_id(f"schedule-status-{jid}")
    expect(status).to_have_text("active")

    page.get_by_test_id(f"schedule-pause-{jid}").click()
    expect(status).to_have_text("paused")
    with console.client() as c:
        assert c.get(f"/schedules/{jid}").json()["enabled"] is False
    # Paused: the API refuses a run, so the button is off.
    expect(page.get_by_test_id(f"schedule-run-{jid}")).to_be_disabled()

    page.get_by_test_id(f"schedule-unpause-{jid}").click()
    expect(status).to_have_text("active")
    expect(page.get_by_test_id(f"schedule-next-{jid}")).to_have_text(re.compile(r"^in "))

    # Run now: the job's page shows the dispatch event, then the run's outcome.
    page.get_by_test_id(f"schedule-run-{jid}").click()
    expect(page.get_by_test_id("schedule-detail")).to_contain_text(f"Job {jid}: digest")
    expect(page.locator(RUN_EVENT)).to_have_count(1)
    expect(page.get_by_test_id("schedule-detail-result")).to_have_text("ok")
    with console.client() as c:
        events = c.get(
            "/events", params={"aggregate": str(jid), "types": "scheduler.task_dispatched"}
        ).json()["data"]
    # One dispatch, of this job; its run id is drawn from one sequence for every job (on the
    # shared service other modules' jobs have run before).
    assert len(events) == 1, events
    task_id = events[0]["data"]["task_id"]
    assert re.fullmatch(rf"job-{jid}-run-\d+", task_id), task_id
    expect(page.locator(RUN_EVENT)).to_contain_text(task_id)
    shot(page, "schedules")
    assert page.errors == []


def test_a_user_sees_no_schedules_and_no_create_form(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
) -> None:
    page = signed_in_page(user_token("ui-sched-user"))
    page.get_by_test_id("nav-schedules").click()
    expect(page.get_by_test_id("page-schedules")).to_contain_text("Only admins")
    expect(page.get_by_test_id("schedule-create")).to_have_count(0)
    assert page.errors == []
