"""Memory over HTTP (the app, real Postgres and Redis): store/get/delete, TTL -> 410, list,
full-text ranking, ownership, clear, pin, reflections, stats, limits and errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STORE_FACT = '{"key": "fact", "value": "sky is blue"}'


@pytest.fixture
async def api(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    # No embedder: these tests give their embeddings (and nothing embeds behind them).
    async with ServedApp(make_settings(rate_limit_per_minute=0, embedder="none")) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


@pytest.fixture
async def per_owner(make_settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    """`memory_key_scope: "owner"`: keys unique per owner (the setting, not the spec)."""
    settings = make_settings(rate_limit_per_minute=0, embedder="none", memory_key_scope="owner")
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as client:
            yield client


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def test_store_get_ttl_list_delete(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    r = await api.post("/memory/default/store", headers=ann, json={"key": "k1", "value": "v1"})
    assert r.json() == {"status": "ok"}
    got = (await api.get("/memory/default/k1", headers=ann)).json()
    assert got["key"] == "k1" and got["value"] == "v1" and got["created_at"] > 0
    await api.post("/memory/default/store", headers=ann, json={"key": "k1", "value": "v2"})
    assert (await api.get("/memory/default/k1", headers=ann)).json()[
        "value"
    ] == "v2"  # no stale cache
    await api.post(
        "/memory/default/store", headers=ann, json={"key": "short", "value": "x", "ttl": 300}
    )
    await asyncio.sleep(0.4)
    r = await api.get("/memory/default/short", headers=ann)
    assert r.status_code == 410 and r.json()["code"] == "gone"
    keys = [
        e["key"] for e in (await api.get("/memory/default/list", headers=ann)).json()["entries"]
    ]
    assert keys == ["k1"]
    assert (await api.delete("/memory/default/k1", headers=ann)).json() == {"status": "ok"}
    assert (await api.get("/memory/default/k1", headers=ann)).status_code == 404
    assert (await api.get("/memory/default/nope", headers=ann)).status_code == 404


async def test_search_ranks_and_limits(api: httpx.AsyncClient) -> None:
    for key, value in [
        ("a", "the deployment failed because the database was down"),
        ("b", "database database database migration notes"),
        ("c", "lunch menu for friday"),
    ]:
        await api.post("/memory/ops/store", headers=ADMIN, json={"key": key, "value": value})
    found = (await api.get("/memory/ops/search", headers=ADMIN, params={"q": "databases"})).json()
    assert [r["key"] for r in found["results"]] == ["b", "a"]  # stemmed; b ranks higher
    one = (
        await api.get("/memory/ops/search", headers=ADMIN, params={"q": "database", "limit": 1})
    ).json()
    assert len(one["results"]) == 1
    assert (await api.get("/memory/ops/search", headers=ADMIN)).status_code == 400  # q required


async def test_ownership_matrix(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    await api.post("/memory/team/store", headers=ann, json={"key": "secret", "value": "ann's"})
    # Bob: cannot read, delete or pin it (404: he cannot learn it exists), does not list it.
    assert (await api.get("/memory/team/secret", headers=bob)).status_code == 404
    assert (await api.delete("/memory/team/secret", headers=bob)).status_code == 404
    assert (
        await api.post("/memory/team/secret/pin", headers=bob, json={"pinned": True})
    ).status_code == 404
    assert (await api.get("/memory/team/list", headers=bob)).json()["entries"] == []
    # Ann and the admin see it; pin answers the new state.
    assert (await api.get("/memory/team/secret", headers=ann)).json()["value"] == "ann's"
    assert (await api.get("/memory/team/secret", headers=ADMIN)).json()["value"] == "ann's"
    r = await api.post("/memory/team/secret/pin", headers=ann, json={"pinned": True})
    assert r.json() == {"status": "ok", "pinned": True}
    # Clear removes only the caller's own entries.
    await api.post("/memory/team/store", headers=bob, json={"key": "bobs", "value": "b"})
    assert (await api.delete("/memory/team/clear", headers=bob)).json()["cleared"] == 1
    assert (await api.get("/memory/team/secret", headers=ann)).status_code == 200


async def test_keys_are_unique_per_owner(per_owner: httpx.AsyncClient) -> None:
    api = per_owner
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    r = await api.post("/memory/default/store", headers=ann, json={"key": "config", "value": "A"})
    assert r.status_code == 200
    missing = await api.get("/memory/default/config", headers=bob)
    assert missing.status_code == 404 and "ann" not in missing.text
    # Bob's store of the same key is his own entry, not a 403 and not a write to Ann's.
    r = await api.post("/memory/default/store", headers=bob, json={"key": "config", "value": "B"})
    assert r.status_code == 200, r.text
    assert (await api.get("/memory/default/config", headers=ann)).json()["value"] == "A"
    assert (await api.get("/memory/default/config", headers=bob)).json()["value"] == "B"
    for who, value in ((ann, "A"), (bob, "B")):
        listed = (await api.get("/memory/default/list", headers=who)).json()["entries"]
        assert [(e["key"], e["value"]) for e in listed] == [("config", value)]
        found = await api.get("/memory/default/search", headers=who, params={"q": "config"})
        assert [e["value"] for e in found.json()["results"]] == [value]
    # An admin holding no such key must say whose: 409 naming the owners, then by name.
    r = await api.get("/memory/default/config", headers=ADMIN)
    assert r.status_code == 409 and sorted(r.json()["owners"]) == ["ann", "bob"]
    r = await api.get("/memory/default/config", headers=ADMIN, params={"user_uuid": "bob"})
    assert r.json()["value"] == "B"
    # A user cannot name another owner.
    r = await api.get("/memory/default/config", headers=bob, params={"user_uuid": "ann"})
    assert r.status_code == 403
    # Deleting is per owner too.
    assert (await api.delete("/memory/default/config", headers=bob)).status_code == 200
    assert (await api.get("/memory/default/config", headers=bob)).status_code == 404
    assert (await api.get("/memory/default/config", headers=ann)).json()["value"] == "A"
    # With one holder left, the admin's read is that entry.
    assert (await api.get("/memory/default/config", headers=ADMIN)).json()["value"] == "A"


async def test_reflections_stats_and_errors(api: httpx.AsyncClient) -> None:
    ann = await _user(api, "ann")
    await api.post(
        "/memory/me/store", headers=ann, json={"key": "reflection:day1", "value": "learnt x"}
    )
    await api.post("/memory/me/store", headers=ann, json={"key": "note", "value": "n"})
    r = (await api.get("/memory/me/reflections", headers=ann)).json()
    assert r == {"reflections": [{"key": "reflection:day1", "value": "learnt x"}]}
    events = (await api.get("/events", headers=ann, params={"types": "memory.reflected"})).json()
    assert events["total"] == 1
    assert (await api.get("/memory/stats", headers=ann)).status_code == 403
    stats = (await api.get("/memory/stats", headers=ADMIN)).json()
    assert stats["total_entries"] == 2 and stats["total_agents"] == 1
    assert stats["pgvector_enabled"] is True and stats["pg_enabled"] is True
    assert (
        await api.post(f"/memory/{'a' * 129}/store", headers=ann, json={"key": "k", "value": "v"})
    ).status_code == 400
    r = await api.post("/memory/me/store", headers=ann, json={"key": "k"})
    assert r.status_code == 400  # value required
    r = await api.post(
        "/memory/me/store", headers=ann, json={"key": "k", "value": "v", "embedding": [0.1, 0.2]}
    )
    assert r.status_code == 400 and "384" in r.json()["error"]
    entries = (await api.get("/memory/me/list", headers=ann, params={"limit": 1})).json()["entries"]
    assert len(entries) == 1


async def test_disabled_is_503(make_settings: Any) -> None:
    async with ServedApp(make_settings(memory_enabled=False)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1") as c:
            r = await c.get("/memory/default/k", headers=ADMIN)
            assert r.status_code == 503


def _unit(i: int, j: int = -1, w: float = 0.0) -> list[float]:
    """A 384-d vector along axis i, tilted towards axis j by w (then normalised)."""
    v = [0.0] * 384
    v[i] = 1.0
    if j >= 0:
        v[j] = w
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


async def test_vector_search_orders_and_thresholds(api: httpx.AsyncClient) -> None:
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    for key, vec in [
        ("exact", _unit(0)),
        ("close", _unit(0, 1, 0.3)),  # cos ~0.958
        ("farther", _unit(0, 1, 1.0)),  # cos ~0.707
        ("orthogonal", _unit(1)),
    ]:
        await api.post(
            "/memory/v/store", headers=ann, json={"key": key, "value": key, "embedding": vec}
        )
    await api.post("/memory/v/store", headers=ann, json={"key": "none", "value": "no vector"})
    await api.post(
        "/memory/v/store", headers=bob, json={"key": "bobs", "value": "b", "embedding": _unit(0)}
    )
    r = await api.post("/memory/v/vector-search", headers=ann, json={"embedding": _unit(0)})
    got = r.json()["results"]
    assert [x["key"] for x in got] == ["exact", "close"]  # default threshold 0.75
    assert got[0]["similarity"] == pytest.approx(1.0, abs=1e-5)
    assert got[1]["similarity"] == pytest.approx(0.958, abs=1e-3)
    r = await api.post(
        "/memory/v/vector-search",
        headers=ann,
        json={"embedding": _unit(0), "threshold": 0.5, "limit": 10},
    )
    assert [x["key"] for x in r.json()["results"]] == ["exact", "close", "farther"]
    r = await api.post(
        "/memory/v/vector-search", headers=ann, json={"embedding": _unit(0), "limit": 1}
    )
    assert [x["key"] for x in r.json()["results"]] == ["exact"]
    r = await api.post("/memory/v/vector-search", headers=ann, json={"text": "x"})
    assert r.status_code == 400 and "embedder" in r.json()["error"]
    r = await api.post("/memory/v/vector-search", headers=ann, json={"embedding": [1.0, 0.0]})
    assert r.status_code == 400


async def test_decay_and_share(api: httpx.AsyncClient, make_settings: Any) -> None:
    ann = await _user(api, "ann")
    for key in ("keep:pinned", "keep:fresh", "old:1", "old:2", "doc:a", "doc:b", "misc"):
        await api.post("/memory/src/store", headers=ann, json={"key": key, "value": key})
    await api.post("/memory/src/keep:pinned/pin", headers=ann, json={"pinned": True})
    # Age two entries and the pinned one by a year (a direct write: time is the input here).
    from orchestrator.db import connect

    settings = make_settings()
    assert settings.database_url
    db = await connect(settings.database_url)
    try:
        year = 365 * 86_400_000
        await db.pool.execute(
            "UPDATE memory_entries SET accessed_at = accessed_at - $1"
            " WHERE key IN ('old:1', 'old:2', 'keep:pinned')",
            year,
        )
    finally:
        await db.close()
    assert (await api.post("/memory/decay", headers=ann)).status_code == 403
    r = await api.post("/memory/decay", headers=ADMIN)
    assert r.json() == {"status": "ok", "forgotten": 2}
    keys = {e["key"] for e in (await api.get("/memory/src/list", headers=ann)).json()["entries"]}
    assert keys == {"keep:pinned", "keep:fresh", "doc:a", "doc:b", "misc"}
    forgotten = (
        await api.get("/events", headers=ADMIN, params={"types": "memory.forgotten"})
    ).json()
    assert forgotten["data"][0]["data"]["count"] == 2
    assert (
        await api.post("/memory/share", headers=ann, json={"from": "src", "to": "dst"})
    ).status_code == 403
    r = await api.post(
        "/memory/share", headers=ADMIN, json={"from": "src", "to": "dst", "pattern": "doc:*"}
    )
    assert r.json() == {"status": "ok", "copied": 2}
    copied = {e["key"] for e in (await api.get("/memory/dst/list", headers=ann)).json()["entries"]}
    assert copied == {"doc:a", "doc:b"}  # still Ann's: she sees them


async def test_agent_memory_tools_act_as_the_task_user(make_settings: Any) -> None:
    from tests.fakes.agent_llm import agent_reply
    from tests.fakes.openai_server import OpenAIFake
    from tests.integration.test_workflows_api import agent_settings, finished

    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as served:
            async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
                ann, bob = await _user(c, "ann"), await _user(c, "bob")
                await c.post(
                    "/memory/default/store", headers=bob, json={"key": "b", "value": "bob's"}
                )
                r = await c.post(
                    "/workflows",
                    headers=ann,
                    json={
                        "name": "remember",
                        "steps": [
                            {
                                "name": "put",
                                "prompt": "[tool memory_store " + STORE_FACT + "]",
                            },
                            {"name": "get", "prompt": '[tool memory_get {"key": "fact"}]'},
                            {"name": "find", "prompt": '[tool memory_search {"query": "sky"}]'},
                            {"name": "theirs", "prompt": '[tool memory_get {"key": "b"}]'},
                        ],
                    },
                )
                body = await finished(c, ann, r.json()["id"])
                results = [s["result"] for s in body["steps"]]
                assert results[0] == "tool memory_store said: stored"
                assert results[1] == "tool memory_get said: sky is blue"
                assert '"key": "fact"' in results[2]
                assert "not found" in results[3]  # Bob's entry is not Ann's to read
                assert (await c.get("/memory/default/fact", headers=ann)).json()[
                    "value"
                ] == "sky is blue"
                assert (await c.get("/memory/default/fact", headers=bob)).status_code == 404


async def test_redis_outage_loses_nothing(make_settings: Any, tmp_path: Any) -> None:
    """A Redis of its own, stopped mid-test: reads and writes stay correct (Postgres holds
    everything), and after Redis comes back the cache is not stale."""
    from orchestrator.runtime import EmbeddedRedis

    redis = EmbeddedRedis(tmp_path / "own-redis")
    redis.start()
    try:
        settings = make_settings(redis_url=redis.uri(), rate_limit_per_minute=0)
        async with ServedApp(settings) as served:
            async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
                await c.post("/memory/r/store", headers=ADMIN, json={"key": "k", "value": "v1"})
                assert (await c.get("/memory/r/k", headers=ADMIN)).json()["value"] == "v1"  # cached
                redis.stop()
                assert (await c.get("/memory/r/k", headers=ADMIN)).json()["value"] == "v1"
                r = await c.post("/memory/r/store", headers=ADMIN, json={"key": "k", "value": "v2"})
                assert r.status_code == 200
                await c.post("/memory/r/store", headers=ADMIN, json={"key": "k2", "value": "new"})
                assert (await c.get("/memory/r/k", headers=ADMIN)).json()["value"] == "v2"
                redis.start()
                # The copy cached before the outage must not come back: "v2", not "v1".
                assert (await c.get("/memory/r/k", headers=ADMIN)).json()["value"] == "v2"
                keys = {
                    e["key"]
                    for e in (await c.get("/memory/r/list", headers=ADMIN)).json()["entries"]
                }
                assert keys == {"k", "k2"}
    finally:
        redis.stop()


async def test_input_postgres_cannot_hold_is_a_400(api: httpx.AsyncClient) -> None:
    """NUL characters and float32 overflow are refused at the door, never a 500."""
    ann = await _user(api, "ann")
    for body in (
        {"key": "a\u0000b", "value": "v"},
        {"key": "k", "value": "a\u0000b"},
        {"key": "k", "value": "v", "embedding": [1e39] + [0.0] * 383},
    ):
        r = await api.post("/memory/default/store", headers=ann, json=body)
        assert r.status_code == 400, (body, r.text)
    r = await api.get("/memory/default/search", headers=ann, params={"q": "a\u0000"})
    assert r.status_code == 400
    r = await api.post(
        "/memory/default/vector-search", headers=ann, json={"embedding": [1e39] + [0.0] * 383}
    )
    assert r.status_code == 400
    r = await api.get("/memory/default/list", headers=ann, params={"offset": 2**63})
    assert r.status_code == 400


async def test_share_replaces_a_same_named_entry_whole(per_owner: httpx.AsyncClient) -> None:
    api = per_owner
    one = [1.0] + [0.0] * 383
    two = [0.0, 1.0] + [0.0] * 382
    await api.post(
        "/memory/src/store", headers=ADMIN, json={"key": "a", "value": "red", "embedding": one}
    )
    await api.post(
        "/memory/dst/store", headers=ADMIN, json={"key": "a", "value": "blue", "embedding": two}
    )
    bob = await _user(api, "bob")
    await api.post(
        "/memory/dst/store", headers=bob, json={"key": "a", "value": "green", "embedding": two}
    )
    r = await api.post("/memory/share", headers=ADMIN, json={"from": "src", "to": "dst"})
    assert r.json() == {"status": "ok", "copied": 1}
    found = (
        await api.post(
            "/memory/dst/vector-search", headers=ADMIN, json={"embedding": one, "threshold": 0.99}
        )
    ).json()["results"]
    assert [(x["key"], x["value"]) for x in found] == [("a", "red")]
    near_two = (
        await api.post(
            "/memory/dst/vector-search", headers=ADMIN, json={"embedding": two, "threshold": 0.99}
        )
    ).json()["results"]
    # The admin's old vector went with its old value; Bob's same-named entry is his own.
    assert [(x["key"], x["value"]) for x in near_two] == [("a", "green")]
    assert (await api.get("/memory/dst/a", headers=bob)).json()["value"] == "green"


async def test_agent_id_limit_is_the_setting(make_settings: Any) -> None:
    """`memory_agent_id_max` (at most SPEC's 128) bounds agent ids on every memory path."""
    async with ServedApp(make_settings(memory_agent_id_max=8, rate_limit_per_minute=0)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            ok = await c.post(
                "/memory/a2345678/store", headers=ann, json={"key": "k", "value": "v"}
            )
            assert ok.status_code == 200
            for method, path in [
                ("POST", "/memory/a23456789/store"),
                ("GET", "/memory/a23456789/list"),
                ("GET", "/memory/a23456789/k"),
            ]:
                r = await c.request(method, path, headers=ann, json={"key": "k", "value": "v"})
                assert r.status_code == 400, (path, r.text)
                body = r.json()
                assert body["ok"] is False and body["code"] == "validation_error"
                assert body["request_id"] and "memory_agent_id_max" in body["error"]
                assert [f["field"] for f in body["fields"]] == ["agent_id"]
            r = await c.post(
                "/memory/share", headers=ADMIN, json={"from": "a2345678", "to": "b" * 9}
            )
            assert r.status_code == 400 and [f["field"] for f in r.json()["fields"]] == ["to"]


async def test_a_key_is_unique_within_the_agent_namespace(
    api: httpx.AsyncClient, make_settings: Any
) -> None:
    """SPEC part 2 (the default `memory_key_scope: "agent"`): a store of a key another user
    holds is a 403 and writes nothing; the admin's read is that one entry; share replaces
    whoever held a key in the target."""
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    r = await api.post("/memory/default/store", headers=ann, json={"key": "config", "value": "A"})
    assert r.status_code == 200
    for who in (bob, ADMIN):
        r = await api.post(
            "/memory/default/store", headers=who, json={"key": "config", "value": "B"}
        )
        assert r.status_code == 403, r.text
        body = r.json()
        assert body["code"] == "forbidden" and "config" in body["error"] and "ann" not in r.text
    assert (await api.get("/memory/default/config", headers=ann)).json()["value"] == "A"
    assert (await api.get("/memory/default/config", headers=bob)).status_code == 404
    assert (await api.get("/memory/default/list", headers=bob)).json()["entries"] == []
    r = await api.get("/memory/default/config", headers=ADMIN)
    assert r.status_code == 200 and r.json()["value"] == "A"
    # Ann overwrites her own; once she deletes it the key is free for Bob.
    r = await api.post("/memory/default/store", headers=ann, json={"key": "config", "value": "A2"})
    assert r.status_code == 200
    assert (await api.delete("/memory/default/config", headers=ann)).status_code == 200
    r = await api.post("/memory/default/store", headers=bob, json={"key": "config", "value": "B"})
    assert r.status_code == 200
    assert (await api.get("/memory/default/config", headers=ADMIN)).json()["value"] == "B"
    # Two users racing for a new key: exactly one wins.
    answers = await asyncio.gather(
        *(
            api.post("/memory/race/store", headers=who, json={"key": "k", "value": str(i)})
            for i, who in enumerate((ann, bob) * 4)
        )
    )
    codes = sorted(a.status_code for a in answers)
    assert set(codes) == {200, 403} and codes.count(200) == 4, codes
    # Share replaces the target's entry of a key whoever held it (one entry per key).
    await api.post("/memory/src2/store", headers=ann, json={"key": "a", "value": "ann's"})
    await api.post("/memory/dst2/store", headers=bob, json={"key": "a", "value": "bob's"})
    r = await api.post("/memory/share", headers=ADMIN, json={"from": "src2", "to": "dst2"})
    assert r.json() == {"status": "ok", "copied": 1}
    assert (await api.get("/memory/dst2/a", headers=ADMIN)).json()["value"] == "ann's"
    assert (await api.get("/memory/dst2/a", headers=bob)).status_code == 404


async def test_another_users_expired_entry_frees_the_key(api: httpx.AsyncClient) -> None:
    """Issue 33: an entry past its ttl (a 410) no longer holds the key under "agent" scope:
    the next store by someone else deletes it in the same statement (no decay needed), even
    a pinned one; an entry not yet expired still makes that store a 403."""
    ann, bob = await _user(api, "ann"), await _user(api, "bob")
    for key, pin in (("lease", False), ("pinned", True)):
        r = await api.post(
            "/memory/default/store", headers=ann, json={"key": key, "value": "A", "ttl": 400}
        )
        assert r.status_code == 200, r.text
        if pin:
            assert (await api.post(f"/memory/default/{key}/pin", headers=ann)).status_code == 200
        r = await api.post("/memory/default/store", headers=bob, json={"key": key, "value": "B"})
        assert r.status_code == 403, r.text
        deadline = asyncio.get_running_loop().time() + 10
        while (await api.get(f"/memory/default/{key}", headers=ann)).status_code != 410:
            assert asyncio.get_running_loop().time() < deadline, "never expired"
            await asyncio.sleep(0.05)
        r = await api.post("/memory/default/store", headers=bob, json={"key": key, "value": "B"})
        assert r.status_code == 200, r.text
        got = await api.get(f"/memory/default/{key}", headers=bob)
        assert got.status_code == 200 and got.json()["value"] == "B"
        assert (await api.get(f"/memory/default/{key}", headers=ann)).status_code == 404
        r = await api.get(f"/memory/default/{key}", headers=ADMIN)
        assert r.status_code == 200 and r.json()["value"] == "B"  # one entry: Bob's


async def test_pin_checks_ownership_as_delete_does(
    api: httpx.AsyncClient, make_settings: Any
) -> None:
    """Pin and unpin: the owner (others' entries: test_memory_admin_delete_...); an ownerless
    entry (written before entries had owners) is visible to everyone but pinned only by
    admins, as it is deleted."""
    from orchestrator.db import connect

    settings = make_settings()
    db = await connect(settings.database_url)
    try:
        await db.pool.execute(
            "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at,"
            " updated_at, accessed_at) VALUES ('team', 'shared', 'everyone''s', NULL, 1, 1, 1)"
        )
    finally:
        await db.close()
    ann = await _user(api, "ann")
    assert (await api.get("/memory/team/shared", headers=ann)).json()["value"] == "everyone's"
    for pinned in (True, False):
        r = await api.post("/memory/team/shared/pin", headers=ann, json={"pinned": pinned})
        assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    assert (await api.delete("/memory/team/shared", headers=ann)).status_code == 403
    r = await api.post("/memory/team/shared/pin", headers=ADMIN, json={"pinned": True})
    assert r.json() == {"status": "ok", "pinned": True}
    # Her own entry she pins and unpins.
    await api.post("/memory/team/store", headers=ann, json={"key": "mine", "value": "m"})
    for pinned in (True, False):
        r = await api.post("/memory/team/mine/pin", headers=ann, json={"pinned": pinned})
        assert r.json() == {"status": "ok", "pinned": pinned}


async def _ownerless(make_settings: Any, agent_id: str, key: str) -> None:
    """An entry from before entries had owners (user_uuid NULL), written as migration 0011
    left them: no API writes one today."""
    from orchestrator.db import connect

    db = await connect(make_settings().database_url)
    try:
        await db.pool.execute(
            "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at,"
            " updated_at, accessed_at) VALUES ($1, $2, 'old', NULL, 1, 1, 1)",
            agent_id,
            key,
        )
    finally:
        await db.close()


async def test_delete_clear_and_pin_are_owner_only(
    api: httpx.AsyncClient, make_settings: Any
) -> None:
    """SPEC part 4: delete and clear are owner only (memory_admin_delete false, the
    default): an admin sees another user's entry but deleting, pinning or unpinning it is
    a 403 and their clear leaves it; ownerless entries stay admins' to change and clear."""
    ann = await _user(api, "ann")
    await api.post("/memory/own/store", headers=ann, json={"key": "hers", "value": "a"})
    await api.post("/memory/own/store", headers=ADMIN, json={"key": "admins", "value": "x"})
    await _ownerless(make_settings, "own", "old")
    assert (await api.get("/memory/own/hers", headers=ADMIN)).json()["value"] == "a"
    r = await api.delete("/memory/own/hers", headers=ADMIN)
    assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    for pinned in (True, False):
        r = await api.post("/memory/own/hers/pin", headers=ADMIN, json={"pinned": pinned})
        assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    r = await api.delete("/memory/own/hers", headers=ADMIN, params={"user_uuid": "ann"})
    assert r.status_code == 403, r.text
    # The admin's clear: their own entry and the ownerless one, not Ann's.
    assert (await api.delete("/memory/own/clear", headers=ADMIN)).json()["cleared"] == 2
    assert (await api.get("/memory/own/hers", headers=ann)).json()["value"] == "a"
    assert (await api.get("/memory/own/old", headers=ADMIN)).status_code == 404
    # An ownerless entry the admin deletes and pins; Ann neither.
    await _ownerless(make_settings, "own", "old2")
    r = await api.post("/memory/own/old2/pin", headers=ann, json={"pinned": True})
    assert r.status_code == 403
    assert (await api.delete("/memory/own/old2", headers=ann)).status_code == 403
    r = await api.post("/memory/own/old2/pin", headers=ADMIN, json={"pinned": True})
    assert r.json() == {"status": "ok", "pinned": True}
    assert (await api.delete("/memory/own/old2", headers=ADMIN)).json() == {"status": "ok"}
    # The owner herself: pin, unpin, delete.
    r = await api.post("/memory/own/hers/pin", headers=ann, json={"pinned": True})
    assert r.json() == {"status": "ok", "pinned": True}
    assert (await api.delete("/memory/own/hers", headers=ann)).json() == {"status": "ok"}


async def test_memory_admin_delete_lets_admins_change_anyones(make_settings: Any) -> None:
    """`memory_admin_delete: true` (the setting, not the spec): an admin deletes, pins and
    unpins another user's entry and their clear removes every user's in the namespace."""
    settings = make_settings(rate_limit_per_minute=0, embedder="none", memory_admin_delete=True)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            ann, bob = await _user(api, "ann"), await _user(api, "bob")
            for who, key in ((ann, "a1"), (ann, "a2"), (bob, "b1")):
                await api.post("/memory/any/store", headers=who, json={"key": key, "value": "v"})
            await _ownerless(make_settings, "any", "old")
            r = await api.post("/memory/any/a1/pin", headers=ADMIN, json={"pinned": True})
            assert r.json() == {"status": "ok", "pinned": True}, r.text
            assert (await api.delete("/memory/any/a1", headers=ADMIN)).json() == {"status": "ok"}
            assert (await api.get("/memory/any/a1", headers=ann)).status_code == 404
            # A non-admin still changes only their own (another's stays invisible: 404).
            assert (await api.delete("/memory/any/a2", headers=bob)).status_code == 404
            assert (await api.delete("/memory/any/clear", headers=ADMIN)).json()["cleared"] == 3
            for who in (ann, bob):
                assert (await api.get("/memory/any/list", headers=who)).json()["entries"] == []


async def test_the_migration_keeps_two_users_entries_of_one_key(
    empty_database_url: str, tmp_path: Any, make_settings: Any
) -> None:
    """Migration 0029 on a database holding several owners' entries of one key (per-owner
    keys, migration 0011): nothing is lost; the ownerless (else oldest) stays bound by the
    namespace's uniqueness, so a new store by anyone else is a 403; owners keep theirs."""
    import shutil
    from pathlib import Path

    import asyncpg

    from orchestrator.db import MIGRATIONS_DIR, apply_migrations

    before = Path(tmp_path) / "before"
    before.mkdir()
    for path in MIGRATIONS_DIR.glob("*.sql"):
        if int(path.name[:4]) < 29:
            shutil.copy(path, before / path.name)
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply_migrations(conn, before)
        for agent, owner, created in (
            ("ns", "ann", 1),
            ("ns", "bob", 2),
            ("ns2", "ann", 5),
            ("ns2", None, 6),
            ("ns2", "bob", 4),
        ):
            await conn.execute(
                "INSERT INTO memory_entries (agent_id, key, value, user_uuid, created_at,"
                " updated_at, accessed_at) VALUES ($1, 'config', $2, $3, $4, $4, $4)",
                agent,
                f"{owner}'s",
                owner,
                created,
            )
        assert "0029_memory_agent_keys.sql" in await apply_migrations(conn)
        rows = await conn.fetch(
            "SELECT agent_id, user_uuid, per_owner FROM memory_entries ORDER BY 1, 2"
        )
        assert [tuple(r) for r in rows] == [
            ("ns", "ann", False),
            ("ns", "bob", True),
            ("ns2", "ann", True),
            ("ns2", "bob", True),
            ("ns2", None, False),
        ]
    finally:
        await conn.close()
    async with ServedApp(
        make_settings(database_url=empty_database_url, rate_limit_per_minute=0, embedder="none")
    ) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as api:
            ann, bob, carol = [await _user(api, n) for n in ("ann", "bob", "carol")]
            for who, value in ((ann, "ann's"), (bob, "bob's")):
                assert (await api.get("/memory/ns/config", headers=who)).json()["value"] == value
            # Bob overwrites his own (left) entry; Carol, new to the key, is refused.
            config = {"key": "config", "value": "new"}
            assert (await api.post("/memory/ns/store", headers=bob, json=config)).status_code == 200
            assert (await api.get("/memory/ns/config", headers=bob)).json()["value"] == "new"
            for ns in ("ns", "ns2"):
                r = await api.post(f"/memory/{ns}/store", headers=carol, json=config)
                assert r.status_code == 403
