"""The console's tools page in a real browser against `scripts/serve`: an MCP server (the
SDK's own server, `tests.fakes.mcp_server`, requiring the header typed in the form) registered
from the page and shown ready with its tools, then in error while it is down and ready again
after Refresh; an HTTP tool created (its markup-laden description shown as text, its header
value never shown) and deleted; a deny rule saved (a reload shows it); a shared server's
buttons and the global rules' editor for admins only; and a workflow's timeline naming each
tool call's source and the model's decisions."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.test_workflows import Orchestrator
from tests.e2e.ui.conftest import shot
from tests.fakes.mcp_server import McpServerProcess

pytestmark = pytest.mark.e2e

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
MCP_TOOLS = {"echo", "add", "fail", "slow", "whoami"}  # what the fake server lists
SECRET = "Bearer ui-s3cret-token"

# The console's duration (components.js `duration`): "840 ms", "1.2 s" on a loaded machine.
DURATION = r"\d+ ms|\d+\.\d s"


def _api(console: Orchestrator, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=console.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _admin_token(console: Orchestrator) -> str:
    return console.admin["Authorization"].removeprefix("Bearer ")


def _open(page: Any) -> None:
    page.get_by_test_id("nav-tools").click()
    page.get_by_test_id("tools-page").wait_for()


def _server(c: httpx.Client, name: str) -> dict[str, Any]:
    r = c.get("/mcp/servers")
    assert r.status_code == 200, r.text
    return next(s for s in r.json()["servers"] if s["name"] == name)


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[McpServerProcess]:
    with McpServerProcess(
        record=tmp_path / "calls.jsonl", require_header=("Authorization", SECRET)
    ) as server:
        yield server


def test_register_an_mcp_server_create_an_http_tool_and_deny_a_tool(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
    mcp: McpServerProcess,
) -> None:
    token = user_token(f"ui-tools-{uuid.uuid4().hex[:8]}")
    page = signed_in_page(token)
    _open(page)
    expect(page.get_by_test_id("mcp-section")).to_contain_text("No MCP servers")

    # Registered from the form: the server answers only with the header typed there, so
    # "ready" with its tools says the header line went through as typed.
    page.get_by_test_id("mcp-name").fill("files")
    page.get_by_test_id("mcp-url").fill(mcp.url)
    page.get_by_test_id("mcp-headers").fill(f"Authorization: {SECRET}\n")
    page.get_by_test_id("mcp-submit").click()
    expect(page.get_by_test_id("mcp-created")).to_contain_text(f"ready, {len(MCP_TOOLS)} tool(s)")
    with _api(console, token) as c:
        server = _server(c, "files")
    sid = server["id"]
    assert server["status"] == "ready" and {t["name"] for t in server["tools"]} == MCP_TOOLS
    row = page.get_by_test_id(f"mcp-row-{sid}")
    expect(page.get_by_test_id(f"mcp-status-{sid}")).to_have_text("ready")
    expect(row).to_contain_text("Authorization: ***")
    expect(page.get_by_test_id(f"mcp-tools-count-{sid}")).to_have_text(f"{len(MCP_TOOLS)} tool(s)")
    page.get_by_test_id(f"mcp-tools-count-{sid}").click()
    listed = page.get_by_test_id(f"mcp-tools-{sid}").get_by_test_id("mcp-tool")
    expect(listed).to_have_count(len(MCP_TOOLS))
    for tool in server["tools"]:
        item = listed.filter(has=page.get_by_text(tool["name"], exact=True))
        expect(item).to_contain_text(tool["description"])
    # All tools: the server's, under mcp, by the names agents call them.
    mcp_group = page.get_by_test_id("tools-group-mcp")
    for name in MCP_TOOLS:
        expect(mcp_group.locator(f'[data-tool="mcp__files__{name}"]')).to_have_count(1)

    # Down: Refresh shows the error; up again: ready.
    mcp.kill()
    page.get_by_test_id(f"mcp-refresh-{sid}").click()
    expect(page.get_by_test_id(f"mcp-status-{sid}")).to_have_text("error")
    expect(page.get_by_test_id(f"mcp-error-{sid}")).not_to_be_empty()
    mcp.start()
    page.get_by_test_id(f"mcp-refresh-{sid}").click()
    expect(page.get_by_test_id(f"mcp-status-{sid}")).to_have_text("ready")
    expect(page.get_by_test_id(f"mcp-error-{sid}")).to_have_count(0)

    # An HTTP tool whose description is markup: shown as text, nothing runs.
    page.get_by_test_id("http-name").fill("lookup")
    page.get_by_test_id("http-description").fill(f"Looks up {XSS}")
    page.get_by_test_id("http-method").select_option("POST")
    page.get_by_test_id("http-url").fill("http://127.0.0.1:9/items/{id}")
    page.get_by_test_id("http-parameters").fill(
        json.dumps({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]})
    )
    page.get_by_test_id("http-headers").fill("X-Api-Key: k-very-secret")
    page.get_by_test_id("http-submit").click()
    expect(page.get_by_test_id("http-created")).to_contain_text("http__lookup")
    with _api(console, token) as c:
        (tool,) = c.get("/tools/http").json()["tools"]
    assert tool["method"] == "POST" and tool["headers"] == {"X-Api-Key": "***"}
    assert tool["parameters"]["required"] == ["id"]
    hid = tool["id"]
    expect(page.get_by_test_id(f"http-tool-{hid}")).to_have_text("http__lookup")
    expect(page.get_by_test_id(f"http-description-{hid}")).to_have_text(f"Looks up {XSS}")
    expect(page.get_by_test_id(f"http-row-{hid}")).to_contain_text("X-Api-Key: ***")
    expect(
        page.get_by_test_id("tools-group-http").locator('[data-tool="http__lookup"]')
    ).to_contain_text(f"Looks up {XSS}")
    assert page.locator("img[src=x]").count() == 0
    assert page.evaluate("window.__xss") is None
    content = page.content()
    assert "k-very-secret" not in content and SECRET not in content

    # A deny rule, saved; a reload shows it.
    page.get_by_test_id("policy-user-add").click()
    page.get_by_test_id("policy-user-tool").fill("mcp__files__fail")
    page.get_by_test_id("policy-user-action").select_option("deny")
    page.get_by_test_id("policy-user-save").click()
    expect(page.get_by_test_id("policy-user-saved")).to_be_visible()
    with _api(console, token) as c:
        rules = c.get("/tools/policy").json()["rules"]
    assert rules == [{"tool": "mcp__files__fail", "action": "deny"}]
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "tools")
    page.reload()
    page.get_by_test_id("tools-page").wait_for()
    expect(page.get_by_test_id("policy-user-rule")).to_have_count(1)
    expect(page.get_by_test_id("policy-user-tool")).to_have_value("mcp__files__fail")
    expect(page.get_by_test_id("policy-user-action")).to_have_value("deny")

    # Delete (each asks first).
    page.get_by_test_id(f"http-delete-{hid}").click()
    page.get_by_test_id(f"http-delete-{hid}").click()
    expect(page.get_by_test_id(f"http-row-{hid}")).to_have_count(0)
    page.get_by_test_id(f"mcp-delete-{sid}").click()
    page.get_by_test_id(f"mcp-delete-{sid}").click()
    expect(page.get_by_test_id(f"mcp-row-{sid}")).to_have_count(0)
    expect(page.get_by_test_id("tools-group-mcp")).to_have_count(0)
    with _api(console, token) as c:
        assert c.get("/mcp/servers").json()["servers"] == []
        assert c.get("/tools/http").json()["tools"] == []
    assert page.errors == [], page.errors


def test_shared_servers_and_global_rules_are_for_admins(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
    admin_api: httpx.Client,
    mcp: McpServerProcess,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    before = admin_api.get("/tools/policy", params={"scope": "global"}).json()["rules"]
    made = admin_api.post(
        "/mcp/servers",
        json={
            "name": f"sh-{suffix}",
            "url": mcp.url,
            "headers": {"Authorization": SECRET},
            "shared": True,
        },
    )
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    rule = f"http__never_{suffix}"
    try:
        # A user sees the shared server, ready, but cannot refresh or delete it.
        user = signed_in_page(user_token(f"ui-tools-{suffix}"))
        _open(user)
        row = user.get_by_test_id(f"mcp-row-{sid}")
        expect(row).to_contain_text("shared")
        expect(user.get_by_test_id(f"mcp-status-{sid}")).to_have_text("ready")
        expect(row.locator("button")).to_have_count(0)
        expect(user.get_by_test_id("policy-user-add")).to_be_visible()  # the policy loaded
        expect(user.get_by_test_id("mcp-shared")).to_have_count(0)
        expect(user.get_by_test_id("policy-global-save")).to_have_count(0)

        # An admin edits the global rules in the second editor.
        admin = signed_in_page(_admin_token(console))
        _open(admin)
        expect(admin.get_by_test_id(f"mcp-refresh-{sid}")).to_be_visible()
        admin.get_by_test_id("policy-global-add").click()
        admin.get_by_test_id("policy-global-tool").last.fill(rule)
        admin.get_by_test_id("policy-global-save").click()
        expect(admin.get_by_test_id("policy-global-saved")).to_be_visible()
        after = admin_api.get("/tools/policy", params={"scope": "global"}).json()["rules"]
        assert after == [*before, {"tool": rule, "action": "deny"}]

        # The user, reloading, sees it read-only.
        user.reload()
        user.get_by_test_id("tools-page").wait_for()
        shown = user.get_by_test_id("policy-global-rule").filter(has_text=rule)
        expect(shown).to_contain_text("deny")
        expect(user.get_by_test_id("policy-global-tool")).to_have_count(0)

        # The admin deletes the shared server from the page.
        admin.get_by_test_id(f"mcp-delete-{sid}").click()
        admin.get_by_test_id(f"mcp-delete-{sid}").click()
        expect(admin.get_by_test_id(f"mcp-row-{sid}")).to_have_count(0)
        assert admin_api.get(f"/mcp/servers/{sid}").status_code == 404
        assert user.errors == [] and admin.errors == []
    finally:
        admin_api.delete(f"/mcp/servers/{sid}")
        admin_api.put("/tools/policy", params={"scope": "global"}, json={"rules": before})


def _wait_done(c: httpx.Client, wf: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        body = c.get(f"/workflows/{wf}").json()
        if body["status"] in ("completed", "failed", "cancelled"):
            return dict(body)
        assert time.monotonic() < deadline, body["status"]
        time.sleep(0.3)


def test_the_timeline_names_each_calls_source_and_the_models_decisions(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
    mcp: McpServerProcess,
) -> None:
    token = user_token(f"ui-tools-wf-{uuid.uuid4().hex[:8]}")
    with _api(console, token) as c:
        made = c.post(
            "/mcp/servers",
            json={"name": "files", "url": mcp.url, "headers": {"Authorization": SECRET}},
        )
        assert made.status_code == 201 and made.json()["status"] == "ready", made.text
        sid = made.json()["id"]
        r = c.put("/tools/policy", json={"rules": [{"tool": "mcp__files__fail", "action": "deny"}]})
        assert r.status_code == 200, r.text
        r = c.post(
            "/workflows",
            json={
                "name": "ui-tools",
                "steps": [
                    {"name": "a", "prompt": '[tool mcp__files__echo {"text": "hi"}]'},
                    {"name": "b", "prompt": '[tool mcp__files__fail {"message": "no"}]'},
                ],
            },
        )
        assert r.status_code == 200, r.text
        wf = r.json()["id"]
        assert _wait_done(c, wf)["status"] == "completed"
    assert [call["tool"] for call in mcp.calls()] == ["echo"]  # the denied call never ran

    page = signed_in_page(token)
    page.goto(f"{page.url.split('#')[0]}#/workflows/{wf}")
    page.get_by_test_id("wf-detail").wait_for()
    step_a = page.locator('[data-testid="wf-step"][data-step="a"]').get_by_test_id("step-call")
    expect(step_a.filter(has_text="model chose")).to_have_text("model chose mcp__files__echo")
    expect(step_a.filter(has_text="tool mcp__files__echo")).to_have_text(
        re.compile(rf"^tool mcp__files__echo \(mcp {sid}\) ok \((?:{DURATION})\)$")
    )
    expect(step_a.filter(has_text="model answered")).to_have_text("model answered (final)")
    step_b = page.locator('[data-testid="wf-step"][data-step="b"]').get_by_test_id("step-call")
    expect(step_b.filter(has_text="refused")).to_contain_text(
        "tool mcp__files__fail (mcp) refused: denied by the user policy rule 'mcp__files__fail'"
    )
    assert page.errors == [], page.errors
