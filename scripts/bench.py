#!/usr/bin/env python3
"""Benchmarks of the service, one subcommand each.

    python scripts/bench.py ingress [--json] [--duration S] [--concurrency C]
    python scripts/bench.py events [--json] [--duration S] [--subscribers 100,1000]

`ingress` starts `orchestrator serve` (Ray Serve, HAProxy unless --no-haproxy) and, next to
it, plain uvicorn serving the same FastAPI app against the same Postgres and Redis; then it
loads both with the same generator on the same authenticated route and compares them.

`events` measures the event store's append throughput directly (embedded Postgres, no
HTTP) against plain autocommit INSERTs on the same disk, then the SSE delivery latency of
`orchestrator serve` to 100 and 1,000 concurrent `GET /api/v1/sync-events` streams.

Progress goes to stderr; the result table (or, with --json, exactly one JSON object) goes to
stdout. To add a benchmark, write a function `(args) -> Result` and register it with
`@benchmark(...)`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.config import Settings

T = TypeVar("T")

DEFAULT_REPLICAS = Settings.model_fields["api_replicas"].default

READY_LINE = "Orchestrator ready at "
SERVE_START_TIMEOUT_S = 180.0
UVICORN_START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
WARMUP_S = 3.0
ROUTE = "/api/v1/whoami"
# Both targets run with the per-token rate limit off: 600/min would throttle the load test.
BENCH_ENV = {"ORCH_RATE_LIMIT_PER_MINUTE": "0"}


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """A benchmark's outcome: the JSON object (`--json`) and its human rendering."""

    data: dict[str, Any]
    text: str


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    run: Callable[[argparse.Namespace], Result]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    duration_s: float = 10.0  # --duration when not given


BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(
    name: str,
    help: str,
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda _: None,
    duration_s: float = 10.0,
) -> Callable[[Callable[[argparse.Namespace], Result]], Callable[[argparse.Namespace], Result]]:
    def register(
        fn: Callable[[argparse.Namespace], Result],
    ) -> Callable[[argparse.Namespace], Result]:
        BENCHMARKS[name] = Benchmark(name, help, fn, add_arguments, duration_s)
        return fn

    return register


# --- child processes -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Child:
    """A subprocess in its own session, its output in a log file; stopped with SIGTERM."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        say(f"starting {self.name}: {' '.join(self.argv)}  (log: {self.log_path})")
        with open(self.log_path, "wb") as log:
            # Own session: a Ctrl-C in the terminal reaches only us, and we stop the children
            # in order; the process group is also what a last-resort kill takes down.
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
            say(f"{self.name} stopped in {time.monotonic() - t0:.1f}s (exit {proc.returncode})")
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            say(f"{self.name} did not stop in {timeout_s:.0f}s: killing its process group")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_for_line(child: Child, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for line in child.log_path.read_text(errors="replace").splitlines():
                if needle in line:
                    return line
        if child.exited() is not None:
            raise RuntimeError(
                f"{child.name} exited with {child.exited()} before it was ready:\n"
                f"{child.log_tail()}"
            )
        time.sleep(0.25)
    raise RuntimeError(f"{child.name} not ready after {timeout_s:.0f}s:\n{child.log_tail()}")


# `orchestrator serve` says which proxy it configured, and may fall back (and restart) with
# the standard one: the last of these lines before "ready" tells which proxy is measured.
PROXY_MARKERS = {
    "throughput-optimized Serve with HAProxy": "haproxy",
    "using the standard Serve proxy": "standard",
    "falling back to the standard proxy": "standard",
}


def serve_proxy(log_text: str) -> str:
    found = "unknown"
    for line in log_text.splitlines():
        if READY_LINE in line:
            break
        for marker, proxy in PROXY_MARKERS.items():
            if marker in line:
                found = proxy
    return found


def wait_for_http(child: Child, url: str, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if child.exited() is not None:
            raise RuntimeError(f"{child.name} exited with {child.exited()}:\n{child.log_tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(
        f"{child.name} not ready at {url} after {timeout_s:.0f}s ({last!r}):\n{child.log_tail()}"
    )


def make_workdir(stack: contextlib.ExitStack, keep: bool) -> Path:
    """A temp dir for data and logs, removed when `stack` closes (after the children, whose
    stops were registered later) unless `keep`."""
    workdir = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    if keep:
        say(f"keeping {workdir}")
    else:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
    return workdir


@dataclass(frozen=True)
class Service:
    """A running `orchestrator serve` and what its data dir says about it."""

    child: Child
    data_dir: Path
    url: str  # base URL, no trailing slash
    database_url: str
    redis_url: str
    admin_token: str
    proxy: str


def start_serve(
    stack: contextlib.ExitStack,
    workdir: Path,
    env: dict[str, str],
    extra_argv: list[str] | None = None,
) -> Service:
    """Start `orchestrator serve` on a free port with `<workdir>/data`, wait for its ready
    line; `stack` stops it."""
    data_dir = workdir / "data"
    data_dir.mkdir()
    # `orchestrator serve`, run by this interpreter so the venv need not be on PATH.
    argv = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(free_port()),
        *(extra_argv or []),
    ]
    serve = Child("orchestrator serve", argv, workdir / "serve.log", env)
    stack.callback(serve.stop)
    t0 = time.monotonic()
    serve.start()
    wait_for_line(serve, READY_LINE, SERVE_START_TIMEOUT_S)
    proxy = serve_proxy(serve.log_path.read_text(errors="replace"))
    say(f"serve ready in {time.monotonic() - t0:.1f}s (proxy: {proxy})")
    runtime = json.loads((data_dir / "runtime.json").read_text())
    return Service(
        child=serve,
        data_dir=data_dir,
        url=runtime["url"].rstrip("/"),
        database_url=runtime["database_url"],
        redis_url=runtime["redis_url"],
        admin_token=(data_dir / "admin_token").read_text().strip(),
        proxy=proxy,
    )


def uvicorn_app() -> Any:
    """Factory for `uvicorn --factory bench:uvicorn_app`: the service's own FastAPI app, set up
    from the ORCH_* environment the bench gives the child (runs in the child, never here)."""
    from deployments.api import create_app
    from orchestrator.config import Settings

    return create_app(Settings.load())


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells (the first a header) as aligned text: first column left, others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


# --- load generators -----------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What one generator measured against one target."""

    requests: int
    errors: int
    duration_s: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return (self.requests - self.errors) / self.duration_s if self.duration_s else 0.0


