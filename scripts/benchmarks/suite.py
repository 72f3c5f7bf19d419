"""`mixed` and `all`.

`mixed`: one `orchestrator serve` (against the instant loopback model) under four loads at
once for `--duration` seconds: workflows (create, then wait for completion), chat completions
through the gateway, memory writes and reads, and a live event stream counting what it
receives. Per load: operations, ops/s, p50/p99 latency, errors; the baseline is each load
alone on the same service for the same time, so the ratios show what sharing costs.

`all`: every other benchmark in turn (with its defaults and `--json`), then `mixed`; writes
one JSON report (`--report`, default `bench-report.json`) and prints a summary table. Takes a
long time (the 100k-entry memory load alone is about a minute)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import (
    BENCHMARKS,
    Result,
    benchmark,
    format_table,
    percentile,
    run_async,
    say,
)
from benchmarks._upstream import MODEL
from benchmarks.workflows import serve_with_instant_model

LOADS = ("workflows", "chat", "memory", "events")


def _mixed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alone", action="store_true", help="also run each load alone")


class _Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies)
        return {
            "ops": len(lat),
            "ops_per_s": round(len(lat) / seconds, 1),
            "p50_ms": round(percentile(lat, 50), 1) if lat else None,
            "p99_ms": round(percentile(lat, 99), 1) if lat else None,
            "errors": self.errors,
        }


async def _timed(tally: _Tally, call: Callable[[], Awaitable[bool]]) -> None:
    t0 = time.perf_counter()
    try:
        ok = await call()
    except httpx.HTTPError:
        ok = False
    if ok:
        tally.latencies.append((time.perf_counter() - t0) * 1000)
    else:
        tally.errors += 1


async def _run_loads(url: str, token: str, loads: tuple[str, ...], seconds: float) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    tallies = {name: _Tally() for name in loads}
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=f"{url}/api/v1", headers=headers, timeout=60) as c:

        async def workflows() -> None:
            async def one() -> bool:
                r = await c.post(
                    "/workflows", json={"name": "m", "steps": [{"name": "a", "prompt": "go"}]}
                )
                wid = r.json()["id"]
                while (await c.get(f"/workflows/{wid}")).json()["status"] not in (  # noqa: ASYNC110
                    "completed",
                    "failed",
                ):
                    await asyncio.sleep(0.05)
                return True

            while not stop.is_set():
                await _timed(tallies["workflows"], one)

        async def chat() -> None:
            async def one() -> bool:
                r = await c.post(
                    "/chat/completions",
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                )
                return r.status_code == 200

            while not stop.is_set():
                await _timed(tallies["chat"], one)

        async def memory() -> None:
            i = 0

            async def one() -> bool:
                nonlocal i
                i += 1
                r = await c.post("/memory/bench/store", json={"key": f"k{i}", "value": "v"})
                g = await c.get(f"/memory/bench/k{i}")
                return r.status_code == 200 and g.status_code == 200

            while not stop.is_set():
                await _timed(tallies["memory"], one)

        async def events() -> None:
            tally = tallies["events"]
            with contextlib.suppress(httpx.HTTPError, asyncio.CancelledError):
                async with c.stream("GET", "/sync-events", timeout=None) as r:
                    last = time.perf_counter()
                    async for line in r.aiter_lines():
                        if line.startswith("id:"):
                            now = time.perf_counter()
                            tally.latencies.append((now - last) * 1000)  # inter-arrival
                            last = now
                        if stop.is_set():
                            break

        runners = {"workflows": workflows, "chat": chat, "memory": memory, "events": events}
        tasks = [asyncio.create_task(runners[name]()) for name in loads]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {name: tallies[name].summary(seconds) for name in loads}


@benchmark(
    "mixed",
    "workflows, chat, memory and events at once on one service",
    _mixed_arguments,
    duration_s=15,
)
def mixed(args: argparse.Namespace) -> Result:
    with contextlib.ExitStack() as stack:
        _, service = serve_with_instant_model(stack, args.keep)
        alone: dict[str, Any] = {}
        if args.alone:
            for name in LOADS:
                say(f"{name} alone, {args.duration:g}s")
                alone[name] = run_async(
                    lambda n=name: _run_loads(service.url, service.admin_token, (n,), args.duration)
                )[name]
        say(f"all four loads at once, {args.duration:g}s")
        together = run_async(
            lambda: _run_loads(service.url, service.admin_token, LOADS, args.duration)
        )
    data: dict[str, Any] = {"duration_s": args.duration, "mixed": together}
    if alone:
        data["alone"] = alone
        data["ratio_vs_alone"] = {
            n: round(together[n]["ops_per_s"] / alone[n]["ops_per_s"], 2)
            for n in LOADS
            if alone[n]["ops_per_s"]
        }
    rows = [("load (at once)", "ops/s", "p50 ms", "p99 ms", "errors", "x alone")]
    for n in LOADS:
        t = together[n]
        ratio = data.get("ratio_vs_alone", {}).get(n, "")
        rows.append(
            (
                n,
                str(t["ops_per_s"]),
                str(t["p50_ms"]),
                str(t["p99_ms"]),
                str(t["errors"]),
                str(ratio),
            )
        )
    note = "events: latency columns are inter-arrival times of the live stream\n"
    return Result(data, f"mixed load, {args.duration:g}s\n" + format_table(rows) + "\n" + note)


def _all_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report", default="bench-report.json", help="JSON report path")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks to leave out")


@benchmark("all", "every benchmark, then the mixed load; one JSON report", _all_arguments)
def run_all(args: argparse.Namespace) -> Result:
    from bench import parse_args  # the CLI's own defaults for each benchmark

    skip = {s for s in args.skip.split(",") if s}
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = [("benchmark", "seconds", "outcome")]
    for name, bench in BENCHMARKS.items():
        if name == "all" or name in skip:
            continue
        argv = [name, "--json"] + (["--alone"] if name == "mixed" else [])
        say(f"=== {name}")
        t0 = time.monotonic()
        try:
            result = bench.run(parse_args(argv))
            report[name] = result.data
            outcome = "ok"
        except (RuntimeError, SystemExit) as exc:
            report[name] = {"error": str(exc)[:2000]}
            outcome = f"failed: {str(exc)[:60]}"
        rows.append((name, f"{time.monotonic() - t0:.0f}", outcome))
    Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    say(f"report written to {args.report}")
    return Result(report, format_table(rows))
