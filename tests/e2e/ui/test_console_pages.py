"""The console's operations, memory, marketplace and channels pages in a real browser against
`scripts/serve`, with their data seeded through the HTTP API: health components and SLOs as
the API reports them, live request/error/event rates (the page's Prometheus arithmetic checked
against the same /metrics text); an agent's memory browsed, searched, pinned and deleted, a
user seeing no totals and no other user's entries; skills browsed, filtered by tag, searched,
opened (a download counted) and published from the form, an `<img onerror>` description shown
as text; channels listed, created from the form (secrets shown as `***`), paused, resumed and
deleted."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_workflows import Orchestrator
from tests.e2e.ui.conftest import shot

pytestmark = pytest.mark.e2e

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
RATE = re.compile(r"^\d+\.\d\d /s$")
POSITIVE_RATE = re.compile(r"^(?!0\.00 )\d+\.\d\d /s$")
PERCENT = re.compile(r"^\d+\.\d\d %$")


def _api(console: Orchestrator, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=console.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def _admin_token(console: Orchestrator) -> str:
    return console.admin["Authorization"].removeprefix("Bearer ")


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


def _open(page: Any, name: str) -> None:
    page.get_by_test_id(f"nav-{name}").click()
    page.get_by_test_id(f"page-{name}").wait_for()


def _js_number(v: float) -> str:
    """A number as the page's template prints it (JavaScript's String(n))."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _prometheus_sums(text: str) -> dict[str, float]:
    """What ops.js `counters()` should make of /metrics: all HTTP requests, the 5xx ones, all
    events (parsed by prometheus_client, whatever the label values hold)."""
    out = {"requests": 0.0, "errors": 0.0, "events": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "svc_http_requests_total":
                out["requests"] += s.value
                if s.labels.get("status", "").startswith("5"):
                    out["errors"] += s.value
            elif s.name == "svc_event_total":
                out["events"] += s.value
    return out


def _until_shown(locator: Any, pattern: re.Pattern[str], act: Callable[[], None]) -> None:
    """Do `act` (API traffic), then wait for `locator` to match; again until it does. A rate
    is a difference between two polls 3 s apart, so traffic must fall between two of them."""
    deadline = time.monotonic() + 60
    while True:
        act()
        try:
            expect(locator).to_have_text(pattern, timeout=7_000)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


# --- operations ------------------------------------------------------------------------


def test_ops_health_slo_and_live_rates(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any], admin_api: httpx.Client
) -> None:
    page = signed_in_page(_admin_token(console))
    _open(page, "ops")

    # Health: every component the API reports, with its status; the overall status.
    health = admin_api.get("/health").json()
    expect(page.get_by_test_id("ops-health")).to_be_visible()
    expect(page.get_by_test_id("ops-status")).to_have_text(health["status"])
    rows = page.get_by_test_id("ops-health").locator("tbody tr")
    expect(rows).to_have_count(len(health["components"]))
    for name, component in health["components"].items():
        row = page.get_by_test_id(f"ops-component-{name}")
        expect(row).to_contain_text(name)
        if "status" in component:
            expect(row.locator("td").nth(1)).to_have_text(component["status"])
    store = health["components"]["store"]
    expect(page.get_by_test_id("ops-component-store")).to_contain_text(f"tables {store['tables']}")

    # SLOs: each objective with the API's target.
    slo = admin_api.get("/slo").json()
    assert set(slo) == {"latency_p99", "uptime_7d", "error_rate"}, slo
    expect(page.get_by_test_id("ops-slo").locator("tbody tr")).to_have_count(len(slo))
    for name, objective in slo.items():
        row = page.get_by_test_id(f"ops-slo-{name}")
        expect(row.locator("td").nth(0)).to_have_text(name)
        expect(row.locator("td").nth(1)).to_have_text(_js_number(objective["target"]))

    # Live rates: API traffic (memory stores: requests to a templated route, each emitting a
    # memory.stored event) shows as a non-zero request and event rate, errors as a percentage.
    agent = f"ui-ops-{_suffix()}"
    sent = iter(range(1_000_000))

    def traffic() -> None:
        for _ in range(5):
            r = admin_api.post(
                f"/memory/{agent}/store", json={"key": f"k{next(sent)}", "value": "v"}
            )
            assert r.status_code == 200, r.text

    _until_shown(page.get_by_test_id("ops-rate-requests-value"), POSITIVE_RATE, traffic)
    _until_shown(page.get_by_test_id("ops-rate-events-value"), POSITIVE_RATE, traffic)
    expect(page.get_by_test_id("ops-rate-errors-value")).to_have_text(PERCENT)
    # Three polls or more: each chart draws its line.
    for chart in ("requests", "errors", "events"):
        expect(page.get_by_test_id(f"ops-rate-{chart}").locator("svg polyline")).to_have_count(1)
    expect(page.get_by_test_id("ops-rate-requests-value")).to_have_text(RATE)

    # The page's sums of the counters are Prometheus's, templated paths (`{agent_id}`, a `}`
    # inside a label value) included.
    text, sums = page.evaluate(
        """async () => {
            const { counters } = await import('/ui/pages/ops.js');
            const text = await (await fetch('/api/v1/metrics')).text();
            return [text, counters(text)];
        }"""
    )
    assert "{agent_id}" in text
    assert sums == pytest.approx(_prometheus_sums(text)), sums
    shot(page, "ops")
    assert page.errors == []


