"""The console's humans-in-the-loop pages (issue 32) in a real browser against `scripts/serve`:
the Approvals page lists a waiting approval step's question and approves it (the workflow
goes on); a workflow's page shows its step's pending approval, whose reject needs a reason
(the step fails); a failed step's attempts and its Skip override (the workflow completes,
audit.workflow_override recorded); a re-run from a step opens the new workflow, linked to
the original."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.e2e.test_workflows import Orchestrator
from tests.e2e.ui.conftest import shot

pytestmark = pytest.mark.e2e


def _api(console: Orchestrator, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=console.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _until(probe: Callable[[], Any], within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while not (found := probe()):
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.2)
    return found


def _finished(c: httpx.Client, workflow_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = c.get(f"/workflows/{workflow_id}").json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    return dict(_until(done))


def _pending(c: httpx.Client, workflow_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        r = c.get("/interventions", params={"workflow_id": workflow_id, "status": "pending"})
        assert r.status_code == 200, r.text
        return r.json()["data"][0] if r.json()["data"] else None

    return dict(_until(found))


def _approval(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "steps": [
            {"name": "draft", "prompt": "[answer v2.1]"},
            {"name": "ok", "type": "approval", "prompt": "Ship {{draft.result}}?"},
            {"name": "ship", "prompt": "[answer shipped]"},
        ],
    }


def test_approve_from_the_approvals_page(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-iv-ann")
    with _api(console, token) as c:
        wf = c.post("/workflows", json=_approval("ui-approve")).json()["id"]
        iv = _pending(c, wf)
        page = signed_in_page(token)
        page.get_by_test_id("nav-interventions").click()
        row = page.get_by_test_id("iv-table-row").filter(has_text=iv["id"])
        row.get_by_test_id("iv-question").filter(has_text="Ship v2.1?").wait_for()
        assert row.get_by_test_id("iv-status").inner_text() == "pending"
        shot(page, "approvals")
        row.get_by_test_id("iv-note").fill("looks good")
        row.get_by_test_id("iv-approve").click()
        # Decided: gone from the pending list, and the workflow went on.
        page.get_by_test_id("iv-table-row").filter(has_text=iv["id"]).wait_for(state="detached")
        final = _finished(c, wf)
        assert final["status"] == "completed", final
        got = c.get(f"/interventions/{iv['id']}").json()
        assert got["status"] == "approved" and got["note"] == "looks good"
        assert got["decided_by"] == {"user_uuid": "ui-iv-ann"} and got["via"] == "api"
        page.get_by_test_id("iv-filter-status").select_option("approved")
        decided = page.get_by_test_id("iv-table-row").filter(has_text=iv["id"])
        assert decided.get_by_test_id("iv-decided-by").inner_text() == "ui-iv-ann"
    assert page.errors == []


def test_reject_from_the_workflow_page_needs_a_reason(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-iv-bob")
    with _api(console, token) as c:
        wf = c.post("/workflows", json=_approval("ui-reject")).json()["id"]
        iv = _pending(c, wf)
        page = signed_in_page(token)
        page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
        step = page.locator('[data-testid="wf-step"][data-step="ok"]')
        waiting = step.get_by_test_id("step-intervention")
        waiting.get_by_test_id("iv-question").filter(has_text="Ship v2.1?").wait_for()
        assert waiting.get_attribute("data-iv") == iv["id"]
        assert waiting.get_by_test_id("iv-reject").is_disabled()  # a reason first
        assert step.get_by_test_id("step-retry").count() == 0  # a person decides it
        step.get_by_test_id("step-skip").wait_for()
        shot(page, "workflow-approval")
        waiting.get_by_test_id("iv-reason").fill("not this week")
        waiting.get_by_test_id("iv-reject").click()
        page.get_by_test_id("wf-status").filter(has_text="failed").wait_for()
        step.get_by_test_id("step-status").filter(has_text="failed").wait_for()
        assert step.get_by_test_id("step-intervention").count() == 0
        got = c.get(f"/interventions/{iv['id']}").json()
        assert got["status"] == "rejected" and got["reason"] == "not this week"
    assert page.errors == []


def test_skip_a_failed_step_and_rerun_from_a_step(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], user_token: Any
) -> None:
    token = user_token("ui-iv-cy")
    with _api(console, token) as c:
        spec = {
            "name": "ui-override",
            "steps": [
                {"name": "fetch", "prompt": "[answer data]"},
                {"name": "flaky", "prompt": "[fail]"},
                {"name": "report", "prompt": "[answer report]"},
            ],
        }
        wf = c.post("/workflows", json=spec).json()["id"]
        assert _finished(c, wf)["status"] == "failed"
        page = signed_in_page(token)
        page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
        flaky = page.locator('[data-testid="wf-step"][data-step="flaky"]')
        flaky.get_by_test_id("step-attempt").filter(has_text="attempt 1").wait_for()
        assert "scripted failure" in flaky.get_by_test_id("step-attempt-error").inner_text()
        # Overrides only where they apply: the failed step, not the completed one.
        assert (
            page.locator('[data-testid="wf-step"][data-step="fetch"]')
            .get_by_test_id("step-skip")
            .count()
            == 0
        )
        page.get_by_test_id("wf-resume").wait_for()
        shot(page, "workflow-failed")
        flaky.get_by_test_id("step-skip").click()  # asks first
        flaky.get_by_test_id("step-skip").click()
        page.get_by_test_id("wf-status").filter(has_text="completed").wait_for()
        final = c.get(f"/workflows/{wf}").json()
        assert [s["status"] for s in final["steps"]] == ["completed", "skipped", "completed"]
        overrides = [
            e["data"]
            for e in c.get("/events", params={"aggregate": wf, "limit": 200}).json()["data"]
            if e["type"] == "audit.workflow_override"
        ]
        assert [(o["action"], o["step"], o["user_uuid"]) for o in overrides] == [
            ("skip", "flaky", "ui-iv-cy")
        ]
        # Re-run from `report`: a new workflow whose earlier steps keep their results.
        page.get_by_test_id("wf-rerun-step").select_option("report")
        page.get_by_test_id("wf-rerun").click()
        page.get_by_test_id("wf-rerun").click()
        page.get_by_test_id("wf-rerun-of").filter(has_text=wf).wait_for()
        new_id = re.search(r"#/workflows/(wf-\d+)", page.url)
        assert new_id is not None and new_id.group(1) != wf
        rerun = _finished(c, new_id.group(1))
        assert rerun["status"] == "completed" and rerun["rerun_of"] == wf
        assert rerun["steps"][0]["result"] == final["steps"][0]["result"]
        shot(page, "workflow-rerun")
    assert page.errors == []
