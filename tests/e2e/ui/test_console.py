"""The web console in a real browser (Debian's chromium) against `scripts/serve`: sign in,
watch a workflow's steps complete live on its page, cancel and delete one from the UI, tail
events with a filter (pause, resume without losing any), an injection that must render as
text and run nothing, and the CSP header that forbids inline script."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.e2e.test_workflows import Orchestrator
from tests.e2e.ui.conftest import shot
from tests.fakes.agent_llm import steps_directive

pytestmark = pytest.mark.e2e

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def _api(console: Orchestrator, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=console.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _admin_token(console: Orchestrator) -> str:
    return console.admin["Authorization"].removeprefix("Bearer ")


def _wait_status(c: httpx.Client, workflow_id: str, within: float = 60) -> str:
    deadline = time.monotonic() + within
    while True:
        status = str(c.get(f"/workflows/{workflow_id}").json()["status"])
        if status in ("completed", "failed", "cancelled"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


def test_sign_in(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    page = signed_in_page(None)
    page.get_by_test_id("signin-form").wait_for()
    shot(page, "signin")
    page.get_by_test_id("signin-token").fill("orch_not-a-real-token")
    page.get_by_test_id("signin-submit").click()
    assert "unauthorized" in page.get_by_test_id("error-box").inner_text()
    assert page.evaluate("sessionStorage.getItem('orch.token')") is None

    # A user: their name, no admin; the token only in sessionStorage, never in the URL.
    token = user_token("ui-alice")
    page.get_by_test_id("signin-token").fill(token)
    page.get_by_test_id("signin-submit").click()
    assert page.get_by_test_id("whoami").inner_text() == "ui-alice"
    assert token not in page.url
    assert page.evaluate("sessionStorage.getItem('orch.token')") == token
    page.get_by_test_id("page-workflows").wait_for()

    # An admin is told so; signing out forgets the token.
    admin = signed_in_page(_admin_token(console))
    assert admin.get_by_test_id("whoami").inner_text() == "admin (admin)"
    admin.get_by_test_id("signout").click()
    admin.get_by_test_id("signin-form").wait_for()
    assert admin.evaluate("sessionStorage.getItem('orch.token')") is None
    assert page.errors == [] and admin.errors == []


def test_watch_a_workflow_complete_live(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-bob")
    page = signed_in_page(token)
    page.get_by_test_id("live-state").filter(has_text="live").wait_for()
    with _api(console, token) as c:
        # Step b holds for a while, so the page is seen with it running and then completed.
        r = c.post(
            "/workflows",
            json={
                "name": "ui-live",
                "steps": [
                    {"name": "a", "prompt": "[answer RED]"},
                    {"name": "b", "prompt": "[sleep 4] use {{a.result}}"},
                    {"name": "c", "prompt": "check"},
                ],
            },
        )
        assert r.status_code == 200, r.text
        wf = r.json()["id"]
        # The list shows it without a reload (from /sync-events).
        row = page.get_by_test_id("wf-table-row").filter(has_text=wf)
        row.wait_for()
        page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
        page.get_by_test_id("wf-detail").wait_for()
        step_b = page.locator('[data-testid="wf-step"][data-step="b"]')
        step_b.get_by_test_id("step-status").filter(has_text="running").wait_for()
        assert page.get_by_test_id("wf-status").inner_text() == "running"
        shot(page, "workflow-running")
        # No reload from here on: the page follows the events.
        page.get_by_test_id("wf-status").filter(has_text="completed").wait_for()
        assert _wait_status(c, wf) == "completed"
    statuses = page.get_by_test_id("step-status").all_inner_texts()
    assert statuses == ["completed", "completed", "completed"]
    assert "RED" in page.locator('[data-step="a"]').get_by_test_id("step-output").inner_text()
    # Each step's model calls, from its attempt's events; attempts and durations.
    calls = step_b.get_by_test_id("step-call").all_inner_texts()
    assert any("model fake-agent" in t for t in calls), calls
    assert re.search(r"attempt 1\s+- [0-9.]+ s", step_b.get_by_test_id("step-attempt").inner_text())
    assert "done: check" in page.get_by_test_id("wf-output").inner_text()
    shot(page, "workflow")
    page.goto(f"{page.url.split('#')[0]}#/workflows")
    page.get_by_test_id("wf-table-row").filter(has_text=wf).get_by_test_id("wf-row-status").filter(
        has_text="completed"
    ).wait_for()
    shot(page, "workflows")
    assert page.errors == []


def test_a_coordinate_steps_team_on_the_workflows_page(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    """Agent teams (issue 33): the step shows its team, members and mail log (text: the
    owner's)."""
    token = user_token("ui-team")
    member = steps_directive(("team_send", {"to": "coordinator", "message": "UI-MAIL"}))
    lead = steps_directive(
        ("team_spawn", {"role": "scout", "instructions": member}),
        ("team_receive", {"timeout_s": 30}),
    )
    step = {"name": "lead", "prompt": lead, "mode": "coordinate", "team": {"max_members": 1}}
    with _api(console, token) as c:
        wf = c.post("/workflows", json={"name": "ui-team", "steps": [step]}).json()["id"]
        assert _wait_status(c, wf) == "completed"
    page = signed_in_page(token)
    page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
    team = page.locator('[data-testid="wf-step"][data-step="lead"]').get_by_test_id("step-team")
    team.wait_for()
    members = team.get_by_test_id("team-members-row").all_inner_texts()
    assert len(members) == 1 and "m1" in members[0] and "scout" in members[0], members
    mail = team.get_by_test_id("team-mail-row").all_inner_texts()
    assert any("UI-MAIL" in row and "coordinator" in row for row in mail), mail
    assert page.errors == []


def test_cancel_and_delete_from_the_ui(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-carol")
    with _api(console, token) as c:
        wf = c.post(
            "/workflows",
            json={"name": "ui-cancel", "steps": [{"name": "s", "prompt": "[sleep 20]"}]},
        ).json()["id"]
        page = signed_in_page(token)
        page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
        page.get_by_test_id("wf-status").filter(has_text=re.compile("pending|running")).wait_for()
        page.get_by_test_id("wf-cancel").click()  # asks first
        assert "click again" in page.get_by_test_id("wf-cancel").inner_text()
        page.get_by_test_id("wf-cancel").click()
        page.get_by_test_id("wf-status").filter(has_text="cancelled").wait_for()
        assert c.get(f"/workflows/{wf}").json()["status"] == "cancelled"
        page.get_by_test_id("wf-delete").click()
        page.get_by_test_id("wf-delete").click()
        page.get_by_test_id("page-workflows").get_by_test_id("wf-filter-status").wait_for()
        assert "#/workflows" in page.url
        assert c.get(f"/workflows/{wf}").status_code == 404
    assert page.errors == []


def test_tail_events_with_a_filter_pause_and_resume(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-dave")
    page = signed_in_page(token)
    page.goto(f"{page.url.split('#')[0]}#/events")
    page.get_by_test_id("ev-type-prefix").fill("workflow.step")
    page.get_by_test_id("ev-apply").click()
    page.get_by_test_id("live-state").filter(has_text="live").wait_for()
    rows = page.get_by_test_id("ev-row")
    with _api(console, token) as c:
        first = c.post(
            "/workflows", json={"name": "ui-ev", "steps": [{"name": "only", "prompt": "hi"}]}
        ).json()["id"]
        assert _wait_status(c, first) == "completed"
        rows.filter(has_text="workflow.step_completed").first.wait_for()
        types = rows.get_by_test_id("ev-type").all_inner_texts()
        assert types and all(t.startswith("workflow.step_") for t in types), types
        shot(page, "events")

        # Paused: nothing new shows; resumed: what happened meanwhile arrives (Last-Event-ID).
        page.get_by_test_id("ev-pause").click()
        page.get_by_test_id("live-state").filter(has_text="paused").wait_for()
        shown = rows.count()
        second = c.post(
            "/workflows", json={"name": "ui-ev2", "steps": [{"name": "later", "prompt": "hi"}]}
        ).json()["id"]
        assert _wait_status(c, second) == "completed"
        assert rows.count() == shown
        page.get_by_test_id("ev-pause").click()
        rows.filter(has_text=second).filter(has_text="workflow.step_completed").wait_for()
        assert rows.filter(has_text=second).count() == 2  # started and completed, once each

        # An event links to its workflow.
        rows.filter(has_text=second).first.get_by_test_id("ev-link").click()
        page.get_by_test_id("wf-id").filter(has_text=second).wait_for()
    assert page.errors == []


def test_injected_markup_renders_as_text_and_runs_nothing(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-mallory")
    with _api(console, token) as c:
        wf = c.post(
            "/workflows",
            json={"name": "ui-xss", "steps": [{"name": "x", "prompt": f"[answer {XSS}]"}]},
        ).json()["id"]
        assert _wait_status(c, wf) == "completed"
        assert c.get(f"/workflows/{wf}").json()["steps"][0]["result"] == XSS
    page = signed_in_page(token)
    page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
    output = page.get_by_test_id("wf-output")
    output.wait_for()
    assert output.inner_text().strip() == XSS  # shown, as text
    assert page.get_by_test_id("step-output").inner_text().strip() == XSS
    # Nothing was made of it: no <img>, no <script> with its code, nothing ran.
    assert page.locator("img").count() == 0
    assert page.locator("script", has_text="__xss").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    # The events page shows the same data as text too.
    page.goto(f"{page.url.split('#')[0]}#/events?aggregate={wf}")
    page.get_by_test_id("ev-data").filter(has_text="onerror").first.wait_for()
    assert page.locator("img").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    shot(page, "injection")
    assert page.errors == []


def test_csp_forbids_inline_script(
    base_url: str, signed_in_page: Callable[[str | None], Any], console: Orchestrator
) -> None:
    for path in ("/ui", "/ui/", "/ui/app.js", "/ui/missing.js"):
        r = httpx.get(base_url + path, timeout=30)
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    page = signed_in_page(_admin_token(console))
    # Inline script added to the live page is refused by the browser (the header works).
    page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.__inline = 1'; document.body.appendChild(s);
                   const i = document.createElement('img'); i.src = 'x';
                   i.setAttribute('onerror', 'window.__inline = 2');
                   document.body.appendChild(i); }"""
    )
    page.wait_for_function("() => document.querySelector('img').complete")
    assert page.evaluate("typeof window.__inline") == "undefined"
    assert any("Content Security Policy" in e for e in page.errors), page.errors
