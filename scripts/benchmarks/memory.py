"""`memory`: vector search over 100,000 entries x 384 dimensions (pgvector HNSW, cosine) in an
embedded Postgres: top-10 latency p50/p99 through `MemoryStore.vector_search` against an exact
scan of the same table (the baseline, same run), recall@10 against exact neighbours computed
with NumPy; then store throughput through `MemoryStore.store`, with an embedding given and
with the local embedder making it (store plus the filler until every entry is embedded),
against plain autocommit INSERTs on the same disk.

The vectors are synthetic but shaped like text embeddings: unit vectors around 1,000 topic
centroids (sentence embeddings cluster by topic; uniform random vectors in 384 dimensions
have no near neighbours and would measure nothing useful). Queries are fresh draws from the
same distribution, not stored points."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
CENTROIDS = 1000
SPREAD = 0.35  # noise around a centroid, per unit vector
LOAD_BATCH = 5000


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entries", type=int, default=100_000, help="default 100000")
    parser.add_argument("--queries", type=int, default=300, help="default 300")
    parser.add_argument("--stores", type=int, default=2000, help="stores per rate (default 2000)")
    parser.add_argument("--ef-search", type=int, default=None, help="memory_hnsw_ef_search")


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
    from orchestrator.runtime import EmbeddedPostgres

    if args.entries < 100 or args.queries < 10 or args.stores < 10:
        raise SystemExit("bench: --entries >= 100, --queries >= 10, --stores >= 10")
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        pg = EmbeddedPostgres(workdir / "pg")
        stack.callback(pg.stop)
        say(f"starting embedded Postgres in {pg.pgdata}")
        url = pg.start()
        data = run_async(lambda: _run(url, args))
    return _result(data, args)


async def _run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from orchestrator.auth import Principal
    from orchestrator.config import Settings
    from orchestrator.db import connect
    from orchestrator.events import EventStore
    from orchestrator.memory import LocalEmbedder, MemoryStore

    ef = args.ef_search or Settings.model_fields["memory_hnsw_ef_search"].default
    db = await connect(url, max_size=8)
    out: dict[str, Any] = {"ef_search": ef}
    try:
        if not db.pgvector:
            raise RuntimeError("pgvector is not available in this Postgres")
        events = EventStore(db.pool)
        store = MemoryStore(db.pool, events, None, DIM, pgvector=True, ef_search=ef)
        await store.prepare()
        rng = np.random.default_rng(7)
        centroids = rng.normal(0, 1, (CENTROIDS, DIM)).astype(np.float32)
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
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

        # Stores: plain INSERTs (baseline), MemoryStore.store with a given embedding, and
        # without one while the local embedder fills embeddings in.
        n = args.stores
        writer = Principal("writer")
        async with db.pool.acquire() as conn:
            await conn.execute("CREATE TABLE bench_baseline (k text PRIMARY KEY, v text)")
            t0 = time.perf_counter()
            for i in range(n):
                await conn.execute("INSERT INTO bench_baseline VALUES ($1, $2)", f"b{i}", "v")
            out["baseline_inserts_per_s"] = round(n / (time.perf_counter() - t0), 1)
        given = _vectors(n, rng, centroids).tolist()
        t0 = time.perf_counter()
        for i in range(n):
            await store.store("w1", f"s{i}", f"value {i}", writer, embedding=given[i])
        out["store_per_s"] = round(n / (time.perf_counter() - t0), 1)
        if LocalEmbedder.available() is None:
            embedder = LocalEmbedder(1)
            await embedder.embed(["warm up"])
            auto = MemoryStore(
                db.pool, events, None, DIM, pgvector=True, embedder=embedder, ef_search=ef
            )
            filler = asyncio.create_task(auto.run_filler())
            t0 = time.perf_counter()
            for i in range(n):
                await auto.store("w2", f"e{i}", f"note {i} about topic {i % 50}", writer)
            stored_s = time.perf_counter() - t0
            while await db.pool.fetchval(  # noqa: ASYNC110 - polling Postgres
                "SELECT count(*) FROM memory_entries WHERE agent_id = 'w2' AND embed_pending"
            ):
                await asyncio.sleep(0.05)
            out["store_embedding_per_s"] = round(n / stored_s, 1)
            out["store_embedded_per_s"] = round(n / (time.perf_counter() - t0), 1)
            filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await filler
        else:
            say("the [embed] extra is not installed: no local-embedder store rate")
    finally:
        await db.close()
    return out


def _result(d: dict[str, Any], args: argparse.Namespace) -> Result:
    d = {"entries": args.entries, "dims": DIM, "queries": args.queries, **d}
    d["speedup_vs_exact"] = round(d["exact_p50_ms"] / max(d["vector_p50_ms"], 1e-6), 1)
    d["store_vs_insert"] = round(d["store_per_s"] / d["baseline_inserts_per_s"], 2)
    d["targets_met"] = d["vector_p50_ms"] <= TARGET_P50_MS and d["recall_at_10"] >= TARGET_RECALL
    rows = [
        ("measure", "value", "target / baseline"),
        ("vector top-10 p50", f"{d['vector_p50_ms']} ms", f"<= {TARGET_P50_MS:g} ms"),
        ("vector top-10 p99", f"{d['vector_p99_ms']} ms", ""),
        ("recall@10 vs exact", f"{d['recall_at_10']}", f">= {TARGET_RECALL}"),
        (
            "exact scan p50 (baseline)",
            f"{d['exact_p50_ms']} ms",
            f"HNSW {d['speedup_vs_exact']}x faster",
        ),
        ("load (COPY) / index build", f"{d['load_s']} s / {d['index_build_s']} s", ""),
        ("INSERT autocommit (baseline)", f"{d['baseline_inserts_per_s']}/s", ""),
        (
            "store, embedding given",
            f"{d['store_per_s']}/s",
            f"{d['store_vs_insert']}x INSERT",
        ),
    ]
    if "store_embedding_per_s" in d:
        rows.append(("store, local embedder", f"{d['store_embedding_per_s']}/s", "returns"))
        rows.append(("... until all embedded", f"{d['store_embedded_per_s']}/s", ""))
    head = (
        f"memory: {d['entries']} entries x {DIM} dims, {d['queries']} queries,"
        f" hnsw.ef_search {d['ef_search']}"
    )
    return Result(d, head + "\n" + format_table(rows))
