"""Memory embeddings over HTTP (the app, real Postgres + pgvector): made after the write by the
local ONNX model or a provider's embeddings through the gateway (here OpenAI's `/embeddings`, a
loopback server speaking its wire format; Gemini's in test_embeddings_providers.py), used by
vector search with `text`; failures never fail a store; memory's requests to a provider are
split within the request limits of POST /embeddings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.memory import LocalEmbedder, make_embedder
from orchestrator.memory._embed import EmbeddingLimits
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import Gateway
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.openai_server import OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
EMBED_MODEL = "text-embedding-3-small"


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    return {"Authorization": f"Bearer {made.json()['token']}"}


async def _search(c: httpx.AsyncClient, h: dict[str, str], ns: str, **body: Any) -> Any:
    r = await c.post(f"/memory/{ns}/vector-search", headers=h, json=body)
    assert r.status_code == 200, r.text
    return r.json()["results"]


async def _until_embedded(
    c: httpx.AsyncClient, h: dict[str, str], ns: str, entries: dict[str, str]
) -> None:
    """Embeddings fill in after the store returns: wait until each entry is found by its own
    text (similarity ~1 with any embedder)."""
    deadline = time.monotonic() + 20
    for key, value in entries.items():
        while True:
            found = await _search(c, h, ns, text=value, threshold=0.9, limit=5)
            if key in [x["key"] for x in found]:
                break
            assert time.monotonic() < deadline, f"{key} was not embedded in time"
            await asyncio.sleep(0.1)


async def test_local_embedder_ranks_by_meaning(make_settings: Any) -> None:
    """Out of the box: with the [embed] extra installed the default embedder is the local
    one, so stores are embedded and `text` searches work with no setting given."""
    assert LocalEmbedder.available() is None  # the [test] extra brings [embed]
    settings = make_settings(rate_limit_per_minute=0)
    assert settings.embedder == "local"
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            facts = {
                "pet": "My cat sleeps on the sofa all afternoon.",
                "money": "Quarterly revenue grew by ten percent.",
                "login": "To reset your password, open the account settings page.",
                "trip": "We flew to Lisbon for the summer holidays.",
            }
            for key, value in facts.items():
                r = await c.post(
                    "/memory/sem/store", headers=ann, json={"key": key, "value": value}
                )
                assert r.json() == {"status": "ok"}  # returns before the embedding exists
            await _until_embedded(c, ann, "sem", facts)
            for query, best in [
                ("a kitten napping on the couch", "pet"),
                ("how do I change my login credentials", "login"),
                ("company earnings went up", "money"),
                ("vacation travel to Portugal", "trip"),
            ]:
                found = await _search(c, ann, "sem", text=query, threshold=0, limit=4)
                assert found[0]["key"] == best, (query, found)
                # The close one well above every unrelated one.
                assert len(found) == 1 or found[0]["similarity"] > found[1]["similarity"] + 0.1
            # The default threshold (0.75) keeps only near paraphrases.
            close = await _search(c, ann, "sem", text="My cat sleeps on the sofa all afternoon")
            assert [x["key"] for x in close] == ["pet"]
            assert close[0]["similarity"] > 0.95
            # An overwrite is embedded again (the old vector does not linger).
            await c.post(
                "/memory/sem/store",
                headers=ann,
                json={"key": "pet", "value": "The dog barks at the postman."},
            )
            deadline = time.monotonic() + 20
            while True:
                found = await _search(c, ann, "sem", text="a dog barking", threshold=0, limit=1)
                if found and found[0]["key"] == "pet" and "dog" in found[0]["value"]:
                    break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)


@pytest.fixture
async def embedding_api() -> AsyncIterator[OpenAIFake]:
    async with OpenAIFake(api_key="sk-embed", models=[EMBED_MODEL], embedding_dim=384) as fake:
        yield fake


def _provider_settings(make_settings: Any, fake: OpenAIFake, **kw: Any) -> Any:
    return make_settings(
        rate_limit_per_minute=0,
        embedder=f"provider:{EMBED_MODEL}",
        providers={
            "openai": {"base_url": fake.base_url, "api_key": "sk-embed", "models": [EMBED_MODEL]}
        },
        **kw,
    )


async def test_provider_embedder(make_settings: Any, embedding_api: OpenAIFake) -> None:
    fake = embedding_api
    async with ServedApp(_provider_settings(make_settings, fake)) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            await c.post(
                "/memory/p/store", headers=ann, json={"key": "a", "value": "red apples grow"}
            )
            await c.post(
                "/memory/p/store", headers=ann, json={"key": "b", "value": "blue ocean waves"}
            )
            given = [1.0] + [0.0] * 383
            await c.post(
                "/memory/p/store",
                headers=ann,
                json={"key": "mine", "value": "explicit", "embedding": given},
            )
            await _until_embedded(c, ann, "p", {"a": "red apples grow", "b": "blue ocean waves"})
            calls = [r for r in fake.requests if r.path == "/v1/embeddings"]
            assert calls and calls[0].headers["authorization"] == "Bearer sk-embed"
            sent = [t for r in calls for t in r.json["input"]]
            assert "explicit" not in sent  # a given embedding is kept, not remade
            assert {"red apples grow", "blue ocean waves"} <= set(sent)
            assert all(r.json["model"] == EMBED_MODEL for r in calls)
            found = await _search(c, ann, "p", text="apples red", threshold=0.5)
            assert [x["key"] for x in found] == ["a"]
            found = await _search(c, ann, "p", embedding=given, threshold=0.99)
            assert [x["key"] for x in found] == ["mine"]


async def test_embedder_failures_never_fail_a_store(
    make_settings: Any, embedding_api: OpenAIFake
) -> None:
    fake = embedding_api
    fake.embeddings_status = 500
    # Embedding calls go through the gateway: the failures open the provider's breaker (as
    # chat failures do), so its cooldown is short here for the recovery to be seen.
    settings = _provider_settings(make_settings, fake, breaker_cooldown_s=0.5)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            r = await c.post("/memory/f/store", headers=ann, json={"key": "k", "value": "v"})
            assert r.json() == {"status": "ok"}
            assert (await c.get("/memory/f/k", headers=ann)).json()["value"] == "v"
            r = await c.post("/memory/f/vector-search", headers=ann, json={"text": "v"})
            assert r.status_code == 503 and r.json()["code"] == "service_unavailable", r.text
            # The provider comes back: once its breaker lets a trial through (a search may
            # meet it still open: 503), the pending entry is embedded on a later attempt.
            fake.embeddings_status = 200
            deadline = time.monotonic() + 20
            while (
                await c.post("/memory/f/vector-search", headers=ann, json={"text": "v"})
            ).status_code == 503:
                assert time.monotonic() < deadline, "the breaker never closed"
                await asyncio.sleep(0.1)
            await _until_embedded(c, ann, "f", {"k": "v"})
            # A provider answering with the wrong dimension: a clear 503, the store still ok.
            fake.embedding_dim = 1536
            r = await c.post("/memory/f/store", headers=ann, json={"key": "k2", "value": "w"})
            assert r.json() == {"status": "ok"}
            r = await c.post("/memory/f/vector-search", headers=ann, json={"text": "w"})
            assert r.status_code == 503 and "memory_embedding_dim" in r.json()["error"]


async def test_text_search_without_an_embedder_is_a_400(make_settings: Any) -> None:
    async with ServedApp(make_settings(rate_limit_per_minute=0, embedder="none")) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            r = await c.post("/memory/x/vector-search", headers=ADMIN, json={"text": "hello"})
            assert r.status_code == 400 and "embedder" in r.json()["error"]


async def test_one_bad_entry_never_blocks_the_others(
    make_settings: Any, embedding_api: OpenAIFake
) -> None:
    """An entry the provider cannot embed (here: it answers the wrong dimension for that one
    text) is charged attempts and given up; every other entry is embedded meanwhile."""
    fake = embedding_api
    normal = fake.embed

    def picky(text: str) -> list[float]:
        return [0.1] * 1536 if "poison" in text else normal(text)

    fake.embed = picky
    settings = _provider_settings(make_settings, fake)
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=30) as c:
            ann = await _user(c, "ann")
            await c.post("/memory/b/store", headers=ann, json={"key": "bad", "value": "poison"})
            good = {f"g{i}": f"green apple number {i}" for i in range(3)}
            for key, value in good.items():
                r = await c.post("/memory/b/store", headers=ann, json={"key": key, "value": value})
                assert r.json() == {"status": "ok"}
            await _until_embedded(c, ann, "b", good)
            db = await asyncpg.connect(settings.database_url)
            try:
                deadline = time.monotonic() + 60
                while True:
                    row = await db.fetchrow(
                        "SELECT embed_pending, embed_attempts FROM memory_entries"
                        " WHERE agent_id = 'b' AND key = 'bad'"
                    )
                    if not row["embed_pending"]:
                        break
                    assert time.monotonic() < deadline, dict(row)
                    await asyncio.sleep(0.2)
                assert row["embed_attempts"] == 5  # FILL_MAX_ATTEMPTS, then given up
            finally:
                await db.close()
            assert (await c.get("/memory/b/bad", headers=ann)).json()["value"] == "poison"


async def test_memory_calls_to_a_provider_are_split_within_the_request_limits(
    embedding_api: OpenAIFake,
) -> None:
    """Issue 29: the limits of POST /embeddings bound each request memory sends to a
    provider (the embedder the app makes for `embedder: provider:<model>`, through the real
    gateway); memory's batch is split instead of refused. A text estimated over the token
    limit alone (memory embeds at most EMBED_MAX_CHARS of a value) still goes, alone."""
    fake = embedding_api
    settings = Settings.load(
        environ={},
        admin_token="x" * 32,
        embedding_max_inputs=3,
        embedding_provider_max_request_tokens=60,
        providers={
            "openai": {"base_url": fake.base_url, "api_key": "sk-embed", "models": [EMBED_MODEL]}
        },
    )
    gateway = Gateway(settings, MetricsRecorder("test"))
    try:
        embedder = make_embedder(
            f"provider:{EMBED_MODEL}", gateway, 1, EmbeddingLimits.for_provider(settings)
        )
        assert embedder is not None
        # 8 characters: 2 estimated tokens (UTF-8 bytes / 4); then one of 100 tokens.
        texts = [f"apple {i:02}" for i in range(7)] + ["y" * 400, "pear 01", "pear 02"]
        vectors = await embedder.embed(texts)
    finally:
        await gateway.aclose()
    assert len(vectors) == len(texts) and all(len(v) == 384 for v in vectors)
    sent = [r.json["input"] for r in fake.requests if r.path == "/v1/embeddings"]
    assert [t for request in sent for t in request] == texts  # in order, each once
    assert sent == [texts[0:3], texts[3:6], texts[6:7], texts[7:8], texts[8:10]]
