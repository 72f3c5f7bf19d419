"""Memory, workspace and marketplace through `scripts/serve` (Serve replicas, AgentWorker
actors, embedded Postgres + pgvector and Redis, the local ONNX embedder), one service for the
module: every endpoint over HTTP, the default limits, admin-only endpoints 403 for users,
embeddings filled in after the store and used by vector search with `text`, traversal
attempts sent raw, and an agent (in a worker actor) using the memory and workspace tools as
the task's user. On the e2e modules' shared service (tests/e2e/shared.py): its users are its
own (a random suffix), and it counts only the skills it published (its own tag)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from tests.e2e.shared import SharedService
from tests.e2e.test_workflows import Orchestrator

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def service(shared_service: SharedService) -> Orchestrator:
    """The shared service: the local embedder (scripts/serve's default) and
    `marketplace_publish_per_hour: 3`."""
    return shared_service.orch


def _name(user: str) -> str:
    return f"{user}-{uuid.uuid4().hex[:8]}"


def _token(c: httpx.Client, user: str) -> dict[str, str]:
    made = c.post("/tokens", json={"user_uuid": user}).json()
    return {"Authorization": f"Bearer {made['token']}"}


def _wait(check: Any, within: float = 30) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)
    return got


def test_every_memory_endpoint(service: Orchestrator) -> None:
    with service.client() as c:
        ann, bob = _token(c, _name("ann")), _token(c, _name("bob"))
        # store / get / overwrite rules / delete
        r = c.post("/memory/default/store", headers=ann, json={"key": "k", "value": "v1"})
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        got = c.get("/memory/default/k", headers=ann).json()
        assert got["key"] == "k" and got["value"] == "v1" and isinstance(got["created_at"], int)
        assert c.get("/memory/default/k", headers=bob).status_code == 404
        # A key is unique within its namespace (SPEC part 2): Bob's store of Ann's `k` is a
        # 403 that leaves hers. Delete and clear are owner only (SPEC part 4), for the admin
        # (`c`'s token) too, who sees the entry: 403; Bob, who does not: 404.
        r = c.post("/memory/default/store", headers=bob, json={"key": "k", "value": "x"})
        assert r.status_code == 403
        assert c.delete("/memory/default/k", headers=bob).status_code == 404
        assert c.get("/memory/default/k").json()["value"] == "v1"
        assert c.delete("/memory/default/k").status_code == 403
        assert c.post("/memory/default/k/pin", json={"pinned": True}).status_code == 403
        assert c.delete("/memory/default/clear").json()["cleared"] == 0
        assert c.get("/memory/default/k", headers=ann).json()["value"] == "v1"
        r = c.post("/memory/default/store", headers=ann, json={"key": "t", "value": "x", "ttl": 1})
        time.sleep(0.05)
        assert c.get("/memory/default/t", headers=ann).status_code == 410
        assert c.delete("/memory/default/k", headers=ann).json() == {"status": "ok"}
        assert c.get("/memory/default/k", headers=ann).status_code == 404
        # validation
        assert c.post("/memory/default/store", headers=ann, json={"key": "k"}).status_code == 400
        r = c.post("/memory/" + "a" * 129 + "/store", headers=ann, json={"key": "k", "value": "v"})
        assert r.status_code == 400
        r = c.post(
            "/memory/default/store", headers=ann, json={"key": "e", "value": "v", "embedding": [1]}
        )
        assert r.status_code == 400 and "384" in r.json()["error"]
        # list: default limit 50, offset
        for i in range(60):
            c.post("/memory/many/store", headers=ann, json={"key": f"n{i:02}", "value": f"v{i}"})
        listed = c.get("/memory/many/list", headers=ann).json()["entries"]
        assert len(listed) == 50
        page = c.get("/memory/many/list", headers=ann, params={"offset": 50}).json()["entries"]
        assert len(page) == 10
        assert c.get("/memory/many/list", headers=bob).json()["entries"] == []
        # full-text search: default limit 20, ranked
        for i in range(25):
            c.post(
                "/memory/fts/store",
                headers=ann,
                json={"key": f"f{i}", "value": "deployment notes " + "deploy " * (i % 3)},
            )
        c.post("/memory/fts/store", headers=ann, json={"key": "lunch", "value": "menu"})
        found = c.get("/memory/fts/search", headers=ann, params={"q": "deploy"}).json()["results"]
        assert len(found) == 20 and "lunch" not in [x["key"] for x in found]
        assert set(found[0]) == {"key", "value", "created_at"}
        assert c.get("/memory/fts/search", headers=ann).status_code == 400  # q required
        # pin, reflections, clear
        c.post("/memory/r/store", headers=ann, json={"key": "reflection:1", "value": "learned"})
        c.post("/memory/r/store", headers=ann, json={"key": "plain", "value": "x"})
        r = c.post("/memory/r/plain/pin", headers=ann, json={"pinned": True})
        assert r.json() == {"status": "ok", "pinned": True}
        assert c.post("/memory/r/plain/pin", headers=bob, json={}).status_code == 404
        refl = c.get("/memory/r/reflections", headers=ann).json()["reflections"]
        assert refl == [{"key": "reflection:1", "value": "learned"}]
        assert c.get("/memory/r/reflections", headers=bob).json()["reflections"] == []
        assert c.delete("/memory/many/clear", headers=bob).json()["cleared"] == 0
        cleared = c.delete("/memory/many/clear", headers=ann).json()
        assert cleared["status"] == "ok" and cleared["cleared"] == 60
        # vector search: with `text` (the local embedder fills embeddings in after the store)
        c.post("/memory/sem/store", headers=ann, json={"key": "cat", "value": "A cat naps."})
        c.post("/memory/sem/store", headers=ann, json={"key": "tax", "value": "Tax is due."})

        def nearest() -> list[Any]:
            r = c.post(
                "/memory/sem/vector-search",
                headers=ann,
                json={"text": "a sleeping kitten", "threshold": 0.2},
            )
            assert r.status_code == 200, r.text
            return list(r.json()["results"])

        hits = _wait(nearest)
        assert hits[0]["key"] == "cat" and set(hits[0]) == {"key", "value", "similarity"}
        r = c.post("/memory/sem/vector-search", headers=ann, json={})
        assert r.status_code == 400
        # admin-only: 403 for users, answers for admins
        for method, path, body in (
            ("GET", "/memory/stats", None),
            ("POST", "/memory/decay", None),
            ("POST", "/memory/share", {"from": "r", "to": "r2", "pattern": "reflection:*"}),
        ):
            assert c.request(method, path, headers=ann, json=body).status_code == 403, path
        stats = c.get("/memory/stats").json()
        assert stats["pg_enabled"] is True and stats["pgvector_enabled"] is True
        assert stats["total_entries"] >= 4 and stats["total_agents"] >= 3
        assert c.post("/memory/decay").json()["status"] == "ok"
        shared = c.post("/memory/share", json={"from": "r", "to": "r2", "pattern": "reflection:*"})
        assert shared.json() == {"status": "ok", "copied": 1}
        assert c.get("/memory/r2/reflection:1", headers=ann).json()["value"] == "learned"
        assert httpx.get(f"{service.url}/memory/stats").status_code == 401


def test_workspace_over_http(service: Orchestrator) -> None:
    root = service.work / "data" / "workspace"
    ann_uuid = _name("ann")
    with service.client() as c:
        ann, bob = _token(c, ann_uuid), _token(c, _name("bob"))
        r = c.post("/workspace/write", headers=ann, json={"path": "d/a.md", "content": "one two"})
        assert r.status_code == 200 and r.json()["ok"] is True
        assert (root / ann_uuid / "d" / "a.md").read_text() == "one two"
        got = c.post("/workspace/read", headers=ann, json={"path": "d/a.md"}).json()
        assert got["content"] == "one two" and got["size"] == 7 and got["path"] == "d/a.md"
        assert c.post("/workspace/read", headers=bob, json={"path": "d/a.md"}).status_code == 404
        r = c.post(
            "/workspace/edit",
            headers=ann,
            json={"path": "d/a.md", "old_text": "two", "new_text": "2"},
        )
        assert r.status_code == 200
        c.post("/workspace/write", headers=ann, json={"path": "d/b.md", "content": "x x"})
        r = c.post(
            "/workspace/edit",
            headers=ann,
            json={"path": "d/b.md", "old_text": "x", "new_text": "y"},
        )
        assert r.status_code == 400
        assert r.json()["error"] == "multiple matches" and r.json()["matches"] == 2
        found = c.post("/workspace/search", headers=ann, json={"query": "**/*.md"}).json()
        assert [x["path"] for x in found["results"]] == ["d/a.md", "d/b.md"]
        assert found["count"] == 2 and found["results"][0]["modified"].endswith("Z")
        listed = c.get("/workspace/list", headers=ann, params={"path": "", "recursive": True})
        assert [e["path"] for e in listed.json()["entries"]] == ["d", "d/a.md", "d/b.md"]
        # Traversal, sent as the client gives it (no normalisation on the way).
        outside = service.work / "outside.txt"
        outside.write_text("secret")
        (root / ann_uuid / "link").symlink_to(service.work)
        for path in (
            "../bob/x",
            "a/../../x",
            "/etc/passwd",
            "..%2f..%2fx",
            "a\\..\\x",
            "link/outside.txt",
        ):
            for op in ("read", "write"):
                r = c.post(f"/workspace/{op}", headers=ann, json={"path": path, "content": "p"})
                assert r.status_code == 400, (op, path, r.text)
        raw = httpx.get(
            f"{service.url}/workspace/list?path=%2e%2e%2f%2e%2e&recursive=true", headers=ann
        )
        assert raw.status_code == 400
        assert outside.read_text() == "secret"
        big = {"path": "big.bin", "content": "x" * (10 * 1024 * 1024 + 1)}
        assert c.post("/workspace/write", headers=ann, json=big).status_code == 413


def test_marketplace_over_http(service: Orchestrator) -> None:
    mk_ann, mk_bob, tag = _name("mk-ann"), _name("mk-bob"), _name("t")
    with service.client() as c:
        ann, bob = _token(c, mk_ann), _token(c, mk_bob)
        # Its own tag on each skill: other modules' skills are in the same marketplace.
        skill = {"name": "summarise", "description": "Summarise text", "tags": ["text", tag]}
        r = c.post("/marketplace/publish", headers=ann, json={**skill, "body": "Do it."})
        assert r.status_code == 200 and r.json()["version"] == "1"
        r = c.post("/marketplace/publish", headers=ann, json={**skill, "body": "Do it well."})
        assert r.json()["version"] == "2"
        c.post("/marketplace/publish", headers=bob, json={**skill, "body": "Mine."})
        r = c.post("/marketplace/publish", headers=ann, json={"name": "search", "body": "x"})
        assert r.status_code == 400
        r = c.post("/marketplace/publish", headers=ann, json={"name": "big", "body": "x" * 4097})
        assert r.status_code == 400
        third = {"name": "third", "body": "x", "tags": [tag]}
        r = c.post("/marketplace/publish", headers=ann, json=third)
        assert r.status_code == 200  # the third publish of the hour
        r = c.post("/marketplace/publish", headers=ann, json={"name": "fourth", "body": "x"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        page = c.get("/marketplace/browse", headers=bob, params={"limit": 1, "tags": tag}).json()
        assert page["total"] == 3 and page["has_more"] is True and len(page["items"]) == 1
        assert set(page["items"][0]) == {
            "name",
            "author",
            "description",
            "tags",
            "downloads",
            "version",
        }
        assert c.get("/marketplace/detail/summarise", headers=bob).status_code == 409
        detail = c.get(
            "/marketplace/detail/summarise", headers=bob, params={"author": mk_ann}
        ).json()
        assert detail["body"] == "Do it well." and detail["downloads"] == 1
        popular = c.get(
            "/marketplace/browse", headers=bob, params={"sort": "popular", "tags": tag}
        ).json()
        assert popular["items"][0]["author"] == mk_ann
        hits = c.get("/marketplace/search", headers=bob, params={"q": "summarise"}).json()
        assert {i["author"] for i in hits["items"]} == {mk_ann, mk_bob}
        r = c.post(
            "/marketplace/report/summarise",
            headers=bob,
            json={"reason": "spam", "author": mk_ann},
        )
        assert r.status_code == 200
        assert c.get("/marketplace/reports", headers=bob).status_code == 403
        reports = c.get("/marketplace/reports").json()["reports"]
        assert [r["author"] for r in reports if r["name"] == "summarise"] == [mk_ann]
        assert c.post("/marketplace/dismiss/summarise", headers=bob).status_code == 403
        assert (
            c.post("/marketplace/dismiss/summarise", params={"author": mk_ann}).json()["dismissed"]
            == 1
        )
        r = c.delete("/marketplace/delete/summarise", headers=bob, params={"author": mk_ann})
        assert r.status_code == 403
        assert c.delete("/marketplace/delete/summarise", headers=ann).json()["deleted"] is True
        assert c.delete("/marketplace/delete/nothing", headers=ann).status_code == 404
        assert httpx.get(f"{service.url}/marketplace/browse").status_code == 401


def test_agent_tools_in_a_worker_act_as_the_user(service: Orchestrator) -> None:
    """An agent task runs in an AgentWorker actor: its memory and workspace tools act in the
    workflow creator's namespace and root."""
    with service.client() as c:
        cy = _token(c, _name("cy"))
        # Cached in a replica before the agent (in a worker) overwrites it.
        c.post("/memory/default/store", headers=cy, json={"key": "seen", "value": "before"})
        assert c.get("/memory/default/seen", headers=cy).json()["value"] == "before"
        write = '[tool workspace_write {"path": "agent/out.md", "content": "from the agent"}]'
        remember = '[tool memory_store {"key": "seen", "value": "by the agent"}]'
        r = c.post(
            "/workflows",
            headers=cy,
            json={
                "name": "tools",
                "steps": [{"name": "w", "prompt": write}, {"name": "m", "prompt": remember}],
            },
        )
        wid = r.json()["id"]

        def done() -> Any:
            body = c.get(f"/workflows/{wid}", headers=cy).json()
            return body if body["status"] in ("completed", "failed") else None

        body = _wait(done, 60)
        assert body["status"] == "completed", body
        got = c.post("/workspace/read", headers=cy, json={"path": "agent/out.md"}).json()
        assert got["content"] == "from the agent"
        assert c.get("/memory/default/seen", headers=cy).json()["value"] == "by the agent"
        other = _token(c, _name("dee"))
        assert c.get("/memory/default/seen", headers=other).status_code == 404


def test_an_oversized_embeddings_request_is_a_400_and_the_service_stays_up(
    service: Orchestrator,
) -> None:
    """Issue 29: two requests of 2,000 inputs of 16 KB (32 MB each, under max_request_bytes)
    grew a replica to 20 GB until Ray's memory monitor killed the cluster. Now each is a 400
    naming the setting (tokenizing stops at the limit), and the service answers after."""
    text = ("The quick brown fox jumps over the lazy dog. " * 400)[:16_000]
    with service.client() as c:
        for _ in range(2):
            started = time.monotonic()
            r = c.post("/embeddings", json={"model": "all-MiniLM-L6-v2", "input": [text] * 2000})
            assert r.status_code == 400, r.text[:500]
            body = r.json()
            assert body["ok"] is False and body["limit"] == "embedding_max_request_tokens", body
            assert "embedding_max_request_tokens" in body["error"] and body["request_id"]
            assert time.monotonic() - started < 60  # refused early, not after the work
        r = c.post("/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["a"] * 2049})
        assert r.status_code == 400 and r.json()["limit"] == "embedding_max_inputs", r.text
        r = c.post("/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["a cat", text]})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert [len(d["embedding"]) for d in answer["data"]] == [384, 384]
        assert answer["usage"]["prompt_tokens"] == 4 + 256  # the long one read to 256 pieces
        assert c.get("/health").status_code == 200
