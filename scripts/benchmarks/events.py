"""`events`: the event store's append throughput (embedded Postgres, no HTTP) against plain
autocommit INSERTs on the same disk (each run interleaved with its own baseline in 0.5 s
slices: targets 1 writer >= 0.8x, 8 writers >= 3x), then the SSE delivery latency of
`orchestrator serve` to 100 and 1,000 concurrent `GET /api/v1/sync-events` streams
(`--append-only` skips that part)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from benchmarks._common import (
    BENCH_ENV,
    Result,
    Service,
    benchmark,
    format_table,
    host_busy_pct,
    host_cpu_times,
    make_workdir,
    percentile,
    raise_nofile_limit,
    replicas_argument,
    replicas_argv,
    run_async,
    say,
    start_serve,
)
from benchmarks.horizon import horizon, horizon_arguments

# Every stream comes from this one client address: lift HAProxy's per-source connection cap
# (proxy hardening, default 256), or most of the 1,000 streams are refused at connect.
EVENTS_ENV = {
    **BENCH_ENV,
    "ORCH_SSE_PING_INTERVAL_S": "15",
    "ORCH_PROXY_MAX_CONNS_PER_SOURCE": "4096",
}
EVENTS_USER = "bench"
APPEND_TARGET_EPS = 5_000
# Issue 16: appends against plain single-row INSERT commits (one connection) measured in the
# same run, interleaved in short slices so a shared machine's drift hits both alike.
APPEND_TARGET_RATIO = {"append_eps_1": 0.8, "append_eps_8": 3.0}
APPEND_SLICE_S = 0.5
SSE_TARGET_P99_MS = 100.0  # issue 17: 1,000 subscribers, p99 <= 100 ms ...
SSE_GOAL_P99_MS = 50.0  # ... and the goal beyond it
SSE_TARGET_SUBSCRIBERS = 1_000
SSE_OPEN_CONCURRENCY = 100  # connections being opened at once
SSE_CONNECT_TIMEOUT_S = 120.0
# Streams the ingress cannot take yet wait in its queue, unanswered: when no stream has
# opened for this long, the round goes on with those that did (the rest count as missing).
SSE_STALL_S = 15.0
SSE_DRAIN_TIMEOUT_S = 15.0  # after the last event was sent
# The append runs: (JSON key, label, writers, events per call).
APPEND_RUNS = [
    ("append_eps_1", "1 writer, 1 event/call", 1, 1),
    ("append_eps_8", "8 writers, 1 event/call", 8, 1),
    ("append_eps_1_batch10", "1 writer, 10 events/call", 1, 10),
    ("append_eps_8_batch10", "8 writers, 10 events/call", 8, 10),
    # Not group-committed: each writer appends in a transaction of its own. Bounded by
    # WAL flushes; the old global lock held each transaction's turn until its commit.
    ("append_eps_8_tx", "8 writers, own transactions", 8, 0),
]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("give one or more positive integers, e.g. 100,1000")
    return values


def _events_arguments(parser: argparse.ArgumentParser) -> None:
    replicas_argument(parser)
    parser.add_argument(
        "--subscribers",
        type=_int_list,
        default=[100, SSE_TARGET_SUBSCRIBERS],
        help="SSE connections per round, comma separated (default: 100,1000)",
    )
    parser.add_argument(
        "--sse-events", type=int, default=50, help="events appended per SSE round (default 50)"
    )
    parser.add_argument(
        "--sse-spacing",
        type=float,
        default=0.05,
        help="seconds between those events (default 0.05)",
    )
    parser.add_argument(
        "--sse-client",
        choices=("raw", "httpx"),
        default="raw",
        help="the subscribers' HTTP client: raw (an asyncio.Protocol parsing HTTP/1.1 chunks "
        "and SSE lines in its callbacks, a few microseconds per frame) or httpx (about 100x "
        "that: on 2 cores its parsing, not the service, made most of the latency)",
    )
    parser.add_argument(
        "--append-only",
        action="store_true",
        help="only the append runs (no orchestrator serve, no SSE rounds)",
    )
    horizon_arguments(parser)


@dataclass(frozen=True)
class Rate:
    count: int
    elapsed_s: float
    cpu_s: float  # this process's CPU time over the run

    @property
    def per_s(self) -> float:
        return self.count / self.elapsed_s if self.elapsed_s else 0.0


async def _rate(
    duration_s: float, writers: int, step: Callable[[int, int], Awaitable[int]]
) -> Rate:
    """Run `writers` concurrent loops of `await step(writer, i)` for `duration_s`; count
    what the steps return."""
    count = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    deadline = t0 + duration_s

    async def writer(w: int) -> None:
        nonlocal count
        i = 0
        while time.perf_counter() < deadline:
            # Not `count += await ...`: that reads `count` before the await and so loses the
            # other writers' increments made meanwhile.
            done = await step(w, i)
            count += done
            i += 1

    await asyncio.gather(*(writer(w) for w in range(writers)))
    return Rate(count, time.perf_counter() - t0, time.process_time() - cpu0)


async def _interleaved(
    duration_s: float,
    writers: int,
    step: Callable[[int, int], Awaitable[int]],
    baseline: Callable[[int, int], Awaitable[int]],
) -> tuple[Rate, Rate]:
    """`step` with `writers` loops and `baseline` with one, alternating in APPEND_SLICE_S
    slices for `duration_s` each: (step's rate, baseline's rate)."""
    runs: dict[str, list[Rate]] = {"step": [], "base": []}
    for _ in range(max(1, round(duration_s / APPEND_SLICE_S))):
        runs["base"].append(await _rate(APPEND_SLICE_S, 1, baseline))
        runs["step"].append(await _rate(APPEND_SLICE_S, writers, step))

    def total(rates: list[Rate]) -> Rate:
        return Rate(
            sum(r.count for r in rates),
            sum(r.elapsed_s for r in rates),
            sum(r.cpu_s for r in rates),
        )

    return total(runs["step"]), total(runs["base"])


async def _append_rates(url: str, duration_s: float) -> dict[str, Rate]:
    import asyncpg

    from orchestrator.db import connect
    from orchestrator.events import EventStore, NewEvent

    rates: dict[str, Rate] = {}
    conn = await asyncpg.connect(url)
    db = await connect(url, max_size=16)
    try:
        await conn.execute("CREATE TABLE bench_baseline (id bigserial primary key, v int)")

        async def insert(_w: int, i: int) -> int:
            await conn.execute("INSERT INTO bench_baseline (v) VALUES ($1)", i)
            return 1

        # Before and after the appends: a virtual disk's flush rate drifts (2x was seen).
        say(f"baseline: autocommit single-row INSERTs, one connection, {duration_s:g}s")
        rates["baseline_before"] = await _rate(duration_s, 1, insert)
        store = EventStore(db.pool)

        def appender(batch: int) -> Callable[[int, int], Awaitable[int]]:
            if batch == 0:  # one event in a transaction of the writer's own

                async def in_transaction(w: int, i: int) -> int:
                    async with store.transaction() as tx:
                        await tx.append(
                            [NewEvent("task.created", {"task_id": f"x-{w}-{i % 50}"}, EVENTS_USER)]
                        )
                    return 1

                return in_transaction

            async def append(w: int, i: int) -> int:
                await store.append(
                    [
                        NewEvent(
                            "task.created",
                            {"task_id": f"t-{w}-{(i * batch + j) % 50}"},
                            user_uuid=EVENTS_USER,
                        )
                        for j in range(batch)
                    ]
                )
                return batch

            return append

        await _rate(min(1.0, duration_s / 5), 8, appender(1))  # warm-up: pool, plans
        for key, label, writers, batch in APPEND_RUNS:
            say(f"append: {label}, {duration_s:g}s, interleaved with the baseline")
            rates[key], rates[f"{key}_baseline"] = await _interleaved(
                duration_s, writers, appender(batch), insert
            )
        say(f"baseline again, {duration_s:g}s")
        rates["baseline_after"] = await _rate(duration_s, 1, insert)
    finally:
        await db.close()
        await conn.close()
    return rates


@dataclass(frozen=True)
class SseRound:
    subscribers: int
    events: int
    latencies_ms: list[float]  # sorted, one per (subscriber, event) received
    first_ms: list[float]  # per event: its earliest delivery, sorted
    last_ms: list[float]  # per event: its latest delivery, sorted
    commit_ms: list[float]  # per event: sent_ns to the append's return, sorted
    unconnected: int  # streams never opened (refused, or still queued at the ingress)
    connect_s: float
    window_s: float  # first send to the last delivery (or the drain timeout)
    client_cpu_s: float  # this process's CPU time over that window
    host_busy_pct: float | None  # all CPUs over that window (client + service + rest)

    @property
    def expected(self) -> int:
        return self.subscribers * self.events

    @property
    def missing(self) -> int:
        return self.expected - len(self.latencies_ms)


async def _create_user_token(base_url: str, admin_token: str) -> str:
    import httpx

    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{base_url}/api/v1/tokens",
            json={"user_uuid": EVENTS_USER},
            headers={"Authorization": f"Bearer {admin_token}"},
        )
    if response.status_code != 200:
        raise RuntimeError(f"POST /api/v1/tokens answered {response.status_code}: {response.text}")
    return str(response.json()["token"])


class _SseProtocol(asyncio.Protocol):
    """One `GET` of an SSE stream over HTTP/1.1, parsed in `data_received` (headers, chunked
    transfer coding, lines): no coroutine, task or stream object per read, so 1,000 streams
    cost the client little of the 2 CPUs the service needs. `on_line` gets each line (bytes,
    without its newline); `connected` resolves at the `: connected` comment, `finished` at
    `stop()` or when the connection ends."""

    def __init__(self, request: bytes, on_line: Callable[[bytes], None]) -> None:
        loop = asyncio.get_running_loop()
        self.connected: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._request = request
        self._on_line = on_line
        self._head: bytes | None = b""  # None once the response headers are read
        self._chunked = False
        self._raw = b""  # received, not yet de-chunked
        self._text = b""  # de-chunked, not yet a whole line
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self._head is not None:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data, self._head = self._head[:end], self._head[end + 4 :], None
            status = head.split(b"\r\n", 1)[0]
            if b" 200 " not in status + b" ":
                self._fail(RuntimeError(f"answered {status.decode(errors='replace')}"))
                return
            self._chunked = b"transfer-encoding: chunked" in head.lower()
        if self._chunked:
            self._raw += data
            data = b""
            while True:
                eol = self._raw.find(b"\r\n")
                if eol < 0:
                    break
                size = int(self._raw[:eol].split(b";", 1)[0], 16)
                if len(self._raw) < eol + 2 + size + 2:
                    break
                data += self._raw[eol + 2 : eol + 2 + size]
                self._raw = self._raw[eol + 2 + size + 2 :]
                if size == 0:
                    break
        *lines, self._text = (self._text + data).split(b"\n")
        for line in lines:
            if line == b": connected" and not self.connected.done():
                self.connected.set_result(None)
            self._on_line(line)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection lost: {exc!r}"))

    def _fail(self, exc: Exception) -> None:
        for future in (self.connected, self.finished):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: whoever waits reads it, nobody else must
        if self._transport is not None:
            self._transport.close()

    def stop(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
        if self._transport is not None:
            self._transport.close()


async def _sse_round(
    base_url: str, token: str, store: Any, n: int, k: int, spacing_s: float, client: str = "raw"
) -> SseRound:
    import httpx

    from orchestrator.events import NewEvent

    url = f"{base_url}/api/v1/sync-events"
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    prefix = f"sse-{n}-"  # this round's task ids: frames of other rounds are ignored
    per_event: list[list[int]] = [[] for _ in range(k)]  # delivery latencies, ns
    connected = 0  # streams settled: opened, or refused
    refused: list[str] = []
    broken: list[str] = []  # opened, then failed
    # The measured subscribers: those whose stream opened during the connect phase. Queued
    # streams may open later, when measured ones close and free ingress slots; they are not.
    live: set[asyncio.Task[None]] = set()
    joining = True
    last_open = time.perf_counter()
    all_connected = asyncio.Event()
    opening = asyncio.Semaphore(SSE_OPEN_CONCURRENCY)

    def settled(failure: str | None = None) -> bool:
        """Count a stream as opened (or refused); whether it is one of the measured."""
        nonlocal connected, last_open
        if not joining:
            return False
        if failure is None:
            live.add(asyncio.current_task())  # type: ignore[arg-type]
            last_open = time.perf_counter()
        else:
            refused.append(failure)
        connected += 1
        if connected == n:
            all_connected.set()
        return failure is None

    async def subscriber(http: httpx.AsyncClient) -> None:
        got = 0
        is_connected = False
        try:
            async with contextlib.AsyncExitStack() as opened:
                async with opening:
                    response = await opened.enter_async_context(http.stream("GET", url))
                if response.status_code != 200:
                    await response.aread()
                    raise RuntimeError(f"answered {response.status_code}: {response.text[:200]}")
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        now = time.time_ns()
                        data = json.loads(line[5:]).get("data") or {}
                        task_id = str(data.get("task_id", ""))
                        if task_id.startswith(prefix):
                            per_event[int(task_id[len(prefix) :])].append(now - data["sent_ns"])
                            got += 1
                            if got == k:
                                return
                    elif line == ": connected" and not is_connected:
                        is_connected = True
                        if not settled():
                            return  # opened too late to be measured
            if not is_connected:
                settled("stream ended before `: connected`")
        except (httpx.HTTPError, RuntimeError, ValueError) as exc:
            if not is_connected:
                settled(repr(exc))
            else:
                broken.append(repr(exc))

    parsed = urlsplit(url)
    request = (
        f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "\r\n"
    ).encode()

    async def raw_subscriber(_http: httpx.AsyncClient) -> None:
        got = 0
        protocol: _SseProtocol | None = None

        def on_line(line: bytes) -> None:
            nonlocal got
            if not line.startswith(b"data:"):
                return
            now = time.time_ns()
            data = json.loads(line[5:]).get("data") or {}
            task_id = str(data.get("task_id", ""))
            if task_id.startswith(prefix):
                per_event[int(task_id[len(prefix) :])].append(now - data["sent_ns"])
                got += 1
                if got == k and protocol is not None:
                    protocol.stop()

        def make() -> _SseProtocol:
            nonlocal protocol
            protocol = _SseProtocol(request, on_line)
            return protocol

        loop = asyncio.get_running_loop()
        try:
            async with opening:
                await loop.create_connection(make, parsed.hostname, parsed.port)
                assert protocol is not None
                await protocol.connected
        except (OSError, RuntimeError, ValueError) as exc:
            settled(repr(exc))
            return
        try:
            if settled():
                await protocol.finished
        except (OSError, RuntimeError, ValueError) as exc:
            broken.append(repr(exc))
        finally:
            protocol.stop()

    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    run = raw_subscriber if client == "raw" else subscriber
    async with httpx.AsyncClient(limits=limits, timeout=None, headers=headers) as http:
        say(f"sse: opening {n} streams ({client} client)")
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(run(http)) for _ in range(n)]
        try:
            await _until_connected(all_connected, lambda: connected)
            joining = False
            measured = set(live)
            connect_s = last_open - t0
            unconnected = n - len(measured)
            if unconnected == n:
                raise RuntimeError(f"no stream opened, e.g. {refused[0] if refused else '?'}")
            if unconnected:
                say(
                    f"sse: WARNING: {unconnected} of {n} streams did not open "
                    f"({len(refused)} refused{f', e.g. {refused[0]}' if refused else ''}; "
                    f"the rest unanswered: the ingress holds at most max_ongoing_requests x "
                    f"replicas requests); going on with {n - unconnected}"
                )
            say(f"sse: {n - unconnected} streams connected in {connect_s:.1f}s; appending {k}")
            await asyncio.sleep(0.5)  # the fan-out has registered every client by now
            commit_ns: list[int] = []
            t1, cpu1, host1 = time.perf_counter(), time.process_time(), host_cpu_times()
            for j in range(k):
                sent_ns = time.time_ns()
                await store.append(
                    [
                        NewEvent(
                            "task.created",
                            {"task_id": f"{prefix}{j}", "sent_ns": sent_ns},
                            user_uuid=EVENTS_USER,
                        )
                    ]
                )
                commit_ns.append(time.time_ns() - sent_ns)
                await asyncio.sleep(spacing_s)
            _, late = await asyncio.wait(measured, timeout=SSE_DRAIN_TIMEOUT_S)
            window_s = time.perf_counter() - t1
            cpu_s = time.process_time() - cpu1
            host_pct = host_busy_pct(host1)
            if late:
                say(f"sse: {len(late)} streams still short of {k} events; closing them")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    if broken:
        say(f"sse: {len(broken)} streams broke mid-round, e.g. {broken[0]}")

    def ms(values: list[int]) -> list[float]:
        return sorted(v / 1e6 for v in values)

    return SseRound(
        subscribers=n,
        events=k,
        latencies_ms=ms([v for lat in per_event for v in lat]),
        first_ms=ms([min(lat) for lat in per_event if lat]),
        last_ms=ms([max(lat) for lat in per_event if lat]),
        commit_ms=ms(commit_ns),
        unconnected=unconnected,
        connect_s=connect_s,
        window_s=window_s,
        client_cpu_s=cpu_s,
        host_busy_pct=host_pct,
    )


async def _until_connected(done: asyncio.Event, settled: Callable[[], int]) -> None:
    """Wait for `done`, or until no stream has settled for SSE_STALL_S (or the overall
    SSE_CONNECT_TIMEOUT_S has passed)."""
    start = last_change = time.perf_counter()
    last = settled()
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 1.0)
        now = time.perf_counter()
        if settled() != last:
            last, last_change = settled(), now
        elif now - last_change > SSE_STALL_S or now - start > SSE_CONNECT_TIMEOUT_S:
            return


async def _sse_rounds(service: Service, args: argparse.Namespace) -> list[SseRound]:
    from orchestrator.db import connect
    from orchestrator.events import EventStore

    token = await _create_user_token(service.url, service.admin_token)
    db = await connect(service.database_url, migrate=False)
    try:
        store = EventStore(db.pool)
        rounds = []
        for n in args.subscribers:
            rounds.append(
                await _sse_round(
                    service.url, token, store, n, args.sse_events, args.sse_spacing, args.sse_client
                )
            )
            await asyncio.sleep(1.0)  # let the service drop the closed streams
        return rounds
    finally:
        await db.close()


@benchmark(
    "events",
    "event store append throughput (vs plain INSERT commits) and SSE delivery latency",
    _events_arguments,
    duration_s=5.0,
)
def events(args: argparse.Namespace) -> Result:
    from orchestrator.runtime import EmbeddedPostgres

    if args.horizon:
        return horizon(args)
    if args.sse_events < 1 or args.sse_spacing < 0:
        raise SystemExit("bench: --sse-events must be >= 1 and --sse-spacing >= 0")
    nofile = raise_nofile_limit()
    if nofile < max(args.subscribers) + 100:
        say(f"WARNING: RLIMIT_NOFILE is {nofile}: too few descriptors for the streams")
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        pg = EmbeddedPostgres(workdir / "append")
        stack.callback(pg.stop)
        say(f"starting embedded Postgres in {pg.pgdata}")
        url = pg.start()
        rates = run_async(lambda: _append_rates(url, args.duration))
        pg.stop()
        if args.append_only:
            return _events_result(rates, [], args)

        service = start_serve(stack, workdir, {**os.environ, **EVENTS_ENV}, replicas_argv(args))
        rounds = run_async(lambda: _sse_rounds(service, args))
    return _events_result(rates, rounds, args)


def _events_result(
    rates: dict[str, Rate], rounds: list[SseRound], args: argparse.Namespace
) -> Result:
    before, after = rates["baseline_before"], rates["baseline_after"]
    base = (before.per_s + after.per_s) / 2
    cpus = os.cpu_count() or 1
    data: dict[str, Any] = {
        "baseline_commits_per_s": round(base, 1),
        "baseline_commits_per_s_before": round(before.per_s, 1),
        "baseline_commits_per_s_after": round(after.per_s, 1),
    }
    rows: list[tuple[str, ...]] = [
        ("append (direct to the store)", "events/s", "beside it", "x beside", "client CPU")
    ]
    for label, rate in (("baseline: INSERT autocommit, before", before), ("... after", after)):
        rows.append(
            (
                label,
                f"{rate.per_s:.0f}",
                "",
                f"{rate.per_s / base:.2f}" if base else "n/a",
                f"{rate.cpu_s / rate.elapsed_s:.0%}",
            )
        )
    for key, label, _, _ in APPEND_RUNS:
        rate, beside = rates[key], rates[f"{key}_baseline"].per_s
        data[key] = round(rate.per_s, 1)
        data[f"{key}_vs_baseline"] = round(rate.per_s / beside, 3) if beside else None
        data[f"{key}_baseline_beside"] = round(beside, 1)
        data[f"{key}_client_cpu_pct"] = round(100 * rate.cpu_s / rate.elapsed_s, 1)
        rows.append(
            (
                label,
                f"{rate.per_s:.0f}",
                f"{beside:.0f}",
                f"{rate.per_s / beside:.2f}" if beside else "n/a",
                f"{rate.cpu_s / rate.elapsed_s:.0%}",
            )
        )
    data["append_duration_s"] = args.duration

    sse_rows: list[tuple[str, ...]] = [
        (
            "SSE subscribers",
            "p50 ms",
            "p99 ms",
            "max ms",
            "first p50",
            "last p50",
            "commit p50",
            "received",
            "missing",
            "unopened",
            "connect s",
            "client CPU",
            "host busy",
        )
    ]
    for r in rounds:
        n = r.subscribers
        p50, p99 = percentile(r.latencies_ms, 50), percentile(r.latencies_ms, 99)
        data[f"sse_p50_ms_{n}"] = round(p50, 2)
        data[f"sse_p99_ms_{n}"] = round(p99, 2)
        data[f"sse_max_ms_{n}"] = round(r.latencies_ms[-1], 2) if r.latencies_ms else None
        data[f"sse_first_p50_ms_{n}"] = round(percentile(r.first_ms, 50), 2)
        data[f"sse_last_p50_ms_{n}"] = round(percentile(r.last_ms, 50), 2)
        data[f"sse_commit_p50_ms_{n}"] = round(percentile(r.commit_ms, 50), 2)
        data[f"sse_received_{n}"] = len(r.latencies_ms)
        data[f"sse_expected_{n}"] = r.expected
        data[f"sse_missing_{n}"] = r.missing
        data[f"sse_unconnected_{n}"] = r.unconnected
        data[f"sse_connect_s_{n}"] = round(r.connect_s, 2)
        data[f"sse_window_s_{n}"] = round(r.window_s, 2)
        data[f"sse_client_cpu_s_{n}"] = round(r.client_cpu_s, 2)
        data[f"sse_host_cpu_busy_pct_{n}"] = (
            None if r.host_busy_pct is None else round(r.host_busy_pct, 1)
        )
        sse_rows.append(
            (
                str(n),
                f"{p50:.1f}",
                f"{p99:.1f}",
                f"{r.latencies_ms[-1]:.1f}" if r.latencies_ms else "n/a",
                f"{percentile(r.first_ms, 50):.1f}",
                f"{percentile(r.last_ms, 50):.1f}",
                f"{percentile(r.commit_ms, 50):.1f}",
                f"{len(r.latencies_ms)}/{r.expected}",
                str(r.missing),
                str(r.unconnected),
                f"{r.connect_s:.1f}",
                f"{r.client_cpu_s:.1f}s/{r.window_s:.1f}s",
                "n/a" if r.host_busy_pct is None else f"{r.host_busy_pct:.0f}%",
            )
        )
    data["sse_events"] = args.sse_events
    data["sse_client"] = args.sse_client
    data["sse_spacing_s"] = args.sse_spacing
    data["cpus"] = cpus

    verdicts = []
    for key in ("append_eps_1", "append_eps_8"):
        met = data[key] >= APPEND_TARGET_EPS
        data[f"target_{key}_met"] = met
        verdicts.append(
            f"{key} >= {APPEND_TARGET_EPS} events/s: {'met' if met else 'NOT met'} "
            f"({data[key]:.0f})"
        )
    for key, target in APPEND_TARGET_RATIO.items():
        ratio = data[f"{key}_vs_baseline"] or 0.0
        met = ratio >= target
        data[f"target_{key}_ratio_met"] = met
        verdicts.append(
            f"{key} >= {target:g}x the INSERT commits beside it: "
            f"{'met' if met else 'NOT met'} ({ratio:.2f}x)"
        )
    p99_key = f"sse_p99_ms_{SSE_TARGET_SUBSCRIBERS}"
    if p99_key in data:
        met = (
            data[p99_key] <= SSE_TARGET_P99_MS
            and data[f"sse_missing_{SSE_TARGET_SUBSCRIBERS}"] == 0
        )
        data["target_sse_met"] = met
        data["goal_sse_met"] = met and data[p99_key] <= SSE_GOAL_P99_MS
        verdicts.append(
            f"SSE p99 <= {SSE_TARGET_P99_MS:.0f} ms (goal {SSE_GOAL_P99_MS:.0f} ms) at "
            f"{SSE_TARGET_SUBSCRIBERS} subscribers, none missing: "
            f"{'met' if met else 'NOT met'}{', goal met' if data['goal_sse_met'] else ''} "
            f"({data[p99_key]:.1f} ms)"
        )
    else:
        data["target_sse_met"] = None
        verdicts.append(f"SSE target: not measured (no round of {SSE_TARGET_SUBSCRIBERS})")
    note = (
        f"beside it: plain single-row INSERT commits on one connection, measured in "
        f"{APPEND_SLICE_S:g} s slices alternating with that run's slices (x beside = the "
        f"ratio); the two baseline rows ran alone before and after (x = against their mean). "
        f"SSE: latency = subscriber's receive time - sent_ns stamped just before the append "
        f"(so it includes the commit); first/last p50 = per event, its earliest/latest "
        f"subscriber. The client (one Python process parsing every stream) shares the "
        f"{cpus} CPUs with the service; client CPU = its CPU time over the send+drain "
        f"window; host busy = all CPUs over that window."
    )
    data["note"] = note
    text = (
        f"events: append for {args.duration:g}s each; SSE: {args.sse_events} events "
        f"{args.sse_spacing * 1000:.0f} ms apart per round, user {EVENTS_USER!r}, "
        f"GET /api/v1/sync-events, {args.sse_client} client; {cpus} CPUs\n\n"
        f"{format_table(rows)}\n\n{format_table(sse_rows)}\n\n{note}\n\n" + "\n".join(verdicts)
    )
    if any(r.missing for r in rounds):
        text += "\nWARNING: some events never reached some subscribers (missing column)"
    if any(r.unconnected for r in rounds):
        text += (
            "\nWARNING: some streams never opened (unopened column; their events count as "
            "missing): the ingress holds at most max_ongoing_requests x replicas requests"
        )
    return Result(data, text)
