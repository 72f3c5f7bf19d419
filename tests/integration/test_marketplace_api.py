"""Marketplace over HTTP (the app, real Postgres and Redis): publish and republish, detail with
download counting, browse ordering, tags and paging, ranked search, two authors of one name,
author rules for delete, reports and dismissals, the hourly publish limit, and every error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ITEM_KEYS = {"name", "author", "description", "tags", "downloads", "version"}
RESERVED = [
    "search",
    "reports",
    "dismiss",
    "feature",
    "rate",
    "ratings",
    "browse",
    "detail",
    "publish",
    "delete",
    "report",
]


@pytest.fixture
async def api(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with ServedApp(make_settings(rate_limit_per_minute=0)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def _publish(
    c: httpx.AsyncClient,
    who: dict[str, str],
    name: str,
    *,
    description: str = "",
    tags: list[str] | None = None,
    body: str = "do the thing",
) -> httpx.Response:
    return await c.post(
        "/marketplace/publish",
        headers=who,
        json={"name": name, "description": description, "tags": tags or [], "body": body},
    )


async def _names(c: httpx.AsyncClient, who: dict[str, str], path: str, **params: Any) -> list[str]:
    r = await c.get(path, headers=who, params=params)
    assert r.status_code == 200, r.text
    return [i["name"] for i in r.json()["items"]]


async def test_publish_detail_counts_downloads_and_republish_bumps_version(
    api: httpx.AsyncClient,
) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    r = await _publish(
        api, ann, "pdf-reader", description="Reads PDFs", tags=["PDF", "docs"], body="v1 body"
    )
    assert r.status_code == 200
    assert r.json() == {
        "ok": True,
        "name": "pdf-reader",
        "author": "ann",
        "version": "1",
        "created": True,
    }
    got = (await api.get("/marketplace/detail/pdf-reader", headers=bob)).json()
    assert got["body"] == "v1 body" and got["author"] == "ann" and got["version"] == "1"
    assert got["tags"] == ["pdf", "docs"]  # lowercased, order kept
    assert got["downloads"] == 1 and got["created_at"] > 0
    first_created = got["created_at"]
    # Each detail read counts one download, whoever reads it.
    got = (await api.get("/marketplace/detail/pdf-reader", headers=ann)).json()
    assert got["downloads"] == 2
    # Republishing the same (name, author): version + 1, fields replaced, downloads kept.
    r = await _publish(api, ann, "pdf-reader", description="Reads PDF files", body="v2 body")
    assert r.json() == {
        "ok": True,
        "name": "pdf-reader",
        "author": "ann",
        "version": "2",
        "created": False,
    }
    got = (await api.get("/marketplace/detail/pdf-reader", headers=bob)).json()
    assert got["version"] == "2" and got["body"] == "v2 body" and got["tags"] == []
    assert got["description"] == "Reads PDF files" and got["downloads"] == 3
    assert got["created_at"] == first_created and got["updated_at"] >= first_created
    page = (await api.get("/marketplace/browse", headers=bob)).json()
    assert page["total"] == 1 and set(page["items"][0]) == ITEM_KEYS
    assert page["items"][0] == {
        "name": "pdf-reader",
        "author": "ann",
        "description": "Reads PDF files",
        "tags": [],
        "downloads": 3,
        "version": "2",
    }
    # Browsing does not count downloads; concurrent detail reads each count exactly once.
    again = (await api.get("/marketplace/browse", headers=bob)).json()
    assert again["items"][0]["downloads"] == 3
    reads = await asyncio.gather(
        *(api.get("/marketplace/detail/pdf-reader", headers=bob) for _ in range(20))
    )
    assert sorted(r.json()["downloads"] for r in reads) == list(range(4, 24))


async def test_publish_rejects_reserved_names_long_bodies_and_bad_input(
    api: httpx.AsyncClient,
) -> None:
    ann = await _user(api, "ann")
    for name in [*RESERVED, "Search", "RATINGS"]:
        r = await _publish(api, ann, name)
        assert r.status_code == 400, name
        assert r.json()["code"] == "validation_error" and "reserved" in r.json()["error"]
        assert r.json()["fields"][0]["field"] == "name"
    # The body limit counts characters (SPEC part 8: 4096), not bytes.
    r = await _publish(api, ann, "too-long", body="x" * 4097)
    assert r.status_code == 400 and "4097 characters, at most 4096" in r.json()["error"]
    assert (await _publish(api, ann, "just-fits", body="é" * 4096)).status_code == 200
    bad_names = ["", "  ", "a/b", "a" * 65, "x\x00y", "tab\tin", "bell\x07", "v@2", "\u200e"]
    for name in bad_names:
        r = await _publish(api, ann, name)
        assert r.status_code == 400 and r.json()["fields"][0]["field"] == "name", name
    bad_bodies: list[dict[str, Any]] = [
        {"name": "ok-name", "body": "   "},  # empty body
        {"name": "ok-name"},  # body missing
        {"name": "ok-name", "body": "b", "tags": [f"t{i}" for i in range(17)]},
        {"name": "ok-name", "body": "b", "tags": ["no/slash"]},
        {"name": "ok-name", "body": "b", "tags": ["no,comma"]},
        {"name": "ok-name", "body": "b", "tags": ["ctl\x01"]},
        {"name": "ok-name", "body": "b", "tags": ["t" * 33]},
        {"name": "ok-name", "body": "b", "tags": "a,b"},  # not an array
        {"name": "ok-name", "body": "b", "description": "d" * 1001},
        {"name": "ok-name", "body": "b", "description": "nul\x00"},
        {"name": "ok-name", "body": 5},
        {"name": "ok-name", "body": "b", "author": "someone-else"},  # unknown field
    ]
    for payload in bad_bodies:
        r = await api.post("/marketplace/publish", headers=ann, json=payload)
        assert r.status_code == 400, payload
        assert r.json()["ok"] is False and r.json()["request_id"]
    names = await _names(api, ann, "/marketplace/browse")
    assert names == ["just-fits"]  # nothing else was stored


async def test_every_endpoint_needs_a_token(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    await _publish(api, ann, "tool")
    calls = [
        ("GET", "/marketplace/browse", None),
        ("GET", "/marketplace/search?q=tool", None),
        ("GET", "/marketplace/detail/tool", None),
        ("POST", "/marketplace/publish", {"name": "x", "body": "b"}),
        ("DELETE", "/marketplace/delete/tool", None),
        ("POST", "/marketplace/report/tool", {"reason": "spam"}),
        ("GET", "/marketplace/reports", None),
        ("POST", "/marketplace/dismiss/tool", None),
    ]
    for method, path, body in calls:
        for headers in ({}, {"Authorization": "Bearer not-a-real-token"}):
            r = await api.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path)
            assert r.json()["code"] == "unauthorized"
    # Nothing changed: the skill is there, not downloaded, not reported.
    got = (await api.get("/marketplace/detail/tool", headers=ann)).json()
    assert got["downloads"] == 1
    assert (await api.get("/marketplace/reports", headers=ADMIN)).json()["total"] == 0


async def test_browse_orders_filters_and_pages(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    published = [
        (ann, "alpha", ["python", "web"]),
        (bob, "bravo", ["python"]),
        (ann, "charlie", ["web"]),
        (bob, "delta", ["python", "web", "db"]),
        (ann, "echo", []),
    ]
    for who, name, tags in published:
        assert (await _publish(api, who, name, tags=tags)).status_code == 200
    newest = await _names(api, ann, "/marketplace/browse")
    assert newest == ["echo", "delta", "charlie", "bravo", "alpha"]
    assert await _names(api, ann, "/marketplace/browse", sort="newest") == newest
    # Downloads come from detail reads: charlie 3, alpha 2, echo 1.
    for name, reads in [("charlie", 3), ("alpha", 2), ("echo", 1)]:
        for _ in range(reads):
            assert (await api.get(f"/marketplace/detail/{name}", headers=bob)).status_code == 200
    popular = (await api.get("/marketplace/browse", headers=ann, params={"sort": "popular"})).json()
    assert [(i["name"], i["downloads"]) for i in popular["items"]] == [
        ("charlie", 3),
        ("alpha", 2),
        ("echo", 1),
        ("delta", 0),  # ties: newest first
        ("bravo", 0),
    ]
    # Tags: a skill must carry every tag given (case-insensitive).
    assert await _names(api, ann, "/marketplace/browse", tags="python") == [
        "delta",
        "bravo",
        "alpha",
    ]
    assert await _names(api, ann, "/marketplace/browse", tags="python,WEB") == ["delta", "alpha"]
    assert await _names(api, ann, "/marketplace/browse", tags="web, db") == ["delta"]
    assert await _names(api, ann, "/marketplace/browse", tags="nothing") == []
    filtered = (await api.get("/marketplace/browse", headers=ann, params={"tags": "web"})).json()
    assert filtered["total"] == 3 and filtered["has_more"] is False
    # Paging: total is the whole match, has_more says whether a next page exists.
    first = (
        await api.get("/marketplace/browse", headers=ann, params={"limit": 2, "offset": 0})
    ).json()
    assert [i["name"] for i in first["items"]] == ["echo", "delta"]
    assert (first["total"], first["limit"], first["offset"], first["has_more"]) == (5, 2, 0, True)
    second = (
        await api.get("/marketplace/browse", headers=ann, params={"limit": 2, "offset": 2})
    ).json()
    assert [i["name"] for i in second["items"]] == ["charlie", "bravo"]
    assert second["has_more"] is True
    last = (
        await api.get("/marketplace/browse", headers=ann, params={"limit": 2, "offset": 4})
    ).json()
    assert [i["name"] for i in last["items"]] == ["alpha"] and last["has_more"] is False
    beyond = (await api.get("/marketplace/browse", headers=ann, params={"offset": 50})).json()
    assert beyond["items"] == [] and beyond["total"] == 5 and beyond["has_more"] is False
    default = (await api.get("/marketplace/browse", headers=ann)).json()
    assert default["limit"] == 50 and default["offset"] == 0 and default["has_more"] is False
    for params in (
        {"sort": "oldest"},
        {"limit": 0},
        {"limit": 1001},
        {"offset": -1},
        {"limit": "ten"},
        {"tags": "bad/tag"},
    ):
        r = await api.get("/marketplace/browse", headers=ann, params=params)
        assert r.status_code == 400, params
        assert r.json()["code"] == "validation_error"


async def test_browse_limit_default_comes_from_settings(make_settings: Any) -> None:
    async with ServedApp(make_settings(marketplace_browse_limit=2)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            for name in ("one", "two", "three"):
                assert (await _publish(c, ADMIN, name)).status_code == 200
            page = (await c.get("/marketplace/browse", headers=ADMIN)).json()
            assert page["limit"] == 2 and len(page["items"]) == 2 and page["has_more"] is True


async def test_search_ranks_name_above_description_and_pages(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    # Published best match first, so newest-first order would be the reverse of rank order.
    skills = [
        ("pdf-pdf-merge", "Merges PDF files into one PDF", ["pdf"]),
        ("pdf-summarizer", "Summarizes long reports", ["docs"]),
        ("weather", "Daily forecast for a city", []),
        ("doc-translator", "Translates documents, PDF files included", ["docs"]),
    ]
    for name, description, tags in skills:
        await _publish(api, ann, name, description=description, tags=tags)
    found = (await api.get("/marketplace/search", headers=ann, params={"q": "pdf"})).json()
    names = [i["name"] for i in found["items"]]
    # Name matches (weight A) above a description-only match (weight B); more hits rank higher.
    assert names == ["pdf-pdf-merge", "pdf-summarizer", "doc-translator"]
    assert (
        found["total"] == 3 and found["has_more"] is False and set(found["items"][0]) == ITEM_KEYS
    )
    # English stemming, over name and description.
    assert await _names(api, ann, "/marketplace/search", q="summarizing") == ["pdf-summarizer"]
    assert await _names(api, ann, "/marketplace/search", q="forecasts") == ["weather"]
    # Web-search syntax: exclusion and phrases.
    assert await _names(api, ann, "/marketplace/search", q="pdf -merge") == [
        "pdf-summarizer",
        "doc-translator",
    ]
    assert await _names(api, ann, "/marketplace/search", q='"daily forecast"') == ["weather"]
    assert await _names(api, ann, "/marketplace/search", q="pdf", tags="docs") == [
        "pdf-summarizer",
        "doc-translator",
    ]
    assert await _names(api, ann, "/marketplace/search", q="unrelated") == []
    assert await _names(api, ann, "/marketplace/search", q="the a of") == []  # stop words only
    page = (
        await api.get(
            "/marketplace/search", headers=ann, params={"q": "pdf", "limit": 1, "offset": 1}
        )
    ).json()
    assert [i["name"] for i in page["items"]] == ["pdf-summarizer"]
    assert (page["total"], page["limit"], page["offset"], page["has_more"]) == (3, 1, 1, True)
    # Searching never counts downloads.
    assert all(i["downloads"] == 0 for i in found["items"])
    assert (await api.get("/marketplace/search", headers=ann)).status_code == 400  # q required
    r = await api.get("/marketplace/search", headers=ann, params={"q": "   "})
    assert r.status_code == 400 and r.json()["fields"][0]["field"] == "q"


async def test_two_authors_of_one_name(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    assert (await _publish(api, ann, "helper", body="ann's")).json()["created"] is True
    assert (await _publish(api, bob, "helper", body="bob's")).json()["created"] is True
    r = await api.get("/marketplace/detail/helper", headers=ann)
    assert r.status_code == 409
    assert r.json()["code"] == "conflict" and r.json()["authors"] == ["ann", "bob"]
    got = (
        await api.get("/marketplace/detail/helper", headers=ann, params={"author": "bob"})
    ).json()
    assert got["body"] == "bob's" and got["author"] == "bob" and got["downloads"] == 1
    r = await api.get("/marketplace/detail/helper", headers=ann, params={"author": "carol"})
    assert r.status_code == 404
    # The ambiguous read counted nothing; downloads are per (name, author).
    page = (await api.get("/marketplace/browse", headers=ann)).json()
    assert {(i["author"], i["downloads"]) for i in page["items"]} == {("ann", 0), ("bob", 1)}
    # Without ?author=, an author deletes their own one.
    r = await api.delete("/marketplace/delete/helper", headers=ann)
    assert r.json() == {"ok": True, "name": "helper", "author": "ann", "deleted": True}
    got = (await api.get("/marketplace/detail/helper", headers=ann)).json()
    assert got["author"] == "bob" and got["downloads"] == 2  # no longer ambiguous


async def test_delete_is_for_the_author_or_an_admin(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    await _publish(api, ann, "anns")
    r = await api.delete("/marketplace/delete/anns", headers=bob)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = await api.delete("/marketplace/delete/anns", headers=bob, params={"author": "ann"})
    assert r.status_code == 403
    assert (await api.delete("/marketplace/delete/missing", headers=ann)).status_code == 404
    # A NUL (which Postgres text cannot hold) in a name or author is simply not found.
    assert (await api.delete("/marketplace/delete/an%00s", headers=ann)).status_code == 400
    r = await api.get("/marketplace/detail/anns", headers=bob, params={"author": "a\x00n"})
    assert r.status_code == 400  # NUL: refused at the edge
    r = await api.delete("/marketplace/delete/anns", headers=ann, params={"author": "nobody"})
    assert r.status_code == 404
    assert (await api.get("/marketplace/detail/anns", headers=bob)).status_code == 200
    # The author.
    r = await api.delete("/marketplace/delete/anns", headers=ann, params={"author": "ann"})
    assert r.json() == {"ok": True, "name": "anns", "author": "ann", "deleted": True}
    assert (await api.get("/marketplace/detail/anns", headers=bob)).status_code == 404
    assert (await api.delete("/marketplace/delete/anns", headers=ann)).status_code == 404
    # An admin: the only author's skill without ?author=; several authors need it.
    await _publish(api, ann, "shared")
    await _publish(api, bob, "shared")
    await _publish(api, bob, "solo")
    assert (await api.delete("/marketplace/delete/solo", headers=ADMIN)).json()["author"] == "bob"
    r = await api.delete("/marketplace/delete/shared", headers=ADMIN)
    assert r.status_code == 409 and r.json()["authors"] == ["ann", "bob"]
    r = await api.delete("/marketplace/delete/shared", headers=ADMIN, params={"author": "bob"})
    assert r.json() == {"ok": True, "name": "shared", "author": "bob", "deleted": True}
    assert await _names(api, ann, "/marketplace/browse") == ["shared"]
    assert (await api.get("/marketplace/detail/shared", headers=ann)).json()["author"] == "ann"


async def test_reports_and_dismissals(api: httpx.AsyncClient) -> None:
    ann, bob, cat = await _user(api, "ann"), await _user(api, "bob"), await _user(api, "cat")
    await _publish(api, ann, "shady")
    r = await api.post("/marketplace/report/shady", headers=bob, json={"reason": "spam"})
    assert r.status_code == 200
    filed = r.json()
    assert filed["ok"] is True and filed["name"] == "shady" and filed["author"] == "ann"
    assert isinstance(filed["id"], int)
    # The same reporter again while pending: the reason is replaced, not a second report.
    r = await api.post("/marketplace/report/shady", headers=bob, json={"reason": "malware"})
    assert r.json()["id"] == filed["id"]
    await api.post("/marketplace/report/shady", headers=cat, json={"reason": "broken"})
    # Errors: reason required and bounded, the skill must exist, non-admins cannot moderate.
    for payload in ({}, {"reason": ""}, {"reason": "   "}, {"reason": "r" * 1001}, {"x": 1}):
        r = await api.post("/marketplace/report/shady", headers=bob, json=payload)
        assert r.status_code == 400, payload
    r = await api.post("/marketplace/report/missing", headers=bob, json={"reason": "spam"})
    assert r.status_code == 404
    assert (await api.get("/marketplace/reports", headers=bob)).status_code == 403
    r = await api.post("/marketplace/dismiss/shady", headers=ann)
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    listed = (await api.get("/marketplace/reports", headers=ADMIN)).json()
    assert listed["ok"] is True and listed["total"] == 2 and listed["has_more"] is False
    assert [(x["reporter"], x["reason"]) for x in listed["reports"]] == [
        ("bob", "malware"),
        ("cat", "broken"),
    ]
    assert all(x["name"] == "shady" and x["author"] == "ann" for x in listed["reports"])
    assert all(x["created_at"] > 0 for x in listed["reports"])
    one = (await api.get("/marketplace/reports", headers=ADMIN, params={"limit": 1})).json()
    assert len(one["reports"]) == 1 and one["has_more"] is True
    # Dismiss marks every pending report of the skill; they leave the pending list.
    r = await api.post("/marketplace/dismiss/shady", headers=ADMIN)
    assert r.json() == {"ok": True, "name": "shady", "author": "ann", "dismissed": 2}
    assert (await api.get("/marketplace/reports", headers=ADMIN)).json()["reports"] == []
    again = (await api.post("/marketplace/dismiss/shady", headers=ADMIN)).json()
    assert again["dismissed"] == 0
    assert (await api.post("/marketplace/dismiss/missing", headers=ADMIN)).status_code == 404
    # After a dismissal a new report is pending again.
    r = await api.post("/marketplace/report/shady", headers=bob, json={"reason": "still spam"})
    assert r.json()["id"] != filed["id"]
    assert (await api.get("/marketplace/reports", headers=ADMIN)).json()["total"] == 1
    # Two authors of one name: report and dismiss need to know which.
    await _publish(api, bob, "shady")
    r = await api.post("/marketplace/report/shady", headers=cat, json={"reason": "dup"})
    assert r.status_code == 409 and r.json()["authors"] == ["ann", "bob"]
    r = await api.post(
        "/marketplace/report/shady", headers=cat, json={"reason": "dup", "author": "bob"}
    )
    assert r.json()["author"] == "bob"
    r = await api.post(
        "/marketplace/report/shady", headers=cat, params={"author": "ann"}, json={"reason": "x"}
    )
    assert r.json()["author"] == "ann"
    r = await api.post(
        "/marketplace/report/shady",
        headers=cat,
        params={"author": "ann"},
        json={"reason": "x", "author": "bob"},
    )
    assert r.status_code == 400
    assert (await api.post("/marketplace/dismiss/shady", headers=ADMIN)).status_code == 409
    r = await api.post("/marketplace/dismiss/shady", headers=ADMIN, params={"author": "bob"})
    assert r.json()["dismissed"] == 1 and r.json()["author"] == "bob"
    # Deleting a skill drops its reports.
    assert (await api.get("/marketplace/reports", headers=ADMIN)).json()["total"] == 2
    await api.delete("/marketplace/delete/shady", headers=ann)
    assert (await api.get("/marketplace/reports", headers=ADMIN)).json()["total"] == 0


async def test_hourly_publish_limit(make_settings: Any) -> None:
    settings = make_settings(rate_limit_per_minute=0, marketplace_publish_per_hour=3)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann, bob = await _user(c, "ann"), await _user(c, "bob")
            # Rejected publishes do not count; a republish does.
            assert (await _publish(c, ann, "search")).status_code == 400
            assert (await _publish(c, ann, "big", body="x" * 5000)).status_code == 400
            for name in ("one", "two", "one"):
                assert (await _publish(c, ann, name)).status_code == 200
            r = await _publish(c, ann, "three")
            assert r.status_code == 429 and r.json()["code"] == "rate_limited"
            retry = int(r.headers["Retry-After"])
            assert 3590 <= retry <= 3600 and r.json()["retry_after"] == retry
            assert r.json()["limit"] == 3
            r = await _publish(c, ann, "one")
            assert r.status_code == 429  # a republish is limited too, and not applied
            got = (await c.get("/marketplace/detail/one", headers=ann)).json()
            assert got["version"] == "2"
            # The limit is per user, and holds under concurrent publishes (one author's
            # publishes are serialised): bob sends 6 at once, 3 land.
            many = await asyncio.gather(*(_publish(c, bob, f"bob-{i}") for i in range(6)))
            assert sorted(r.status_code for r in many) == [200] * 3 + [429] * 3
            assert (await _publish(c, bob, "bobs")).status_code == 429
            # Retry-After is the wait until the window's oldest publish is an hour old.
            conn = await asyncpg.connect(settings.database_url)
            try:
                await conn.execute(
                    "UPDATE skill_publishes SET published_at = published_at - 3590000"
                    " WHERE ctid = (SELECT ctid FROM skill_publishes WHERE author = 'ann'"
                    " ORDER BY published_at LIMIT 1)"
                )
                r = await _publish(c, ann, "three")
                assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 11
                await conn.execute(
                    "UPDATE skill_publishes SET published_at = published_at - 11000"
                    " WHERE ctid = (SELECT ctid FROM skill_publishes WHERE author = 'ann'"
                    " ORDER BY published_at LIMIT 1)"
                )
                assert (await _publish(c, ann, "three")).status_code == 200
                assert (await _publish(c, ann, "four")).status_code == 429
                # The publish that aged out left the log; the window holds the limit's worth.
                left = await conn.fetchval(
                    "SELECT count(*) FROM skill_publishes WHERE author = 'ann'"
                )
                assert left == 3
            finally:
                await conn.close()
            names = await _names(c, ann, "/marketplace/browse")
            assert len(names) == 6 and {"one", "two", "three"} <= set(names)


async def test_publish_limit_zero_means_unlimited(make_settings: Any) -> None:
    async with ServedApp(make_settings(marketplace_publish_per_hour=0)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            for i in range(12):
                assert (await _publish(c, ADMIN, "busy", body=f"v{i}")).status_code == 200
            got = (await c.get("/marketplace/detail/busy", headers=ADMIN)).json()
            assert got["version"] == "12" and got["body"] == "v11"


async def test_openapi_documents_the_marketplace(api: httpx.AsyncClient) -> None:
    doc = (await api.get("/openapi.json", headers=ADMIN)).json()
    paths = doc["paths"]
    expected = {
        ("/api/v1/marketplace/browse", "get"): "SkillPage",
        ("/api/v1/marketplace/search", "get"): "SkillPage",
        ("/api/v1/marketplace/detail/{name}", "get"): "SkillDetail",
        ("/api/v1/marketplace/publish", "post"): "SkillPublished",
        ("/api/v1/marketplace/delete/{name}", "delete"): "SkillDeleted",
        ("/api/v1/marketplace/report/{name}", "post"): "ReportFiled",
        ("/api/v1/marketplace/reports", "get"): "ReportPage",
        ("/api/v1/marketplace/dismiss/{name}", "post"): "ReportsDismissed",
    }
    for (path, method), model in expected.items():
        schema = paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith(f"/{model}"), (path, method)
    publish = doc["components"]["schemas"]["PublishBody"]
    assert publish["required"] == ["name", "body"] and publish["additionalProperties"] is False


async def test_search_finds_any_part_of_a_name(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    await _publish(api, ann, "zebrafish-d7a2fd37-skill", description="Counts stripes")
    await _publish(api, ann, "stripe-counter", description="Works with zebrafish-d7a2fd37 data")
    await _publish(api, ann, "unrelated", description="Nothing here")
    for q in ("zebrafish-d7a2fd37", "ZEBRAFISH-D7A2", "d7a2fd37-sk", "fish"):
        names = await _names(api, ann, "/marketplace/search", q=q)
        assert names and names[0] == "zebrafish-d7a2fd37-skill", (q, names)
    # A name match ranks above a description match of the same words.
    assert await _names(api, ann, "/marketplace/search", q="zebrafish-d7a2fd37") == [
        "zebrafish-d7a2fd37-skill",
        "stripe-counter",
    ]
    # Description words still find a skill.
    assert await _names(api, ann, "/marketplace/search", q="counts") == ["zebrafish-d7a2fd37-skill"]
    # LIKE metacharacters are plain text.
    assert await _names(api, ann, "/marketplace/search", q="%") == []


async def test_names_and_tags_as_clients_send_them(api: httpx.AsyncClient) -> None:
    """Issue 33: mixed case, spaces and letters of any script are a name and tags; they are
    found again by detail, browse's tag filter (any case), search and a workflow reference."""
    ann = await _user(api, "ann")
    for name, tags in [
        ("PDF Reader", ["Documents", "Data Science"]),
        ("naïve Bayes", ["Statistik", "données"]),
        ("要約ツール", ["日本語", "テキスト"]),
        ("Ünïcødé-2.0 (beta)", ["C#", "C++"]),
    ]:
        r = await _publish(api, ann, name, tags=tags, description="reads things")
        assert r.status_code == 200, (name, r.text)
        got = await api.get(f"/marketplace/detail/{name}", headers=ann)
        assert got.status_code == 200, (name, got.text)
        assert got.json()["name"] == name
        assert got.json()["tags"] == [t.lower() for t in tags]
    r = await api.get("/marketplace/browse", headers=ann, params={"tags": "DATA SCIENCE"})
    assert [i["name"] for i in r.json()["items"]] == ["PDF Reader"]
    r = await api.get("/marketplace/browse", headers=ann, params={"tags": "日本語"})
    assert [i["name"] for i in r.json()["items"]] == ["要約ツール"]
    r = await api.get("/marketplace/search", headers=ann, params={"q": "要約"})
    assert "要約ツール" in [i["name"] for i in r.json()["items"]], r.text
    # Surrounding whitespace is trimmed: the same skill, version 2.
    r = await _publish(api, ann, "  PDF Reader ")
    assert r.status_code == 200 and r.json()["version"] == "2", r.text


