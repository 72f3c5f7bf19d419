"""Skill versions in the marketplace store (real Postgres): every publish keeps its version,
`pin` resolves `name`, `name@<version>`, `<author>/name[@<version>]` to one (not counting a
download), refuses unknown and ambiguous references naming them, and a deleted skill's
versions go with it; the migration keeps existing skills' current versions; and the agent
tools `marketplace_search` / `marketplace_read` (a read counts one download)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from orchestrator.agents import AgentTask, ToolContext, ToolFailed
from orchestrator.auth import Principal
from orchestrator.config import Settings
from orchestrator.db import MIGRATIONS_DIR, Database, apply_migrations, connect
from orchestrator.errors import ValidationFailed
from orchestrator.marketplace import MARKETPLACE_TOOLS, Marketplace, PinnedSkill, SkillDraft

ANN, BOB = Principal("ann-1"), Principal("bob@example.com")


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    made = await connect(database_url)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
def market(db: Database) -> Marketplace:
    return Marketplace(db.pool, publish_per_hour=0)


async def publish(market: Marketplace, who: Principal, name: str, body: str) -> int:
    done = await market.publish(SkillDraft(name=name, body=body, description=f"{name} skill"), who)
    return done.skill.version


async def downloads(market: Marketplace, name: str, author: str) -> int:
    page = await market.browse(limit=100)  # browsing counts no download
    return next(s.downloads for s in page.items if s.name == name and s.author == author)


async def test_pin_resolves_versions_and_keeps_old_bodies(market: Marketplace) -> None:
    assert await publish(market, ANN, "pdf", "v1 body") == 1
    first = await market.pin("pdf")
    assert first == PinnedSkill("pdf", ANN.user_uuid, 1, "v1 body")
    assert first.label == f"pdf v1 by {ANN.user_uuid}"
    assert await publish(market, ANN, "pdf", "v2 body") == 2
    assert (await market.pin("pdf@1")).body == "v1 body"
    assert await market.pin("pdf") == PinnedSkill("pdf", ANN.user_uuid, 2, "v2 body")
    assert await market.pin("ann-1/pdf@2") == PinnedSkill("pdf", ANN.user_uuid, 2, "v2 body")
    assert (await market.pin("ann-1/pdf@1")).body == "v1 body"
    assert (await market.pin("ann-1/pdf")).version == 2
    # An author with `@` in their id: the last `@` after the name is the version's.
    await publish(market, BOB, "csv", "bob's csv")
    assert (await market.pin("bob@example.com/csv@1")).author == BOB.user_uuid
    assert (await market.pin("bob@example.com/csv")).body == "bob's csv"
    # Pinning is not reading: no download counted.
    assert await downloads(market, "pdf", ANN.user_uuid) == 0


async def test_pin_refuses_naming_the_reference(market: Marketplace) -> None:
    await publish(market, ANN, "pdf", "ann's")
    await publish(market, ANN, "pdf", "ann's v2")
    await publish(market, BOB, "pdf", "bob's")

    async def refused(ref: str) -> ValidationFailed:
        with pytest.raises(ValidationFailed) as exc:
            await market.pin(ref)
        assert repr(ref) in exc.value.message
        assert exc.value.extra["skill"] == ref
        return exc.value

    assert "no skill named 'nope'" in (await refused("nope")).message
    assert "no skill named 'pdf' by 'carol'" in (await refused("carol/pdf")).message
    missing = await refused("ann-1/pdf@3")
    assert "no version 3" in missing.message and "current one is 2" in missing.message
    ambiguous = await refused("pdf")
    assert ambiguous.extra["authors"] == [ANN.user_uuid, BOB.user_uuid]
    assert ANN.user_uuid in ambiguous.message and BOB.user_uuid in ambiguous.message
    assert (await refused("pdf@1")).extra["authors"] == [ANN.user_uuid, BOB.user_uuid]
    for bad in ("", "pdf@", "pdf@0", "a/b/pdf", "/pdf", "a\x00/pdf", "pdf\x01"):
        assert "not a skill reference" in (await refused(bad)).message
    # Names are as clients send them (issue 33): these are references to no skill.
    for unknown in ("PDF", "pdf@x", "pdf 1"):
        assert "no skill named" in (await refused(unknown)).message


async def test_versions_go_with_their_skill(market: Marketplace, db: Database) -> None:
    await publish(market, ANN, "pdf", "one")
    await publish(market, ANN, "pdf", "two")
    rows = await db.pool.fetch("SELECT version, body FROM skill_versions ORDER BY version")
    assert [(r["version"], r["body"]) for r in rows] == [(1, "one"), (2, "two")]
    await market.delete("pdf", ANN)
    assert await db.pool.fetchval("SELECT count(*) FROM skill_versions") == 0
    with pytest.raises(ValidationFailed):
        await market.pin("pdf@1")
    # Published again: a new skill, from version 1.
    await publish(market, ANN, "pdf", "fresh")
    assert await market.pin("pdf") == PinnedSkill("pdf", ANN.user_uuid, 1, "fresh")


async def test_the_migration_keeps_existing_skills_current_versions(
    empty_database_url: str, tmp_path: Path
) -> None:
    before = tmp_path / "before"
    before.mkdir()
    for path in MIGRATIONS_DIR.glob("*.sql"):
        if int(path.name[:4]) < 23:
            shutil.copy(path, before / path.name)
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply_migrations(conn, before)
        await conn.execute(
            "INSERT INTO skills (name, author, description, body, version, created_at,"
            " updated_at) VALUES ('old', 'ann', 'd', 'third body', 3, 1, 2)"
        )
        assert "0023_skill_versions.sql" in await apply_migrations(conn)
        row = await conn.fetchrow(
            "SELECT version, body, description, published_at FROM skill_versions"
        )
        assert dict(row) == {
            "version": 3,
            "body": "third body",
            "description": "d",
            "published_at": 2,
        }
    finally:
        await conn.close()


# --- the agent tools ----------------------------------------------------------------------------


def tool_context(services: dict[str, Any]) -> ToolContext:
    task = AgentTask(task_id="t-1", user_uuid="carol", prompt="p")
    return ToolContext(task, Settings.model_construct(), services)


TOOLS = {t.name: t for t in MARKETPLACE_TOOLS}


async def call(tool: str, ctx: ToolContext, args: dict[str, Any]) -> Any:
    """The tool's answer, parsed: always a plain string of JSON."""
    answer = await TOOLS[tool].handler(ctx, args)
    assert isinstance(answer, str)
    return json.loads(answer)


