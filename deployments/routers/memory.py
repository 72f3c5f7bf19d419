"""SPEC part 4, memory: per-agent key-value entries with full-text search. Non-admins see
their own entries and ownerless ones; admins all. 503 on every path when memory is disabled.

Literal paths (`search`, `list`, `reflections`, `clear`) take precedence over keys: an entry
whose key is one of those words is reachable through list and search, not by its own path."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.responses import Response

from deployments.deps import AdminUser, Config, CurrentUser, Db, Idempotent, Memory, Offset
from orchestrator import wire
from orchestrator.config import Settings
from orchestrator.errors import ServiceUnavailable, ValidationFailed
from orchestrator.idempotency import Answer
from orchestrator.memory import REFLECTION_PREFIX, MemoryStore

router = APIRouter(tags=["memory"])

FLOAT32_MAX = 3.4028234663852886e38
# Stored as real (float32): larger magnitudes are a 400, not an overflow in Postgres.
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
MAX_TTL_MS = 10 * 366 * 86_400_000  # expiry times stay far inside bigint
NO_NUL = r"^[^\x00]*$"  # Postgres text cannot hold NUL: refused (400) at the door


def _check_agent_id(value: str, field: str, longest: int) -> str:
    """400 naming the field for an agent id longer than `memory_agent_id_max`."""
    if len(value) > longest:
        message = f"at most {longest} characters (memory_agent_id_max)"
        raise ValidationFailed(
            f"{field}: {message}", extra={"fields": [{"field": field, "message": message}]}
        )
    return value


async def _agent_id(
    settings: Config,
    agent_id: Annotated[
        str,
        Path(
            min_length=1,
            pattern=NO_NUL,
            description="Namespace (`default` by convention); at most memory_agent_id_max "
            "(128) characters",
        ),
    ],
) -> str:
    # The bound is a setting, so it cannot be a static max_length on the path parameter.
    return _check_agent_id(agent_id, "agent_id", settings.memory_agent_id_max)


AgentId = Annotated[str, Depends(_agent_id)]
Key = Annotated[str, Path(min_length=1, max_length=512, pattern=NO_NUL)]


class StoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=512, pattern=NO_NUL)
    value: str = Field(max_length=1_000_000, pattern=NO_NUL)
    ttl: StrictInt | None = Field(
        None, ge=0, le=MAX_TTL_MS, description="ms (at most ten years); 0 or absent: never"
    )
    embedding: list[Finite] | None = Field(None, description="memory_embedding_dim numbers")


class PinBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pinned: bool = True


class VectorQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(None, min_length=1, max_length=100_000, pattern=NO_NUL)
    embedding: list[Finite] | None = None
    limit: int | None = Field(None, ge=1, le=1000, description="memory_search_limit (20)")
    threshold: float | None = Field(
        None, ge=0, le=1, description="Least cosine similarity (memory_vector_threshold)"
    )


class ShareBody(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    # At most memory_agent_id_max characters each (checked by the handler: a setting).
    source: str = Field(alias="from", min_length=1, pattern=NO_NUL)
    target: str = Field(alias="to", min_length=1, pattern=NO_NUL)
    pattern: str = Field(
        "*", min_length=1, max_length=512, pattern=NO_NUL, description="Glob over keys"
    )


def _memory(memory: MemoryStore, settings: Settings) -> MemoryStore:
    if not settings.memory_enabled:
        raise ServiceUnavailable("memory is disabled by configuration (memory_enabled)")
    return memory


@router.get("/memory/stats", response_model=wire.MemoryStats)
async def stats(memory: Memory, settings: Config, db: Db, _: AdminUser) -> wire.MemoryStats:
    """Admin."""
    return wire.MemoryStats(**await _memory(memory, settings).stats(db.pgvector))


@router.post("/memory/decay", response_model=wire.MemoryForgotten)
async def decay(memory: Memory, settings: Config, _: AdminUser) -> wire.MemoryForgotten:
    """Admin: importance halves every `memory_decay_half_life_days` without access;
    unpinned entries under `memory_decay_threshold` (and expired ones) are forgotten."""
    s = settings
    n = await _memory(memory, settings).decay(
        s.memory_decay_half_life_days, s.memory_decay_threshold
    )
    return wire.MemoryForgotten(forgotten=n)


@router.post("/memory/share", response_model=wire.MemoryCopied)
async def share(
    body: ShareBody, memory: Memory, settings: Config, _: AdminUser
) -> wire.MemoryCopied:
    """Admin: copy `from`'s entries whose key matches the glob `pattern` into `to`."""
    _check_agent_id(body.source, "from", settings.memory_agent_id_max)
    _check_agent_id(body.target, "to", settings.memory_agent_id_max)
    return wire.MemoryCopied(
        copied=await _memory(memory, settings).share(body.source, body.target, body.pattern)
    )


@router.post("/memory/{agent_id}/vector-search", response_model=wire.SimilarResults)
async def vector_search(
    agent_id: AgentId, body: VectorQuery, memory: Memory, settings: Config, caller: CurrentUser
) -> wire.SimilarResults:
    """`embedding` (or `text`, embedded by the configured embedder): most similar first, at
    least `threshold` cosine similarity. 503 without pgvector or when the embedder fails; 400
    for `text` with `embedder: none`."""
    memory = _memory(memory, settings)
    if (body.text is None) == (body.embedding is None):
        raise ValidationFailed(
            "give exactly one of text or embedding", extra={"fields": [{"field": "text"}]}
        )
    if not memory.pgvector:
        raise ServiceUnavailable("vector search needs pgvector, which is not available")
    embedding = body.embedding
    if embedding is None:
        if memory.embedder is None:
            raise ValidationFailed(
                "text: no embedder is configured (embedder: none); give an embedding",
                extra={"fields": [{"field": "text"}]},
            )
        embedding = await memory.embed_query(body.text or "", caller.user_uuid)  # 503 if it cannot
    s = settings
    found = await memory.vector_search(
        agent_id,
        embedding,
        caller,
        body.limit or s.memory_search_limit,
        s.memory_vector_threshold if body.threshold is None else body.threshold,
    )
    return wire.SimilarResults(
        results=[
            wire.SimilarEntry(key=e.key, value=e.value, similarity=round(sim, 6))
            for e, sim in found
        ]
    )