async def test_the_description_limit_is_a_setting(make_settings: Any) -> None:
    async with ServedApp(make_settings(rate_limit_per_minute=0, skill_description_max=20)) as s:
        async with httpx.AsyncClient(base_url=f"{s.url}/api/v1", timeout=30) as api:
            ann = await _user(api, "ann")
            assert (await _publish(api, ann, "short", description="d" * 20)).status_code == 200
            r = await _publish(api, ann, "long", description="d" * 21)
            assert r.status_code == 400, r.text
            assert r.json()["fields"] == [
                {"field": "description", "message": r.json()["error"].split(": ", 1)[1]}
            ]
            assert "skill_description_max" in r.json()["error"]


async def test_a_name_is_found_in_any_unicode_normal_form(api: httpx.AsyncClient) -> None:
    """Issue 33: publish stores a name NFC and trimmed; detail, report, dismiss and delete
    normalise the name they are given the same way, so "Cafe\u0301" (NFD, as macOS sends
    it) and "Caf\u00e9" (NFC) are one skill everywhere."""
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    nfd, nfc = "Cafe\u0301", "Caf\u00e9"
    r = await _publish(api, ann, nfd)
    assert r.status_code == 200 and r.json()["name"] == nfc, r.text
    for sent in (nfd, nfc, f" {nfd} "):
        got = await api.get(f"/marketplace/detail/{sent}", headers=bob)
        assert got.status_code == 200 and got.json()["name"] == nfc, (sent, got.text)
    r = await api.post(f"/marketplace/report/{nfd}", headers=bob, json={"reason": "spam"})
    assert r.status_code == 200 and r.json()["name"] == nfc, r.text
    r = await api.post(f"/marketplace/dismiss/{nfd}", headers=ADMIN)
    assert r.status_code == 200 and r.json()["dismissed"] == 1, r.text
    r = await api.delete(f"/marketplace/delete/{nfd}", headers=ann)
    assert r.status_code == 200, r.text
    assert (await api.get(f"/marketplace/detail/{nfc}", headers=bob)).status_code == 404