# --- memory ----------------------------------------------------------------------------


def test_memory_browse_search_pin_and_delete(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
) -> None:
    agent = f"ui-mem-{_suffix()}"
    ann = user_token("ui-mem-ann")
    values = {
        "budget": "the quarterly budget was approved on monday",
        "dentist": "appointment at the dentist on friday at 10",
        "colour": "favourite colour is teal",
        "note": XSS,
    }
    with _api(console, ann) as c:
        for key, value in values.items():
            r = c.post(f"/memory/{agent}/store", json={"key": key, "value": value})
            assert r.status_code == 200, r.text
        listed = [e["key"] for e in c.get(f"/memory/{agent}/list").json()["entries"]]
    with _api(console, user_token("ui-mem-ben")) as c:
        r = c.post(f"/memory/{agent}/store", json={"key": "bens-secret", "value": "not for ann"})
        assert r.status_code == 200, r.text
    assert sorted(listed) == sorted(values)

    page = signed_in_page(ann)
    _open(page, "memory")
    page.get_by_test_id("memory-agent").fill(agent)
    page.get_by_test_id("memory-open").click()
    entries = page.get_by_test_id("memory-entries")
    rows = entries.get_by_test_id("memory-entry")
    # Ann's entries, newest first as the API lists them; Ben's is not hers to see.
    expect(rows).to_have_count(len(values))
    # Each row waited for (not read once: the list may be drawn again between the count and a
    # read, which then saw no rows at all on a loaded machine).
    for i, key in enumerate(listed):
        expect(rows.nth(i)).to_have_attribute("data-key", key)
    expect(entries.locator('[data-key="bens-secret"]')).to_have_count(0)
    for key, value in values.items():
        expect(entries.locator(f'[data-key="{key}"] pre.value')).to_have_text(value)
    # The XSS value is text: nothing was made of it, nothing ran.
    assert page.locator("img").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    # The totals are admins' only.
    expect(page.get_by_test_id("memory-stats")).to_have_count(0)

    # Full-text search finds the one entry.
    page.get_by_test_id("memory-query").fill("dentist")
    page.get_by_test_id("memory-search").click()
    results = page.get_by_test_id("memory-results").get_by_test_id("memory-entry")
    expect(results).to_have_count(1)
    expect(results).to_have_attribute("data-key", "dentist")
    expect(results.locator("pre.value")).to_have_text(values["dentist"])

    # Pin: the API accepts it and the page says so.
    with page.expect_response(
        lambda r: r.request.method == "POST" and r.url.endswith(f"/memory/{agent}/budget/pin")
    ) as pinned:
        entries.get_by_test_id("memory-pin-budget").click()
    assert pinned.value.status == 200
    assert pinned.value.json() == {"status": "ok", "pinned": True}
    expect(page.get_by_test_id("memory-notice")).to_have_text(
        "Pinned budget: decay will not forget it"
    )
    shot(page, "memory")

    # Delete asks first, then the entry is gone from the page and from the API.
    delete = entries.get_by_test_id("memory-delete-colour")
    delete.click()
    expect(delete).to_contain_text("click again")
    delete.click()
    expect(page.get_by_test_id("memory-notice")).to_have_text("Deleted colour")
    expect(entries.locator('[data-key="colour"]')).to_have_count(0)
    expect(rows).to_have_count(len(values) - 1)
    with _api(console, ann) as c:
        assert c.get(f"/memory/{agent}/colour").status_code == 404
        assert c.get(f"/memory/{agent}/budget").json()["value"] == values["budget"]
    assert page.errors == []


