"""`memory`: vector search over 100,000 entries x 384 dimensions (pgvector HNSW, cosine) in an
embedded Postgres: top-10 latency p50/p99 through `MemoryStore.vector_search` against an exact
scan of the same table (the baseline, same run), recall@10 against exact neighbours computed
with NumPy; then store throughput through `MemoryStore.store`, as the API does it (the entry,
its events and the Redis cache), against plain single-row autocommit INSERTs on the same
disk measured in the same run (before and after the stores; their mean is the baseline):
with the local embedder filling embeddings behind (the API's usual store: no embedding
given), without an embedder (what the filler costs the store), and with an embedding given
(the HNSW index is written inline). `--store-only` skips the vector-search part.

The vectors are synthetic but shaped like text embeddings: unit vectors around 1,000 topic
centroids (sentence embeddings cluster by topic; uniform random vectors in 384 dimensions
have no near neighbours and would measure nothing useful). Queries are fresh draws from the
same distribution, not stored points."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from typing import Any

from benchmarks._common import (
    Result,
    benchmark,
    format_table,
    make_workdir,
    percentile,
    run_async,
    say,
)

DIM = 384
TARGET_P50_MS = 5.0
TARGET_RECALL = 0.95
TARGET_STORE_VS_INSERT = 0.5
CENTROIDS = 1000
SPREAD = 0.35  # noise around a centroid, per unit vector
LOAD_BATCH = 5000
BLOCK = 50  # stores (or INSERTs) per interleaved block


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entries", type=int, default=100_000, help="default 100000")
    parser.add_argument("--queries", type=int, default=300, help="default 300")
    parser.add_argument("--stores", type=int, default=2000, help="stores per rate (default 2000)")
    parser.add_argument("--ef-search", type=int, default=None, help="memory_hnsw_ef_search")
    parser.add_argument(
        "--store-only", action="store_true", help="only the store throughput (no 100k load)"
    )


def _vectors(n: int, rng: Any, centroids: Any) -> Any:
    import numpy as np

    picks = rng.integers(0, len(centroids), n)
    v = centroids[picks] + rng.normal(0, SPREAD / np.sqrt(DIM), (n, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.astype(np.float32)


@benchmark(
    "memory",
    "vector search p50/p99 and recall@10 over 100k x 384 entries; store throughput",
    _arguments,
)
def memory(args: argparse.Namespace) -> Result:
    from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis

    if args.entries < 100 or args.queries < 10 or args.stores < 10:
        raise SystemExit("bench: --entries >= 100, --queries >= 10, --stores >= 10")
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        pg = EmbeddedPostgres(workdir / "pg")
        stack.callback(pg.stop)
        say(f"starting embedded Postgres in {pg.pgdata}")
        url = pg.start()
        redis = EmbeddedRedis(workdir)
        stack.callback(redis.stop)
        redis_url = redis.start()
        data = run_async(lambda: _run(url, redis_url, args))
    return _result(data, args)


async def _run(url: str, redis_url: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import redis.asyncio as aioredis

    from orchestrator.auth import Principal
    from orchestrator.config import Settings
    from orchestrator.db import connect
    from orchestrator.events import EventStore
    from orchestrator.memory import MemoryStore

    ef = args.ef_search or Settings.model_fields["memory_hnsw_ef_search"].default
    db = await connect(url, max_size=8)
    cache = aioredis.from_url(redis_url)
    out: dict[str, Any] = {"ef_search": ef}
    try:
        if not db.pgvector:
            raise RuntimeError("pgvector is not available in this Postgres")
        events = EventStore(db.pool)
        store = MemoryStore(db.pool, events, cache, DIM, pgvector=True, ef_search=ef)
        await store.prepare()
        rng = np.random.default_rng(7)
        centroids = rng.normal(0, 1, (CENTROIDS, DIM)).astype(np.float32)
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
        if args.store_only:
            out.update(await _stores(db, events, cache, store, args, ef, rng, centroids))
            return out
        data = _vectors(args.entries, rng, centroids)
        queries = _vectors(args.queries, rng, centroids)

        # Load with COPY, then build the HNSW index once (as a restore would).
        say(f"loading {args.entries} entries x {DIM} dims")
        t0 = time.perf_counter()
        async with db.pool.acquire() as conn:
            await conn.execute("DROP INDEX IF EXISTS memory_entries_embedding")
            now = int(time.time() * 1000)
            for start in range(0, args.entries, LOAD_BATCH):
                chunk = data[start : start + LOAD_BATCH]
                await conn.copy_records_to_table(
                    "memory_entries",
                    columns=[
                        "agent_id",
                        "key",
                        "value",
                        "created_at",
                        "updated_at",
                        "accessed_at",
                        "embedding_raw",
                    ],
                    records=[
                        ("bench", f"k{start + i}", f"entry {start + i}", now, now, now, v)
                        for i, v in enumerate(chunk.tolist())
                    ],
                )
            await conn.execute("UPDATE memory_entries SET embedding = embedding_raw::vector")
            out["load_s"] = round(time.perf_counter() - t0, 1)
            say(f"loaded in {out['load_s']}s; building the HNSW index")
            t0 = time.perf_counter()
            await conn.execute("SET maintenance_work_mem = '1GB'")
            await conn.execute(
                "CREATE INDEX memory_entries_embedding ON memory_entries"
                " USING hnsw (embedding vector_cosine_ops)"
            )
            await conn.execute("VACUUM ANALYZE memory_entries")
            out["index_build_s"] = round(time.perf_counter() - t0, 1)
            say(f"index built in {out['index_build_s']}s")

        admin = Principal("bench", is_admin=True)
        exact_ids = np.argsort(-(queries @ data.T), axis=1)[:, :10]

        async def timed(q: Any) -> tuple[float, list[str]]:
            t = time.perf_counter()
            found = await store.vector_search("bench", q.tolist(), admin, 10, 0.0)
            return (time.perf_counter() - t) * 1000, [e.key for e, _ in found]

        for q in queries[:20]:  # warm the index pages and the pool
            await timed(q)
        say(f"{args.queries} HNSW queries (ef_search {ef})")
        lat: list[float] = []
        recall = 0.0
        for qi, q in enumerate(queries):
            ms, keys = await timed(q)
            lat.append(ms)
            truth = {f"k{i}" for i in exact_ids[qi]}
            recall += len(truth & set(keys)) / 10
        lat.sort()
        out["vector_p50_ms"] = round(percentile(lat, 50), 2)
        out["vector_p99_ms"] = round(percentile(lat, 99), 2)
        out["recall_at_10"] = round(recall / len(queries), 4)

        # Baseline: the exact answer from Postgres (no index), on a sample of the queries.
        say("exact-scan baseline")
        exact_lat: list[float] = []
        async with db.pool.acquire() as conn:
            for q in queries[: min(30, len(queries))]:
                t = time.perf_counter()
                async with conn.transaction():
                    await conn.execute("SET LOCAL enable_indexscan = off")
                    await conn.fetch(
                        "SELECT key FROM memory_entries WHERE agent_id = 'bench'"
                        " ORDER BY embedding <=> $1::text::vector LIMIT 10",
                        "[" + ",".join(f"{x:.6f}" for x in q.tolist()) + "]",
                    )
                exact_lat.append((time.perf_counter() - t) * 1000)
        exact_lat.sort()
        out["exact_p50_ms"] = round(percentile(exact_lat, 50), 2)

        out.update(await _stores(db, events, cache, store, args, ef, rng, centroids))
    finally:
        await cache.aclose()
        await db.close()
    return out


async def _stores(
    db: Any,
    events: Any,
    cache: Any,
    store: Any,
    args: argparse.Namespace,
    ef: int,
    rng: Any,
    centroids: Any,
) -> dict[str, Any]:
    """Sequential stores, one caller (each waits for its acknowledgement), against
    sequential single-row INSERT commits on the same pool, interleaved in blocks of BLOCK
    (this machine's load moves a lot within a minute; interleaving shares it out fairly).
    Two phases: without a filler (no embedder; an embedding given), then with the local
    embedder filling behind (its work lands on the baseline's blocks too, as on a server)."""
    from orchestrator.auth import Principal
    from orchestrator.memory import LocalEmbedder, MemoryStore

    n = args.stores
    writer = Principal("writer")
    out: dict[str, Any] = {
        # How a store writes, printed in the head (each checkout of an A/B runs its own copy
        # of this script, so it names its own path): the row and its event in one
        # autocommitted statement.
        "store_impl": "EventWriter.write",
    }
    await db.pool.execute("CREATE TABLE IF NOT EXISTS bench_baseline (k text PRIMARY KEY, v text)")
    spent: dict[str, float] = {}
    counter = iter(range(10**9))

    async def insert() -> None:
        await db.pool.execute(
            "INSERT INTO bench_baseline VALUES ($1, $2)", f"b{next(counter)}", "v"
        )

    def storing(s: Any, ns: str, given: bool = False) -> Any:
        async def one() -> None:
            i = next(counter)
            vector = _vectors(1, rng, centroids)[0].tolist() if given else None
            await s.store(ns, f"s{i}", f"note {i} about topic {i % 50}", writer, embedding=vector)

        return one

    async def rounds(kinds: dict[str, Any]) -> None:
        for op in kinds.values():  # warm statement caches
            for _ in range(10):
                await op()
        for _ in range(max(1, n // BLOCK)):
            for kind, op in kinds.items():
                t0 = time.perf_counter()
                for _ in range(BLOCK):
                    await op()
                spent[kind] = spent.get(kind, 0.0) + time.perf_counter() - t0

    say(f"{n} each: INSERT, store without an embedder, store with an embedding given")
    await rounds(
        {"insert1": insert, "plain": storing(store, "w0"), "given": storing(store, "w1", True)}
    )
    await store.settle()  # writes still in flight, owed cache DELs
    if LocalEmbedder.available() is None:
        embedder = LocalEmbedder(1)
        await embedder.embed(["warm up"])
        auto = MemoryStore(
            db.pool, events, cache, DIM, pgvector=True, embedder=embedder, ef_search=ef
        )
        filler = asyncio.create_task(auto.run_filler())
        say(f"{n} each: INSERT, store with the local embedder filling behind")
        t0 = time.perf_counter()
        await rounds({"insert2": insert, "auto": storing(auto, "w2")})
        while await db.pool.fetchval(  # noqa: ASYNC110 - polling Postgres
            "SELECT count(*) FROM memory_entries WHERE agent_id = 'w2' AND embed_pending"
        ):
            await asyncio.sleep(0.05)
        out["embedded_all_s"] = round(time.perf_counter() - t0, 2)
        filler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await filler
        await auto.settle()
    else:
        say("the [embed] extra is not installed: no filled-behind phase")
    done = max(1, n // BLOCK) * BLOCK
    rate = {k: round(done / v, 1) for k, v in spent.items()}
    out["baseline_inserts_per_s"] = rate["insert1"]
    out["store_plain_per_s"] = rate["plain"]
    out["store_given_per_s"] = rate["given"]
    if "auto" in rate:
        out["baseline2_inserts_per_s"] = rate["insert2"]
        out["store_per_s"] = rate["auto"]
    return out


def _result(d: dict[str, Any], args: argparse.Namespace) -> Result:
    d = {"entries": 0 if args.store_only else args.entries, "dims": DIM, **d}
    base = d["baseline_inserts_per_s"]
    auto = "store_per_s" in d
    # The headline: the API's usual store (no embedding given, the local embedder filling
    # behind) against the INSERTs interleaved with it; without the [embed] extra, the store
    # without an embedder.
    d["store_vs_insert"] = round(
        d["store_per_s"] / d["baseline2_inserts_per_s"] if auto else d["store_plain_per_s"] / base,
        2,
    )
    d["store_plain_vs_insert"] = round(d["store_plain_per_s"] / base, 2)
    d["store_given_vs_insert"] = round(d["store_given_per_s"] / base, 2)
    d["load_avg_1m"] = round(os.getloadavg()[0], 2)
    store_met = d["store_vs_insert"] >= TARGET_STORE_VS_INSERT
    rows = [("measure", "value", "target / baseline")]
    if not args.store_only:
        d["queries"] = args.queries
        d["speedup_vs_exact"] = round(d["exact_p50_ms"] / max(d["vector_p50_ms"], 1e-6), 1)
        rows += [
            ("vector top-10 p50", f"{d['vector_p50_ms']} ms", f"<= {TARGET_P50_MS:g} ms"),
            ("vector top-10 p99", f"{d['vector_p99_ms']} ms", ""),
            ("recall@10 vs exact", f"{d['recall_at_10']}", f">= {TARGET_RECALL}"),
            (
                "exact scan p50 (baseline)",
                f"{d['exact_p50_ms']} ms",
                f"HNSW {d['speedup_vs_exact']}x faster",
            ),
            ("load (COPY) / index build", f"{d['load_s']} s / {d['index_build_s']} s", ""),
        ]
        store_met = (
            store_met and d["vector_p50_ms"] <= TARGET_P50_MS and d["recall_at_10"] >= TARGET_RECALL
        )
    d["targets_met"] = store_met
    rows += [
        ("INSERT autocommit (baseline)", f"{base}/s", "interleaved with the two below"),
        (
            "store (entry+event+cache), no embedder",
            f"{d['store_plain_per_s']}/s",
            f"{d['store_plain_vs_insert']}x INSERT",
        ),
        (
            "store, embedding given (HNSW inline)",
            f"{d['store_given_per_s']}/s",
            f"{d['store_given_vs_insert']}x INSERT",
        ),
    ]
    if auto:
        rows += [
            ("INSERT autocommit (baseline 2)", f"{d['baseline2_inserts_per_s']}/s", "filler on"),
            (
                "store, local embedder filling behind",
                f"{d['store_per_s']}/s",
                f"{d['store_vs_insert']}x INSERT 2 (>= {TARGET_STORE_VS_INSERT})",
            ),
            ("... all embedded after", f"{d['embedded_all_s']} s", "from the phase's start"),
        ]
    head = (
        f"memory: {d['entries']} entries x {DIM} dims, hnsw.ef_search {d['ef_search']},"
        f" {args.stores} sequential stores per rate ({d['store_impl']}),"
        f" load average {d['load_avg_1m']}"
    )
    return Result(d, head + "\n" + format_table(rows))
