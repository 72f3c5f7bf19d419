"""`haproxy-balance`: how evenly HAProxy spreads requests over the API replicas with the
connection affinity rule of orchestrator/runtime/haproxy_harden.py (a connection keeps its
replica while the backend is otherwise idle) and with every request balanced on its own.

Issue 31 asked that sticky connections be kept only if they do not skew the replicas' load
with many clients of unequal load. The service runs twice (one Ray cluster at a time): with
the rule (`ORCH_PROXY_CONNECTION_AFFINITY=true`, the default) and without it (`false`).
Each run opens `--concurrency` keep-alive connections in a random order, a few heavy (requests
back to back) and the rest light (one request every `--light-interval-ms`), on
GET /api/v1/whoami with the admin token, for `--duration` seconds, `--trials` times with new
connections; each replica's request count is read from HAProxy's stats CSV (`req_tot` per
server of the application's backend). The skew is max/min of the replicas' counts.
docs/design-notes.md has the decision.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import hashlib
import io
import os
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import (
    BENCH_ENV,
    Result,
    Service,
    benchmark,
    format_table,
    make_workdir,
    percentile,
    run_async,
    say,
    start_serve,
)

ROUTE = "/api/v1/whoami"
STICK_ENV = "ORCH_PROXY_CONNECTION_AFFINITY"  # the setting proxy_connection_affinity


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2, help="API replicas (default 2)")
    parser.add_argument("--heavy", type=int, default=3, help="heavy clients (back to back)")
    parser.add_argument(
        "--light-interval-ms", type=float, default=100.0, help="a light client's pause"
    )
    parser.add_argument("--trials", type=int, default=3, help="trials per mode (new clients)")
    parser.add_argument(
        "--modes", default="affinity,per-request", help="affinity,per-request or either alone"
    )


@benchmark(
    "haproxy-balance",
    "replicas' share of requests with and without HAProxy's connection affinity",
    _arguments,
    duration_s=10.0,
    concurrency=16,
)
def haproxy_balance(args: argparse.Namespace) -> Result:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    runs: dict[str, list[dict[str, Any]]] = {}
    for mode in modes:
        runs[mode] = _run_mode(mode, args)
    return _result(runs, args)


def _run_mode(mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    env = {**os.environ, **BENCH_ENV}
    if mode == "affinity":
        env[STICK_ENV] = "true"
    elif mode == "per-request":
        env[STICK_ENV] = "false"
    else:
        raise SystemExit(f"bench: unknown mode {mode!r}")
    trials: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        service = start_serve(stack, workdir, env, ["--replicas", str(args.replicas)])
        if service.proxy != "haproxy":
            raise RuntimeError(f"the service runs the {service.proxy} proxy, not HAProxy")
        config = _hardened_config(service.data_dir)
        if ("stick match src" in config) != (mode == "affinity"):
            state = "absent" if mode == "affinity" else "present"
            raise RuntimeError(f"{mode}: the affinity rule is {state} in HAProxy's configuration")
        stats_url = _stats_url(config)
        backend = _app_backend(config)
        run_async(lambda: _warm_up(service))
        for trial in range(args.trials):
            before = _server_requests(stats_url, backend)
            clients = run_async(lambda: _load(service, args))
            after = _server_requests(stats_url, backend)
            per_replica = {name: after[name] - before.get(name, 0) for name in after}
            counts = sorted(per_replica.values())
            skew = counts[-1] / counts[0] if counts and counts[0] else None
            heavy = sum(c["requests"] for c in clients if c["heavy"])
            total = sum(c["requests"] for c in clients)
            light_s = sorted(s for c in clients if not c["heavy"] for s in c["s"])
            heavy_s = sorted(s for c in clients if c["heavy"] for s in c["s"])
            say(
                f"{mode} trial {trial + 1}: per replica {per_replica}, max/min "
                f"{'inf' if skew is None else f'{skew:.2f}'}, heavy clients' share "
                f"{heavy / total:.0%} of {total}"
            )
            trials.append(
                {
                    "per_replica": per_replica,
                    "max_min": round(skew, 3) if skew is not None else None,
                    "max_share": round(counts[-1] / sum(counts), 3) if sum(counts) else None,
                    "client_requests": total,
                    "heavy_share": round(heavy / total, 3) if total else None,
                    "errors": sum(c["errors"] for c in clients),
                    "rps": round(total / args.duration, 1),
                    "light_p50_ms": round(percentile(light_s, 50) * 1000, 2),
                    "light_p99_ms": round(percentile(light_s, 99) * 1000, 2),
                    "heavy_p50_ms": round(percentile(heavy_s, 50) * 1000, 2),
                    "heavy_p99_ms": round(percentile(heavy_s, 99) * 1000, 2),
                }
            )
    return trials


def _hardened_config(data_dir: Path) -> str:
    """The configuration HAProxy runs: deployments/launcher.py `haproxy_env` puts it in a
    run directory named after the data directory."""
    digest = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:8]
    run_dir = Path(tempfile.gettempdir()) / f"oh-{digest}"
    for path in sorted(run_dir.rglob("haproxy.cfg*.hardened")):
        if "backend http-" in (config := path.read_text()):
            return config
    raise RuntimeError(f"no hardened HAProxy configuration for {data_dir}")


_STATS = re.compile(r"(?m)^listen stats\n\s+bind (\S+):(\d+)\n(?:.*\n)*?\s+stats uri (\S+)")


def _stats_url(config: str) -> str:
    found = _STATS.search(config)
    if not found:
        raise RuntimeError("no stats section in the HAProxy configuration")
    host = found.group(1).strip("[]") or "127.0.0.1"
    return f"http://{host}:{found.group(2)}{found.group(3)};csv"


def _app_backend(config: str) -> str:
    found = re.search(r"(?m)^backend (http-\S+)\n", config)
    if not found:
        raise RuntimeError("no application backend in the HAProxy configuration")
    return found.group(1)


def _server_requests(stats_url: str, backend: str) -> dict[str, int]:
    """Requests each replica of `backend` took (not the backup: Serve's fallback proxy)."""
    import httpx

    text = httpx.get(stats_url, timeout=5).text.lstrip("# ")
    counts: dict[str, int] = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row["pxname"] != backend or row["svname"] in ("FRONTEND", "BACKEND"):
            continue
        if row.get("bck") == "1":
            continue
        counts[row["svname"]] = int(row.get("req_tot") or row.get("hrsp_2xx") or 0)
    return counts


async def _warm_up(service: Service) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {service.admin_token}"}
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(headers=headers, timeout=10) as client:
        ok = 0
        while ok < 50:
            if (await client.get(service.url + ROUTE)).status_code == 200:
                ok += 1
            elif time.monotonic() > deadline:
                raise RuntimeError(f"GET {ROUTE} does not answer 200")


async def _load(service: Service, args: argparse.Namespace) -> list[dict[str, Any]]:
    """`--concurrency` clients, one keep-alive connection each, opened in a random order."""
    import httpx

    kinds = [True] * args.heavy + [False] * (args.concurrency - args.heavy)
    random.shuffle(kinds)
    headers = {"Authorization": f"Bearer {service.admin_token}"}
    url = service.url + ROUTE
    stop_at = time.monotonic() + args.duration
    pause = args.light_interval_ms / 1000

    async def client(heavy: bool, opened: asyncio.Event) -> dict[str, Any]:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        errors = 0
        latencies: list[float] = []
        async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as http:
            # The first request opens the connection: one at a time, in the shuffled order.
            first = await http.get(url)
            opened.set()
            errors += first.status_code != 200
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                response = await http.get(url)
                latencies.append(time.perf_counter() - t0)
                errors += response.status_code != 200
                if not heavy:
                    await asyncio.sleep(pause)
        return {"heavy": heavy, "requests": len(latencies) + 1, "errors": errors, "s": latencies}

    tasks = []
    for heavy in kinds:
        opened = asyncio.Event()
        tasks.append(asyncio.create_task(client(heavy, opened)))
        await opened.wait()
    return list(await asyncio.gather(*tasks))


def _result(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> Result:
    data: dict[str, Any] = {
        "route": f"GET {ROUTE}",
        "replicas": args.replicas,
        "clients": args.concurrency,
        "heavy_clients": args.heavy,
        "light_interval_ms": args.light_interval_ms,
        "duration_s": args.duration,
        "cpus": os.cpu_count(),
    }
    rows = [
        (
            "mode",
            "trial",
            "per replica",
            "max/min",
            "max share",
            "req/s",
            "heavy share",
            "light p50/p99 ms",
            "heavy p50/p99 ms",
        )
    ]
    for mode, trials in runs.items():
        skews = [t["max_min"] for t in trials if t["max_min"] is not None]
        data[mode] = {"trials": trials, "worst_max_min": max(skews) if skews else None}
        for i, t in enumerate(trials, 1):
            rows.append(
                (
                    mode,
                    str(i),
                    "/".join(str(v) for v in t["per_replica"].values()),
                    f"{t['max_min']}",
                    f"{t['max_share']}",
                    f"{t['rps']}",
                    f"{t['heavy_share']}",
                    f"{t['light_p50_ms']}/{t['light_p99_ms']}",
                    f"{t['heavy_p50_ms']}/{t['heavy_p99_ms']}",
                )
            )
    text = (
        f"haproxy-balance: {args.concurrency} keep-alive clients on GET {ROUTE} "
        f"({args.heavy} back to back, the rest one request per {args.light_interval_ms:g} ms), "
        f"{args.duration:g}s per trial, {args.replicas} replicas; {os.cpu_count()} CPUs\n\n"
        + format_table(rows)
    )
    return Result(data, text)
