"""`events --horizon`: what one horizon read costs (`EventStore.horizon()`, which every
follower read runs first) with 10, 50 and 200 idle connections open and 16 writers appending,
each in a transaction of its own (so the writers' locks are in the lock table).

Two figures per row. Client: the call timed on a connection of its own, alternating with
`SELECT 1` on the same connection (the difference is the horizon's own cost, the round trip
and the machine's load being the same for both). Server: the horizon's SQL function called
100 times in one statement, per call (no round trip, no client scheduling: what Postgres
spends). Postgres runs with max_connections = 300 throughout (the 200 idle connections need
it): what changes between rows is only how many are open.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

from benchmarks._common import Result, format_table, make_workdir, percentile, run_async, say

HORIZON_IDLE = (10, 50, 200)
HORIZON_WRITERS = 16
HORIZON_MAX_CONNECTIONS = 300
HORIZON_USER = "bench"
SERVER_CALLS = 100  # horizon calls per statement, for the server-side figure


async def _one_row(url: str, idle: int, writers: int, duration_s: float) -> dict[str, float | int]:
    import asyncpg

    from orchestrator.db import connect
    from orchestrator.events import EventStore, NewEvent

    held = [await asyncpg.connect(url) for _ in range(idle)]
    for conn in held:  # each backend fully set up, then idle
        await conn.fetchval("SELECT 1")
    db = await connect(url, min_size=writers, max_size=writers, migrate=False)
    reader_db = await connect(url, min_size=1, max_size=1, migrate=False)
    store, reader = EventStore(db.pool), EventStore(reader_db.pool)
    stop = asyncio.Event()
    appended = 0

    async def writer(w: int) -> None:
        nonlocal appended
        i = 0
        while not stop.is_set():
            async with store.transaction() as tx:
                await tx.append(
                    [NewEvent("task.created", {"task_id": f"h-{w}-{i % 50}"}, HORIZON_USER)]
                )
            appended += 1
            i += 1

    tasks = [asyncio.create_task(writer(w)) for w in range(writers)]
    horizon_ns: list[int] = []
    select_ns: list[int] = []
    server_us: list[float] = []
    # The function the reader calls (0024's probe; before it, 0014's scan of pg_locks).
    probing = await reader_db.pool.fetchval(
        "SELECT count(*) > 0 FROM pg_proc WHERE proname = 'events_horizon_from'"
    )
    call = "events_horizon_from(0)" if probing else "events_horizon()"
    server_sql = (
        "SELECT extract(epoch FROM clock_timestamp() - s) * 1e6 / $1 FROM"
        " (SELECT clock_timestamp() AS s) t0,"
        f" LATERAL (SELECT count(h) FROM (SELECT {call} AS h"
        "  FROM generate_series(1, $1) g) q) t1"
    )
    try:
        await asyncio.sleep(0.5)  # the writers are going
        appended0, t0 = appended, time.perf_counter()
        deadline = t0 + duration_s
        while time.perf_counter() < deadline:
            a = time.perf_counter_ns()
            await reader.horizon()
            b = time.perf_counter_ns()
            await reader_db.pool.fetchval("SELECT 1")
            c = time.perf_counter_ns()
            horizon_ns.append(b - a)
            select_ns.append(c - b)
            if len(horizon_ns) % 20 == 0:
                server_us.append(float(await reader_db.pool.fetchval(server_sql, SERVER_CALLS)))
        rate = (appended - appended0) / (time.perf_counter() - t0)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await reader_db.close()
        await db.close()
        for conn in held:
            await conn.close()
    hs = sorted(v / 1e3 for v in horizon_ns)
    ss = sorted(v / 1e3 for v in select_ns)
    server_us.sort()
    return {
        "function": call,
        "idle": idle,
        "writers": writers,
        "calls": len(hs),
        "horizon_p50_us": round(percentile(hs, 50), 1),
        "horizon_p99_us": round(percentile(hs, 99), 1),
        "select1_p50_us": round(percentile(ss, 50), 1),
        "select1_p99_us": round(percentile(ss, 99), 1),
        "server_p50_us": round(percentile(server_us, 50), 1) if server_us else None,
        "server_p99_us": round(percentile(server_us, 99), 1) if server_us else None,
        "appends_per_s": round(rate, 1),
    }


async def _horizon_rows(
    url: str, idle_counts: list[int], writers: int, duration_s: float
) -> list[dict[str, Any]]:
    from orchestrator.db import connect

    db = await connect(url, migrate=True)  # the schema, once
    await db.close()
    rows = []
    for idle in idle_counts:
        say(f"horizon: {idle} idle connections, {writers} writers, {duration_s:g}s")
        rows.append(await _one_row(url, idle, writers, duration_s))
    return rows


def _set_max_connections(url: str, value: int) -> None:
    import asyncpg

    async def alter() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f"ALTER SYSTEM SET max_connections = {int(value)}")
        finally:
            await conn.close()

    run_async(alter)


def horizon(args: argparse.Namespace) -> Result:
    from orchestrator.runtime import EmbeddedPostgres

    idle_counts = list(args.horizon_idle)
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        pg = EmbeddedPostgres(workdir / "horizon")
        stack.callback(pg.stop)
        say(f"starting embedded Postgres in {pg.pgdata}")
        url = pg.start()
        _set_max_connections(url, HORIZON_MAX_CONNECTIONS)
        pg.stop()
        pg.restart()
        rows = run_async(
            lambda: _horizon_rows(url, idle_counts, args.horizon_writers, args.duration)
        )
    table: list[tuple[str, ...]] = [
        (
            "idle conns",
            "writers",
            "horizon p50 us",
            "p99 us",
            "SELECT 1 p50 us",
            "p99 us",
            "server p50 us",
            "p99 us",
            "calls",
            "appends/s",
        )
    ]
    for r in rows:
        table.append(
            (
                str(r["idle"]),
                str(r["writers"]),
                f"{r['horizon_p50_us']:.0f}",
                f"{r['horizon_p99_us']:.0f}",
                f"{r['select1_p50_us']:.0f}",
                f"{r['select1_p99_us']:.0f}",
                f"{r['server_p50_us']:.1f}" if r["server_p50_us"] is not None else "n/a",
                f"{r['server_p99_us']:.1f}" if r["server_p99_us"] is not None else "n/a",
                str(r["calls"]),
                f"{r['appends_per_s']:.0f}",
            )
        )
    data: dict[str, Any] = {
        "horizon_function": rows[0]["function"] if rows else None,
        "horizon_rows": rows,
        "max_connections": HORIZON_MAX_CONNECTIONS,
        "duration_s": args.duration,
    }
    for r in rows:
        data[f"horizon_p50_us_{r['idle']}"] = r["horizon_p50_us"]
        data[f"horizon_p99_us_{r['idle']}"] = r["horizon_p99_us"]
        data[f"horizon_server_p50_us_{r['idle']}"] = r["server_p50_us"]
    text = (
        f"events --horizon: EventStore.horizon() ({data['horizon_function']}) on its own "
        f"connection, alternating with SELECT 1 on it; server: {SERVER_CALLS} calls in one "
        f"statement, per call; {args.horizon_writers} writers appending one event per "
        f"transaction; max_connections {HORIZON_MAX_CONNECTIONS}; {args.duration:g}s per row\n\n"
        f"{format_table(table)}"
    )
    return Result(data, text)


def horizon_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--horizon",
        action="store_true",
        help="only the horizon read's cost with idle connections open and writers appending",
    )
    parser.add_argument(
        "--horizon-idle",
        type=lambda text: [int(p) for p in text.split(",") if p.strip()],
        default=list(HORIZON_IDLE),
        help="idle connections per row, comma separated (default: 10,50,200)",
    )
    parser.add_argument(
        "--horizon-writers",
        type=int,
        default=HORIZON_WRITERS,
        help=f"concurrent appending writers (default {HORIZON_WRITERS})",
    )