def test_memory_stats_and_every_owner_for_an_admin(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
    admin_api: httpx.Client,
) -> None:
    agent = f"ui-mem-admin-{_suffix()}"
    for user in ("ui-mem-cat", "ui-mem-dan"):
        with _api(console, user_token(user)) as c:
            r = c.post(f"/memory/{agent}/store", json={"key": f"{user}-key", "value": user})
            assert r.status_code == 200, r.text
    stats = admin_api.get("/memory/stats").json()
    page = signed_in_page(_admin_token(console))
    _open(page, "memory")
    page.get_by_test_id("memory-agent").fill(agent)
    page.get_by_test_id("memory-open").click()
    rows = page.get_by_test_id("memory-entries").get_by_test_id("memory-entry")
    expect(rows).to_have_count(2)
    expect(page.get_by_test_id("memory-stats")).to_contain_text(
        f"{stats['total_entries']} entries over {stats['total_agents']} agents"
    )
    assert page.errors == []


# --- marketplace -----------------------------------------------------------------------


def test_marketplace_browse_search_detail_and_publish(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
) -> None:
    s = _suffix()
    pdf, unsafe, haiku = f"pdf-summary-{s}", f"unsafe-skill-{s}", f"haiku-writer-{s}"
    token = user_token("ui-mkt-ann")
    with _api(console, token) as c:
        for body in (
            {
                "name": pdf,
                "description": "Turns PDF reports into bullet points",
                "tags": ["pdf", "summary"],
                "body": "Read the PDF and list its key points.",
            },
            {"name": unsafe, "description": XSS, "tags": ["misc"], "body": f"body {XSS}"},
        ):
            r = c.post("/marketplace/publish", json=body)
            assert r.status_code == 200, r.text

    page = signed_in_page(token)
    _open(page, "marketplace")
    # Browse: both, the markup in a description as text.
    expect(page.get_by_test_id(f"skill-row-{pdf}")).to_contain_text(
        "Turns PDF reports into bullet points"
    )
    expect(page.get_by_test_id(f"skill-row-{unsafe}")).to_contain_text(XSS)
    expect(page.get_by_test_id(f"skill-row-{unsafe}")).to_contain_text("ui-mkt-ann")

    # Browse by tag narrows the list.
    page.get_by_test_id("skill-tags").fill("pdf")
    page.get_by_test_id("skill-tags").press("Tab")
    expect(page.get_by_test_id(f"skill-row-{unsafe}")).to_have_count(0)
    expect(page.get_by_test_id(f"skill-row-{pdf}")).to_be_visible()
    page.get_by_test_id("skill-tags").fill("")
    page.get_by_test_id("skill-tags").press("Tab")
    expect(page.get_by_test_id(f"skill-row-{unsafe}")).to_be_visible()

    # Search finds the skill by a description word, not the other.
    page.get_by_test_id("skill-query").fill("bullet")
    page.get_by_test_id("skill-search").click()
    expect(page.get_by_test_id(f"skill-row-{unsafe}")).to_have_count(0)
    expect(page.get_by_test_id(f"skill-row-{pdf}")).to_be_visible()
    page.get_by_test_id("skill-query").fill("")
    page.get_by_test_id("skill-search").click()
    expect(page.get_by_test_id(f"skill-row-{unsafe}")).to_be_visible()

    # Detail: description and body as text, nothing ran; the read counted a download.
    page.get_by_test_id(f"skill-open-{unsafe}").click()
    detail = page.get_by_test_id("skill-detail")
    expect(detail).to_contain_text(f"{unsafe} v1 by ui-mkt-ann")
    expect(page.get_by_test_id("skill-detail-description")).to_have_text(XSS)
    expect(page.get_by_test_id("skill-detail-body")).to_have_text(f"body {XSS}")
    expect(detail).to_contain_text("1 downloads")
    assert page.locator("img").count() == 0
    assert page.locator("script", has_text="__xss").count() == 0
    assert page.evaluate("typeof window.__xss") == "undefined"
    with _api(console, token) as c:
        items = c.get("/marketplace/browse", params={"tags": "misc"}).json()["items"]
    assert [i["downloads"] for i in items if i["name"] == unsafe] == [1]
    # ... and the list shows the new count without a reload.
    expect(page.get_by_test_id(f"skill-downloads-{unsafe}")).to_have_text("1")

    # Publish from the form: the notice, the new row, and the skill as the API has it.
    page.get_by_test_id("skill-publish-name").fill(haiku)
    page.get_by_test_id("skill-publish-description").fill("Writes a haiku about anything")
    page.get_by_test_id("skill-publish-tags").fill("poetry, Fun")
    page.get_by_test_id("skill-publish-body").fill("Write a haiku about {{topic}}.")
    page.get_by_test_id("skill-publish-submit").click()
    expect(page.get_by_test_id("skill-notice")).to_have_text(f"Published {haiku} v1")
    row = page.get_by_test_id(f"skill-row-{haiku}")
    expect(row).to_contain_text("Writes a haiku about anything")
    expect(row).to_contain_text("poetry, fun")
    with _api(console, token) as c:
        skill = c.get(f"/marketplace/detail/{haiku}").json()
    assert skill["author"] == "ui-mkt-ann" and skill["version"] == "1"
    assert skill["tags"] == ["poetry", "fun"]
    assert skill["description"] == "Writes a haiku about anything"
    assert skill["body"] == "Write a haiku about {{topic}}."
    shot(page, "marketplace")
    assert page.errors == []


