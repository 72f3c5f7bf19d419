#!/usr/bin/env python3
"""Benchmarks of the service, one subcommand each.

    python scripts/bench.py ingress [--json] [--duration S] [--concurrency C]

`ingress` starts `orchestrator serve` (Ray Serve, HAProxy unless --no-haproxy) and, next to
it, plain uvicorn serving the same FastAPI app against the same Postgres and Redis; then it
loads both with the same generator on the same authenticated route and compares them.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import Settings

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


BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(
    name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] = lambda _: None
) -> Callable[[Callable[[argparse.Namespace], Result]], Callable[[argparse.Namespace], Result]]:
    def register(
        fn: Callable[[argparse.Namespace], Result],
    ) -> Callable[[argparse.Namespace], Result]:
        BENCHMARKS[name] = Benchmark(name, help, fn, add_arguments)
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


def uvicorn_app() -> Any:
    """Factory for `uvicorn --factory bench:uvicorn_app`: the service's own FastAPI app, set up
    from the ORCH_* environment the bench gives the child (runs in the child, never here)."""
    from deployments.api import create_app
    from orchestrator.config import Settings

    return create_app(Settings.load())


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


def run_httpx(url: str, token: str, concurrency: int, duration_s: float, workdir: Path) -> Load:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_httpx_load(url, token, concurrency, duration_s))
    return uvloop.run(_httpx_load(url, token, concurrency, duration_s))


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


def _ingress_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="Serve replicas of the API (default: the service's api_replicas; uvicorn always "
        "runs one process)",
    )
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
        workdir = Path(tempfile.mkdtemp(prefix="orch-bench-"))
        if args.keep:
            say(f"keeping {workdir}")
        else:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        data_dir = workdir / "data"
        data_dir.mkdir()
        env = {**os.environ, **BENCH_ENV}

        serve_port = free_port()
        # `orchestrator serve`, run by this interpreter so the venv need not be on PATH.
        serve_argv = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            "--data-dir",
            str(data_dir),
            "--port",
            str(serve_port),
        ]
        if args.replicas is not None:
            serve_argv += ["--replicas", str(args.replicas)]
        if args.no_haproxy:
            serve_argv.append("--no-haproxy")
        serve = Child("orchestrator serve", serve_argv, workdir / "serve.log", env)
        stack.callback(serve.stop)
        t0 = time.monotonic()
        serve.start()
        wait_for_line(serve, READY_LINE, SERVE_START_TIMEOUT_S)
        proxy = serve_proxy(serve.log_path.read_text(errors="replace"))
        say(f"serve ready in {time.monotonic() - t0:.1f}s (proxy: {proxy})")
        token = (data_dir / "admin_token").read_text().strip()
        runtime = json.loads((data_dir / "runtime.json").read_text())
        serve_url = runtime["url"].rstrip("/") + ROUTE

        uvicorn_port = free_port()
        uvicorn_env = {
            **env,
            "ORCH_DATABASE_URL": runtime["database_url"],
            "ORCH_REDIS_URL": runtime["redis_url"],
            "ORCH_DATA_DIR": str(data_dir),
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
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )
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


# --- command line --------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    common.add_argument("--duration", type=float, default=10.0, help="seconds per target")
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