async def test_search_finds_a_published_skill(market: Marketplace) -> None:
    assert {t.source for t in MARKETPLACE_TOOLS} == {"marketplace"}
    await publish(market, ANN, "zebra-parser", "parse zebras")
    await publish(market, ANN, "other", "unrelated")
    await publish(market, ANN, "zebra-parser", "parse zebras, v2")
    ctx = tool_context({"marketplace": market})
    found = await call("marketplace_search", ctx, {"query": "zebra"})
    assert found == [
        {
            "name": "zebra-parser",
            "author": ANN.user_uuid,
            "description": "zebra-parser skill",
            "version": 2,
            "downloads": 0,
        }
    ]
    capped = await call("marketplace_search", ctx, {"query": "skill", "limit": 1000})
    assert len(capped) == 2  # the limit is capped at 20, not refused
    with pytest.raises(ToolFailed, match="query"):
        await TOOLS["marketplace_search"].handler(ctx, {"query": ""})
    with pytest.raises(ToolFailed, match="limit"):
        await TOOLS["marketplace_search"].handler(ctx, {"query": "x", "limit": "5"})


async def test_read_returns_the_body_and_counts_one_download(market: Marketplace) -> None:
    await publish(market, ANN, "pdf", "read PDFs")
    await publish(market, BOB, "pdf", "bob's PDFs")
    ctx = tool_context({"marketplace": market})
    read = TOOLS["marketplace_read"].handler
    got = await call("marketplace_read", ctx, {"name": "pdf", "author": ANN.user_uuid})
    assert got == {
        "name": "pdf",
        "author": ANN.user_uuid,
        "version": 1,
        "description": "pdf skill",
        "body": "read PDFs",
    }
    assert await downloads(market, "pdf", ANN.user_uuid) == 1
    assert await downloads(market, "pdf", BOB.user_uuid) == 0
    with pytest.raises(ToolFailed, match="several authors") as exc:
        await read(ctx, {"name": "pdf"})
    assert ANN.user_uuid in str(exc.value) and BOB.user_uuid in str(exc.value)
    with pytest.raises(ToolFailed, match="not found"):
        await read(ctx, {"name": "nope"})
    assert await downloads(market, "pdf", ANN.user_uuid) == 1


async def test_the_tools_say_when_no_marketplace_is_there() -> None:
    for tool in MARKETPLACE_TOOLS:
        with pytest.raises(ToolFailed, match="the marketplace is not available here"):
            await tool.handler(tool_context({}), {"query": "x", "name": "x"})