# The token reaches wrk through its environment, not the script file (no secret on disk).
WRK_SCRIPT = """\
wrk.method = "GET"
wrk.headers["Authorization"] = os.getenv("BENCH_AUTHORIZATION")

-- One JSON line for the bench to read (microseconds), after wrk's own --latency report.
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "errors": %d, "non2xx": %d, '
    .. '"p50_us": %.1f, "p99_us": %.1f}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout,
    e.status, latency:percentile(50), latency:percentile(99)))
end
"""


def run_wrk(url: str, token: str, concurrency: int, duration_s: float, workdir: Path) -> Load:
    script = workdir / "bench.lua"
    if not script.exists():
        script.write_text(WRK_SCRIPT)
    threads = max(1, min(concurrency, os.cpu_count() or 1))
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(script),
        url,
    ]
    env = {**os.environ, "BENCH_AUTHORIZATION": f"Bearer {token}"}
    out = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=env, timeout=duration_s + 60
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    with open(workdir / "wrk.log", "a") as log:
        log.write(f"$ {' '.join(argv)}\n{out.stdout}\n")
    data = json.loads(line.removeprefix("BENCH_JSON "))
    return Load(
        requests=data["requests"],
        errors=data["errors"] + data["non2xx"],
        duration_s=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (as wrk reports), q in 0..100."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


async def _httpx_load(url: str, token: str, concurrency: int, duration_s: float) -> Load:
    import httpx

    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {token}"}
    start = time.perf_counter()
    deadline = start + duration_s

    async def worker() -> None:
        # One client (one keep-alive connection) per worker, like a wrk connection: a single
        # shared pool of C connections measured 2x slower at C=16 (pool contention in httpcore).
        nonlocal errors
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits, headers=headers, timeout=10.0) as http:
            while (t0 := time.perf_counter()) < deadline:
                try:
                    response = await http.get(url)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - t0)
                errors += not ok

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return Load(
        requests=len(latencies),
        errors=errors,
        duration_s=elapsed,
        p50_ms=percentile(latencies, 50) * 1000,
        p99_ms=percentile(latencies, 99) * 1000,
    )


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` on uvloop when installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def run_httpx(url: str, token: str, concurrency: int, duration_s: float, workdir: Path) -> Load:
    return run_async(lambda: _httpx_load(url, token, concurrency, duration_s))


GENERATORS: dict[str, Callable[[str, str, int, float, Path], Load]] = {
    "wrk": run_wrk,
    "httpx": run_httpx,
}


def pick_generator(wanted: str) -> str:
    if wanted == "auto":
        return "wrk" if shutil.which("wrk") else "httpx"
    if wanted == "wrk" and not shutil.which("wrk"):
        raise SystemExit(
            "bench: wrk is not on PATH (apt-get install wrk), or use --generator httpx"
        )
    return wanted


# --- ingress: Serve vs plain uvicorn -------------------------------------------------------


def _replicas_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help=f"Serve replicas of the API (default: the service's api_replicas{note})",
    )


def _replicas_argv(args: argparse.Namespace) -> list[str]:
    return [] if args.replicas is None else ["--replicas", str(args.replicas)]


def _ingress_arguments(parser: argparse.ArgumentParser) -> None:
    _replicas_argument(parser, "; uvicorn always runs one process")
    parser.add_argument(
        "--no-haproxy", action="store_true", help="use the standard Serve proxy instead of HAProxy"
    )


@benchmark(
    "ingress", "Ray Serve ingress vs plain uvicorn on GET /api/v1/whoami", _ingress_arguments
)
def ingress(args: argparse.Namespace) -> Result:
    generator = pick_generator(args.generator)
    load = GENERATORS[generator]
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        env = {**os.environ, **BENCH_ENV}
        extra = _replicas_argv(args)
        if args.no_haproxy:
            extra.append("--no-haproxy")
        service = start_serve(stack, workdir, env, extra)
        proxy, token = service.proxy, service.admin_token
        serve_url = service.url + ROUTE

        uvicorn_port = free_port()
        uvicorn_env = {
            **env,
            "ORCH_DATABASE_URL": service.database_url,
            "ORCH_REDIS_URL": service.redis_url,
            "ORCH_DATA_DIR": str(service.data_dir),
            "ORCH_PORT": str(uvicorn_port),
        }
        uvicorn = Child(
            "uvicorn",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "bench:uvicorn_app",
                "--app-dir",
                str(Path(__file__).resolve().parent),
                "--host",
                "127.0.0.1",
                "--port",
                str(uvicorn_port),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            workdir / "uvicorn.log",
            uvicorn_env,
        )
        stack.callback(uvicorn.stop)
        uvicorn.start()
        wait_for_http(
            uvicorn, f"http://127.0.0.1:{uvicorn_port}/api/v1/ready", UVICORN_START_TIMEOUT_S
        )
        uvicorn_url = f"http://127.0.0.1:{uvicorn_port}{ROUTE}"

        targets = {"serve": serve_url, "uvicorn": uvicorn_url}
        for name, url in targets.items():
            _check_route(name, url, token)
            say(f"warming up {name} ({WARMUP_S:.0f}s)")
            load(url, token, args.concurrency, WARMUP_S, workdir)
        results: dict[str, Load] = {}
        for name, url in targets.items():
            say(
                f"loading {name} with {generator}: {args.concurrency} connections, "
                f"{args.duration:g}s"
            )
            results[name] = load(url, token, args.concurrency, args.duration, workdir)
    return _ingress_result(results, generator, proxy, args)


def _check_route(name: str, url: str, token: str) -> None:
    import httpx

    response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if response.status_code != 200:
        raise RuntimeError(f"{name}: GET {url} answered {response.status_code}: {response.text}")


def _ingress_result(
    results: dict[str, Load], generator: str, proxy: str, args: argparse.Namespace
) -> Result:
    serve, plain = results["serve"], results["uvicorn"]
    ratio = serve.rps / plain.rps if plain.rps else None
    note = "per-token rate limit disabled in both targets (ORCH_RATE_LIMIT_PER_MINUTE=0)"
    data = {
        "serve_rps": round(serve.rps, 1),
        "uvicorn_rps": round(plain.rps, 1),
        "ratio": round(ratio, 3) if ratio is not None else None,
        "p50_ms": round(serve.p50_ms, 3),
        "p99_ms": round(serve.p99_ms, 3),
        "uvicorn_p50_ms": round(plain.p50_ms, 3),
        "uvicorn_p99_ms": round(plain.p99_ms, 3),
        "serve_errors": serve.errors,
        "uvicorn_errors": plain.errors,
        "generator": generator,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "route": f"GET {ROUTE}",
        "replicas": args.replicas or DEFAULT_REPLICAS,
        "serve_proxy": proxy,
        "cpus": os.cpu_count(),
        "rate_limit_per_minute": 0,
        "note": note,
    }
    rows = [("target", "req/s", "p50 ms", "p99 ms", "errors")] + [
        (name, f"{r.rps:.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors))
        for name, r in results.items()
    ]
    table = format_table(rows)
    proxy_name = {"haproxy": "HAProxy", "standard": "standard Serve"}.get(proxy, proxy)
    text = (
        f"ingress: GET {ROUTE} with the admin token; {generator}, {args.concurrency} "
        f"connections, {args.duration:g}s per target; "
        f"Serve: {args.replicas or DEFAULT_REPLICAS} replica(s), "
        f"{proxy_name} proxy; {os.cpu_count()} CPUs\n{note}\n\n{table}\n\n"
        f"ratio serve/uvicorn: {'n/a' if ratio is None else f'{ratio:.3f}'}"
    )
    if proxy == "standard" and not args.no_haproxy:
        text += "\nNOTE: HAProxy was asked for but the service fell back to the standard proxy"
    if serve.errors or plain.errors:
        text += "\nWARNING: some requests failed (errors column); their time is not in req/s"
    return Result(data, text)


# --- events: store append throughput, SSE delivery latency ----------------------------------

EVENTS_ENV = {**BENCH_ENV, "ORCH_SSE_PING_INTERVAL_S": "15"}
EVENTS_USER = "bench"
APPEND_TARGET_EPS = 5_000
SSE_TARGET_P99_MS = 50.0
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
    _replicas_argument(parser)
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
            say(f"append: {label}, {duration_s:g}s")
            rates[key] = await _rate(duration_s, writers, appender(batch))
        say(f"baseline again, {duration_s:g}s")
        rates["baseline_after"] = await _rate(duration_s, 1, insert)
    finally:
        await db.close()
        await conn.close()
    return rates


def host_cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def host_busy_pct(start: tuple[float, float] | None) -> float | None:
    end = host_cpu_times()
    if start is None or end is None or end[1] <= start[1]:
        return None
    return 100 * (end[0] - start[0]) / (end[1] - start[1])


def raise_nofile_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (children started later inherit it)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


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


async def _sse_round(
    base_url: str, token: str, store: Any, n: int, k: int, spacing_s: float
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

    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(limits=limits, timeout=None, headers=headers) as http:
        say(f"sse: opening {n} streams")
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(subscriber(http)) for _ in range(n)]
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
                await _sse_round(service.url, token, store, n, args.sse_events, args.sse_spacing)
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

        service = start_serve(stack, workdir, {**os.environ, **EVENTS_ENV}, _replicas_argv(args))
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
        ("append (direct to the store)", "events/s", "x baseline", "client CPU")
    ]
    for label, rate in (("baseline: INSERT autocommit, before", before), ("... after", after)):
        rows.append(
            (
                label,
                f"{rate.per_s:.0f}",
                f"{rate.per_s / base:.2f}" if base else "n/a",
                f"{rate.cpu_s / rate.elapsed_s:.0%}",
            )
        )
    for key, label, _, _ in APPEND_RUNS:
        rate = rates[key]
        data[key] = round(rate.per_s, 1)
        data[f"{key}_vs_baseline"] = round(rate.per_s / base, 3) if base else None
        data[f"{key}_client_cpu_pct"] = round(100 * rate.cpu_s / rate.elapsed_s, 1)
        rows.append(
            (
                label,
                f"{rate.per_s:.0f}",
                f"{rate.per_s / base:.2f}" if base else "n/a",
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
    p99_key = f"sse_p99_ms_{SSE_TARGET_SUBSCRIBERS}"
    if p99_key in data:
        met = (
            data[p99_key] <= SSE_TARGET_P99_MS
            and data[f"sse_missing_{SSE_TARGET_SUBSCRIBERS}"] == 0
        )
        data["target_sse_met"] = met
        verdicts.append(
            f"SSE p99 <= {SSE_TARGET_P99_MS:.0f} ms at {SSE_TARGET_SUBSCRIBERS} subscribers, "
            f"none missing: {'met' if met else 'NOT met'} ({data[p99_key]:.1f} ms)"
        )
    else:
        data["target_sse_met"] = None
        verdicts.append(f"SSE target: not measured (no round of {SSE_TARGET_SUBSCRIBERS})")
    note = (
        f"x baseline: against the mean of the two baseline runs (commits/s, one connection). "
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
        f"GET /api/v1/sync-events; {cpus} CPUs\n\n"
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


# --- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    common.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per measurement (default: ingress 10, events 5)",
    )
    common.add_argument("--concurrency", type=int, default=16, help="concurrent connections")
    common.add_argument(
        "--generator",
        choices=["auto", *GENERATORS],
        default="auto",
        help="load generator (auto: wrk when on PATH, else httpx)",
    )
    common.add_argument("--keep", action="store_true", help="keep the temp dir and logs")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for bench in BENCHMARKS.values():
        bench.add_arguments(sub.add_parser(bench.name, help=bench.help, parents=[common]))
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = BENCHMARKS[args.benchmark].duration_s
    if args.duration <= 0 or args.concurrency < 1:
        parser.error("--duration must be > 0 and --concurrency >= 1")
    return args


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    # A SIGTERM to the bench must still stop the children it started.
    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with sigterm_as_interrupt():
            result = BENCHMARKS[args.benchmark].run(args)
    except KeyboardInterrupt:
        say("interrupted; children stopped")
        return 130
    except RuntimeError as exc:
        say(f"failed: {exc}")
        return 1
    print(json.dumps(result.data) if args.json else result.text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
