"""Embeddings of memory entries, filled behind the stores.

A store without an `embedding` marks its row `embed_pending` and returns; the filler embeds
pending rows in batches, off the stores' path, and writes each vector back only where the
row is unchanged since it was read (`updated_at`), so a store meanwhile wins. It yields the
CPU to the stores (issue 17): an embedding and its HNSW insert cost more than the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

import asyncpg

from orchestrator.errors import ServiceUnavailable
from orchestrator.memory._embed import Embedder, EmbedderUnavailable
from orchestrator.runtime.backoff import Backoff

log = logging.getLogger(__name__)

__all__ = ["EmbeddingFiller"]

FILL_BATCH = 32
FILL_POLL_S = 1.0  # entries another process stored (agent workers) are found this fast
# After a wake-up the filler waits this long for more stores: one embedding call (and one
# SELECT, one UPDATE) for a burst instead of one per store, which costs the stores far less
# CPU; an entry is findable by vector this much later (by key and text at once).
FILL_LINGER_S = 0.2
# The filler yields to the stores: it fills once this process has stored nothing for
# FILL_QUIET_S, or once an entry has waited FILL_MAX_WAIT_S (then it keeps filling until it
# has caught up, so a steady stream of stores cannot starve it). An embedding and its HNSW
# insert cost more CPU than the store itself (on two cores, filling alongside held the
# stores to 0.31-0.41x a plain INSERT; issue 17).
FILL_QUIET_S = 0.02
FILL_MAX_WAIT_S = 2.0
FILL_MAX_ATTEMPTS = 5
# The embedder or the database failing: 2 s after a first failure, doubling to 30 s.
FILL_BACKOFF = Backoff(base=2 * FILL_POLL_S, cap=30.0)
PROBE_TEXT = "hello"
EMBED_MAX_CHARS = 8000  # longer values are embedded by their start (models cap their input)
FLOAT32_MAX = 3.4028234663852886e38


class EmbeddingFiller:
    """The embedder's side of a `MemoryStore`: query embeddings, and the filler."""

    def __init__(
        self, pool: asyncpg.Pool, dim: int, pgvector: bool, embedder: Embedder | None
    ) -> None:
        self._pool = pool
        self._dim = dim
        self._pgvector = pgvector
        self.embedder = embedder
        self._fill_wake = asyncio.Event()
        self._last_store = 0.0  # monotonic time of this process's last store to embed
        self._unfilled_since: float | None = None  # of the oldest such store not yet filled

    def stored(self) -> None:
        """A store of this process left its entry to embed: wake the filler."""
        self._last_store = time.monotonic()
        if self._unfilled_since is None:
            self._unfilled_since = self._last_store
        self._fill_wake.set()

    async def embed_query(self, text: str, user: str | None = None) -> list[float]:
        """The embedding of a search text for `user` (whose turn it waits for among the
        tenants on a local embedder); 503 when no embedder can make one."""
        if self.embedder is None:
            raise ServiceUnavailable(
                "text: no embedder is configured (embedder: none); give an embedding"
            )
        [vector] = await self._embed_checked([text[:EMBED_MAX_CHARS]], user=user)
        return vector

    async def fill_embeddings(self, batch: int = FILL_BATCH) -> int:
        """Embed up to `batch` pending entries, oldest first; how many were embedded.

        No transaction is held while the embedder works (a provider call can take long):
        the rows are read, embedded, and written back only where they are unchanged since
        (`updated_at`), so a store meanwhile wins. When a batch fails, its entries are tried
        one at a time: if some succeed, the embedder works and each failing entry is
        charged an attempt (given up after FILL_MAX_ATTEMPTS), so one bad entry never blocks
        the others; if none succeeds and a known-good text fails too, the embedder is down:
        EmbedderUnavailable, nothing is charged, and the filler backs off."""
        if self.embedder is None:
            return 0
        rows = await self._pool.fetch(
            "SELECT agent_id, owner, key, value, updated_at FROM memory_entries WHERE embed_pending"
            " ORDER BY updated_at LIMIT $1",
            batch,
        )
        if not rows:
            return 0
        texts = [r["value"][:EMBED_MAX_CHARS] for r in rows]
        try:
            vectors: list[list[float] | None] = list(await self._embed_checked(texts, behind=True))
        except EmbedderUnavailable as batch_error:
            vectors = [None] * len(texts)
            if len(texts) > 1:
                for i, text in enumerate(texts):
                    with contextlib.suppress(EmbedderUnavailable):
                        [vectors[i]] = await self._embed_checked([text], behind=True)
            if all(v is None for v in vectors):
                # Nothing worked: the embedder is down, unless a known-good text embeds.
                try:
                    await self._embed_checked([PROBE_TEXT], behind=True)
                except EmbedderUnavailable:
                    raise batch_error from None
        done = [(r, v) for r, v in zip(rows, vectors, strict=True) if v is not None]
        failed = [r for r, v in zip(rows, vectors, strict=True) if v is None]
        if failed:
            await self._pool.execute(
                "UPDATE memory_entries m SET embed_attempts = embed_attempts + 1,"
                " embed_pending = embed_attempts + 1 < $4"
                " FROM unnest($1::text[], $2::text[], $3::bigint[], $5::text[])"
                " AS f(agent_id, key, at, owner) WHERE m.agent_id = f.agent_id"
                " AND m.owner = f.owner AND m.key = f.key AND m.updated_at = f.at",
                [r["agent_id"] for r in failed],
                [r["key"] for r in failed],
                [r["updated_at"] for r in failed],
                FILL_MAX_ATTEMPTS,
                [r["owner"] for r in failed],
            )
            log.warning("memory embeddings: %d entries could not be embedded", len(failed))
        if done:
            vector_set = ", embedding = v.raw::vector" if self._pgvector else ""
            # The vectors go as one flat real[] in asyncpg's binary encoding, each row taking
            # its slice: formatting them as text cost the event loop ~5 ms a batch (issue 17:
            # the stores' CPU while the filler ran).
            await self._pool.execute(
                "UPDATE memory_entries m SET embedding_raw = v.raw, embed_pending = false"
                f"{vector_set} FROM (SELECT u.agent_id, u.key, u.at, u.owner,"
                " ($4::real[])[(u.i - 1) * $6 + 1 : u.i * $6] AS raw"
                " FROM unnest($1::text[], $2::text[], $3::bigint[], $5::text[])"
                " WITH ORDINALITY AS u(agent_id, key, at, owner, i)) AS v"
                " WHERE m.agent_id = v.agent_id AND m.owner = v.owner AND m.key = v.key"
                " AND m.updated_at = v.at AND m.embed_pending",
                [r["agent_id"] for r, _ in done],
                [r["key"] for r, _ in done],
                [r["updated_at"] for r, _ in done],
                [x for _, v in done for x in v],
                [r["owner"] for r, _ in done],
                self._dim,
            )
        return len(done)

    async def _embed_checked(
        self, texts: list[str], *, behind: bool = False, user: str | None = None
    ) -> list[list[float]]:
        """Embeddings of the right dimension and finite float32 values, or EmbedderUnavailable.
        `behind`: for the filler (the embedder may give its CPU to the stores first)."""
        assert self.embedder is not None
        if user is None:
            vectors = await self.embedder.embed(texts, behind=behind)
        else:  # only then: embedders made before `user` (tests' own) need not take it
            vectors = await self.embedder.embed(texts, behind=behind, user=user)
        if len(vectors) != len(texts):
            raise EmbedderUnavailable(f"{self.embedder.name}: {len(vectors)} for {len(texts)}")
        for vector in vectors:
            if len(vector) != self._dim:
                raise EmbedderUnavailable(
                    f"{self.embedder.name} makes {len(vector)}-dimension embeddings; this"
                    f" service uses {self._dim} (memory_embedding_dim)"
                )
            if not all(math.isfinite(x) and abs(x) <= FLOAT32_MAX for x in vector):
                raise EmbedderUnavailable(f"{self.embedder.name} returned a non-finite value")
        return vectors

    async def run_filler(self) -> None:
        """Embed pending entries until cancelled: within FILL_LINGER_S for this store's
        writes (in batches), within FILL_POLL_S for other processes', backing off while the
        embedder fails."""
        failures = 0
        while True:
            await self._until_quiet()
            # Cleared before the batch is read: a store from here on wakes the next round.
            self._fill_wake.clear()
            try:
                started = time.monotonic()
                filled = await self.fill_embeddings()
                if filled < FILL_BATCH:
                    # Caught up with what was stored before this batch was read; a store
                    # since is the oldest unfilled one now (counted from `started`).
                    self._unfilled_since = None if self._last_store <= started else started
                failures = 0
            except EmbedderUnavailable as exc:
                log.warning("memory embeddings: %s", exc.message)
                filled = 0
                failures += 1
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("memory embeddings: database trouble (%r)", exc)
                filled = 0
                failures += 1
            backoff = FILL_BACKOFF.delay(failures) if failures else FILL_POLL_S
            if filled >= FILL_BATCH:
                continue  # a full batch: likely more waiting
            if not self._fill_wake.is_set():
                try:
                    await asyncio.wait_for(self._fill_wake.wait(), backoff)
                except TimeoutError:
                    continue
            await asyncio.sleep(FILL_LINGER_S)

    async def _until_quiet(self) -> None:
        """Wait while this process's stores keep coming (FILL_QUIET_S between them), but not
        past FILL_MAX_WAIT_S after the oldest unfilled one."""
        while True:
            now = time.monotonic()
            quiet_at = self._last_store + FILL_QUIET_S
            since = self._unfilled_since
            due_at = quiet_at if since is None else min(quiet_at, since + FILL_MAX_WAIT_S)
            if now >= due_at:
                return
            await asyncio.sleep(due_at - now)
