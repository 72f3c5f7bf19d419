"""What the benchmarks share: the registry, child processes (`orchestrator serve`, plain
uvicorn), load generators (wrk, httpx), percentiles, tables, CPU accounting."""

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
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from orchestrator.config import Settings

T = TypeVar("T")

DEFAULT_REPLICAS = Settings.model_fields["api_replicas"].default

READY_LINE = "Orchestrator ready at "
SERVE_START_TIMEOUT_S = 180.0
UVICORN_START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
WARMUP_S = 3.0
# The per-token rate limit stays on (its check is on every request's path) with a budget no
# load test reaches: the default 600/min would throttle it.
BENCH_RATE_LIMIT_PER_MINUTE = 1_000_000_000
BENCH_ENV = {"ORCH_RATE_LIMIT_PER_MINUTE": str(BENCH_RATE_LIMIT_PER_MINUTE)}


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
    concurrency: int = 16  # --concurrency when not given


BENCHMARKS: dict[str, Benchmark] = {}


def benchmark(
    name: str,
    help: str,
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda _: None,
    duration_s: float = 10.0,
    concurrency: int = 16,
) -> Callable[[Callable[[argparse.Namespace], Result]], Callable[[argparse.Namespace], Result]]:
    def register(
        fn: Callable[[argparse.Namespace], Result],
    ) -> Callable[[argparse.Namespace], Result]:
        BENCHMARKS[name] = Benchmark(name, help, fn, add_arguments, duration_s, concurrency)
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

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Stopped (SIGSTOP) for the block, then continued: a baseline process that would
        otherwise spend CPU in the background (following the event feed, its timers) while
        another target is measured on the same cores."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            yield
            return
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(proc.pid, signal.SIGCONT)

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


UVICORN_APP = "benchmarks._common:uvicorn_app"
SCRIPTS_DIR = Path(__file__).resolve().parent.parent  # holds the `benchmarks` package


def uvicorn_app() -> Any:
    """Factory for `uvicorn --factory benchmarks._common:uvicorn_app`: the service's own
    FastAPI app, set up from the ORCH_* environment the bench gives the child (runs in the
    child, never here)."""
    from deployments.api import create_app
    from orchestrator.config import Settings

    return create_app(Settings.load())


def uvicorn_command(app: str, port: int, *, factory: bool = False) -> list[str]:
    """uvicorn serving `app` (a `module:attr` under scripts/) on loopback `port`, the way
    every benchmark's reference servers run: uvloop, httptools, no access log."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        *(["--factory"] if factory else []),
        app,
        "--app-dir",
        str(SCRIPTS_DIR),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--no-access-log",
        "--log-level",
        "warning",
    ]


def start_uvicorn_app(
    stack: contextlib.ExitStack,
    workdir: Path,
    service: Service,
    env: dict[str, str],
    started: list[Child] | None = None,
) -> str:
    """Plain uvicorn (one process, uvloop, httptools) serving the service's FastAPI app
    against `service`'s Postgres, Redis and data dir; returns its base URL (and appends its
    process to `started`); `stack` stops it."""
    port = free_port()
    uvicorn_env = {
        **env,
        "ORCH_DATABASE_URL": service.database_url,
        "ORCH_REDIS_URL": service.redis_url,
        "ORCH_DATA_DIR": str(service.data_dir),
        "ORCH_PORT": str(port),
    }
    uvicorn = Child(
        "uvicorn",
        uvicorn_command(UVICORN_APP, port, factory=True),
        workdir / "uvicorn.log",
        uvicorn_env,
    )
    stack.callback(uvicorn.stop)
    uvicorn.start()
    if started is not None:
        started.append(uvicorn)
    base_url = f"http://127.0.0.1:{port}"
    wait_for_http(uvicorn, f"{base_url}/api/v1/ready", UVICORN_START_TIMEOUT_S)
    return base_url


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
    client_cpu_s: float = 0.0  # the generator's CPU time over the run

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
# The same with a POST of the JSON body in BENCH_BODY.
WRK_POST_SCRIPT = WRK_SCRIPT.replace(
    'wrk.method = "GET"\n',
    'wrk.method = "POST"\nwrk.body = os.getenv("BENCH_BODY")\n'
    'wrk.headers["Content-Type"] = "application/json"\n',
)


class Generator(Protocol):
    """A load generator: `concurrency` keep-alive connections sending requests back to back
    for `duration_s` (a GET, or a POST of the JSON `body`)."""

    def __call__(
        self,
        url: str,
        token: str,
        concurrency: int,
        duration_s: float,
        workdir: Path,
        body: str | None = None,
    ) -> Load: ...


def run_wrk(
    url: str,
    token: str,
    concurrency: int,
    duration_s: float,
    workdir: Path,
    body: str | None = None,
) -> Load:
    script = workdir / ("bench.lua" if body is None else "bench_post.lua")
    if not script.exists():
        script.write_text(WRK_SCRIPT if body is None else WRK_POST_SCRIPT)
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
    if body is not None:
        env["BENCH_BODY"] = body
    cpu0 = _children_cpu_s()
    out = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=env, timeout=duration_s + 60
    )
    cpu_s = _children_cpu_s() - cpu0
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
        client_cpu_s=cpu_s,
    )


def _children_cpu_s() -> float:
    """User + system CPU of this process's waited-for children (wrk, once it has exited)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (as wrk reports), q in 0..100."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


async def _httpx_load(
    url: str, token: str, concurrency: int, duration_s: float, body: str | None = None
) -> Load:
    import httpx

    latencies: list[float] = []
    errors = 0
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    content = None if body is None else body.encode()
    cpu0 = time.process_time()
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
                    if content is None:
                        response = await http.get(url)
                    else:
                        response = await http.post(url, content=content)
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
        client_cpu_s=time.process_time() - cpu0,
    )


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` on uvloop when installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def run_httpx(
    url: str,
    token: str,
    concurrency: int,
    duration_s: float,
    workdir: Path,
    body: str | None = None,
) -> Load:
    return run_async(lambda: _httpx_load(url, token, concurrency, duration_s, body))


GENERATORS: dict[str, Generator] = {
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


def replicas_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help=f"Serve replicas of the API (default: the service's api_replicas{note})",
    )


def replicas_argv(args: argparse.Namespace) -> list[str]:
    return [] if args.replicas is None else ["--replicas", str(args.replicas)]