# --- channels --------------------------------------------------------------------------


def test_channels_list_create_pause_resume_and_delete(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
    base_url: str,
) -> None:
    s = _suffix()
    token = user_token("ui-chan-ann")
    with _api(console, token) as c:
        r = c.post("/channels", json={"type": "webhook", "name": f"seeded-{s}", "config": {}})
        assert r.status_code == 200, r.text
        seeded = r.json()["data"]["id"]
    with _api(console, user_token("ui-chan-ben")) as c:
        r = c.post("/channels", json={"type": "webhook", "name": f"bens-{s}", "config": {}})
        assert r.status_code == 200, r.text
        bens = r.json()["data"]["id"]

    page = signed_in_page(token)
    _open(page, "channels")
    expect(page.get_by_test_id(f"channel-name-{seeded}")).to_have_text(f"seeded-{s}")
    expect(page.get_by_test_id(f"channel-status-{seeded}")).to_have_text("active")
    expect(page.get_by_test_id(f"channel-row-{bens}")).to_have_count(0)  # another tenant's

    # Create a Slack channel from the form: its secrets are stored, and shown as ***.
    secret = f"signing-{s}"
    hook = f"https://hooks.example.invalid/services/T0/B0/{s}"
    page.get_by_test_id("channel-type").select_option("slack")
    page.get_by_test_id("channel-name").fill(f"slack-{s}")
    page.get_by_test_id("channel-config").fill(
        f'{{"signing_secret": "{secret}", "webhook_url": "{hook}"}}'
    )
    page.get_by_test_id("channel-submit").click()
    created = page.get_by_test_id("channel-created")
    expect(created).to_contain_text("/api/v1/channels/webhook/")
    with _api(console, token) as c:
        mine = {ch["name"]: ch for ch in c.get("/channels").json()["data"]}
    channel = mine[f"slack-{s}"]
    assert channel["type"] == "slack" and channel["status"] == "active"
    # The webhook URL is shown as set (SPEC part 4, issue 33); the signing secret masked.
    assert channel["config"] == {"signing_secret": "***", "webhook_url": hook}
    cid = channel["id"]
    expect(created).to_contain_text(f"Channel {cid} created")
    row = page.get_by_test_id(f"channel-row-{cid}")
    expect(row).to_contain_text('"signing_secret": "***"')
    expect(row).not_to_contain_text(secret)
    # The webhook path shown once is the channel's: a delivery there is checked (401 for an
    # unsigned one), where an unknown token would be a 404.
    path = created.locator("code").inner_text()
    assert httpx.post(base_url + path, json={}, timeout=30).status_code == 401
    unknown = "/api/v1/channels/webhook/not-a-channel-token"
    assert httpx.post(base_url + unknown, json={}, timeout=30).status_code == 404

    # Pause and resume: the page and the API agree.
    page.get_by_test_id(f"channel-pause-{cid}").click()
    expect(page.get_by_test_id(f"channel-status-{cid}")).to_have_text("paused")
    with _api(console, token) as c:
        assert c.get(f"/channels/{cid}").json()["status"] == "paused"
    shot(page, "channels")
    page.get_by_test_id(f"channel-resume-{cid}").click()
    expect(page.get_by_test_id(f"channel-status-{cid}")).to_have_text("active")
    expect(page.get_by_test_id(f"channel-pause-{cid}")).to_be_visible()
    with _api(console, token) as c:
        assert c.get(f"/channels/{cid}").json()["status"] == "active"

    # Delete asks first.
    delete = page.get_by_test_id(f"channel-delete-{seeded}")
    delete.click()
    expect(delete).to_contain_text("click again")
    delete.click()
    expect(page.get_by_test_id(f"channel-row-{seeded}")).to_have_count(0)
    with _api(console, token) as c:
        assert c.get(f"/channels/{seeded}").status_code == 404
    expect(page.get_by_test_id(f"channel-row-{cid}")).to_be_visible()
    assert page.errors == []