@router.post("/memory/{agent_id}/store", response_model=wire.MemoryOk)
async def store(
    agent_id: AgentId,
    body: StoreBody,
    memory: Memory,
    settings: Config,
    caller: CurrentUser,
    once: Idempotent,
) -> wire.MemoryOk | Response:
    """Write (or overwrite your own) entry; a key another user holds in this namespace is
    403 (memory_key_scope "agent", the default). With an
    `Idempotency-Key`, a retry answers the first write again and does not write."""
    memory = _memory(memory, settings)

    async def write(_: Answer) -> wire.MemoryOk:
        # One autocommitted statement, no transaction to record the key in: the answer is
        # recorded just after it (orchestrator/idempotency.py).
        await memory.store(
            agent_id,
            body.key,
            body.value,
            caller,
            ttl_ms=body.ttl or None,
            embedding=body.embedding,
        )
        return wire.MemoryOk()

    return await once.run(write)


@router.get("/memory/{agent_id}/search", response_model=wire.MemoryResults)
async def search(
    agent_id: AgentId,
    memory: Memory,
    settings: Config,
    caller: CurrentUser,
    q: Annotated[str, Query(min_length=1, max_length=1000, pattern=NO_NUL)],
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
) -> wire.MemoryResults:
    """Full-text search (English stemming), best match first."""
    found = await _memory(memory, settings).search(
        agent_id, q, caller, limit or settings.memory_search_limit
    )
    return wire.MemoryResults(results=[wire.MemoryEntry(**e.wire()) for e in found])


@router.get("/memory/{agent_id}/list", response_model=wire.MemoryEntries)
async def list_entries(
    agent_id: AgentId,
    memory: Memory,
    settings: Config,
    caller: CurrentUser,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    offset: Offset = 0,
) -> wire.MemoryEntries:
    found = await _memory(memory, settings).entries(
        agent_id, caller, limit or settings.memory_list_limit, offset
    )
    return wire.MemoryEntries(entries=[wire.MemoryEntry(**e.wire()) for e in found])


@router.get("/memory/{agent_id}/reflections", response_model=wire.Reflections)
async def reflections(
    agent_id: AgentId, memory: Memory, settings: Config, caller: CurrentUser
) -> wire.Reflections:
    """Entries whose key starts with `reflection:`."""
    found = await _memory(memory, settings).entries(
        agent_id, caller, 1000, 0, prefix=REFLECTION_PREFIX
    )
    return wire.Reflections(reflections=[wire.Reflection(key=e.key, value=e.value) for e in found])


@router.delete("/memory/{agent_id}/clear", response_model=wire.MemoryCleared)
async def clear(
    agent_id: AgentId, memory: Memory, settings: Config, caller: CurrentUser
) -> wire.MemoryCleared:
    """Removes the caller's own entries in this namespace (SPEC: owner only); an admin's
    clear also the ownerless ones (with memory_admin_delete: every user's)."""
    return wire.MemoryCleared(cleared=await _memory(memory, settings).clear(agent_id, caller))


# Admins name which owner's entry they mean when several users hold the key (409 otherwise;
# only under memory_key_scope "owner", or duplicates left from before migration 0029).
Owner = Annotated[
    str | None,
    Query(
        alias="user_uuid",
        min_length=1,
        max_length=200,
        pattern=NO_NUL,
        description="Admin only: whose entry, when several users hold the key"
        " (memory_key_scope: owner)",
    ),
]


@router.get("/memory/{agent_id}/{key}", response_model=wire.MemoryEntry)
async def get_entry(
    agent_id: AgentId,
    key: Key,
    memory: Memory,
    settings: Config,
    caller: CurrentUser,
    owner: Owner = None,
) -> wire.MemoryEntry:
    """The caller's own entry, else the ownerless one. 404 missing (or not yours), 410
    expired, 409 for an admin when several users hold the key."""
    return wire.MemoryEntry(
        **(await _memory(memory, settings).get(agent_id, key, caller, owner)).wire()
    )


@router.delete("/memory/{agent_id}/{key}", response_model=wire.MemoryOk)
async def delete_entry(
    agent_id: AgentId,
    key: Key,
    memory: Memory,
    settings: Config,
    caller: CurrentUser,
    owner: Owner = None,
) -> wire.MemoryOk:
    """The owner only (SPEC part 4). 404 missing (or not yours); an ownerless entry: admins
    only; another user's: 403 for an admin unless memory_admin_delete."""
    await _memory(memory, settings).delete(agent_id, key, caller, owner)
    return wire.MemoryOk()


@router.post("/memory/{agent_id}/{key}/pin", response_model=wire.MemoryPinned)
async def pin(
    agent_id: AgentId,
    key: Key,
    memory: Memory,
    settings: Config,
    caller: CurrentUser,
    body: PinBody | None = None,
    owner: Owner = None,
) -> wire.MemoryPinned:
    """Pin or unpin, as delete: the owner only (an ownerless entry: admins; another user's:
    403 for an admin, with memory_admin_delete allowed)."""
    pinned = body.pinned if body is not None else True
    await _memory(memory, settings).pin(agent_id, key, pinned, caller, owner)
    return wire.MemoryPinned(pinned=pinned)
