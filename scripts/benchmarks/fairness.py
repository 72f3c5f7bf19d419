"""`fairness`: how much one tenant's backlog delays another tenant's work (issue 29).

`orchestrator serve` (HAProxy, Serve, two WorkflowShards, two AgentWorkers, embedded
Postgres) with a loopback OpenAI-format model in its own process that answers tenant A's
prompts after `--slow-s` seconds (a slow model: A's tasks hold their worker slots) and
tenant B's at once. Tenant B runs one-step workflows one at a time: first with the service
idle (the baseline), then while tenant A's `--flood` one-step workflows, created at once,
are in flight (from when A has created enough of them to fill every worker slot, while the
rest are still being created and run). The figure is B's latency (POST /workflows to
`completed` seen, polled every 20 ms) under the flood against its idle figure, measured in
the same run.

The workers' slots (`--max-running`, 64 by default, so that a 500-workflow flood on two
workers fills them; the service's default is 256) are shared by admission: a tenant holds at
most `--tenant-share` of a worker's slots and waiting tasks are served fairly across tenants.
`--fifo` also measures, in the same run, a second service configured as before issue 29:
one tenant may take every slot and calls past the slots wait in Ray's first-come queue.
The per-tenant ceiling on live workflows is raised above the flood: what is measured here is
the sharing of the workers and shards, not that ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from benchmarks import _upstream
from benchmarks._common import (
    BENCH_ENV,
    UVICORN_START_TIMEOUT_S,
    Child,
    Result,
    benchmark,
    format_table,
    free_port,
    make_workdir,
    percentile,
    run_async,
    say,
    start_serve,
    uvicorn_command,
    wait_for_http,
)

UPSTREAM_KEY = "sk-bench-fairness"
SLOW_MARK = b"[slow]"
POLL_S = 0.02
WARMUP = 3

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# --- the model: the bench upstream, slow for prompts that carry SLOW_MARK ---------------------

_SLOW_S = float(os.environ.get("BENCH_SLOW_S", "0"))


async def slow_upstream(scope: Scope, receive: Receive, send: Send) -> None:
    """`_upstream.app`, answering a request whose body holds SLOW_MARK after BENCH_SLOW_S
    (run in the upstream's own process: `uvicorn benchmarks.fairness:slow_upstream`)."""
    if scope["type"] != "http" or scope["method"] != "POST":
        await _upstream.app(scope, receive, send)
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    if SLOW_MARK in body:
        await asyncio.sleep(_SLOW_S)
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    await _upstream.app(scope, replay, send)


def _start_upstream(stack: contextlib.ExitStack, workdir: Any, slow_s: float) -> str:
    port = free_port()
    upstream = Child(
        "upstream",
        uvicorn_command("benchmarks.fairness:slow_upstream", port),
        workdir / "upstream.log",
        {**os.environ, "BENCH_UPSTREAM_KEY": UPSTREAM_KEY, "BENCH_SLOW_S": str(slow_s)},
    )
    stack.callback(upstream.stop)
    upstream.start()
    base_url = f"http://127.0.0.1:{port}"
    wait_for_http(upstream, f"{base_url}/health", UVICORN_START_TIMEOUT_S)
    return base_url


# --- the measurement -------------------------------------------------------------------------


def _one_step(name: str, prompt: str) -> dict[str, Any]:
    return {"name": name, "steps": [{"name": "s", "prompt": prompt}]}


async def _until_done(c: httpx.AsyncClient, wid: str) -> None:
    while True:
        status = (await c.get(f"/workflows/{wid}")).json()["status"]
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise RuntimeError(f"{wid} ended {status}")
        await asyncio.sleep(POLL_S)


async def _b_latency(b: httpx.AsyncClient, n: int) -> float:
    """One of tenant B's one-step workflows, created to completed (ms)."""
    t0 = time.perf_counter()
    r = await b.post("/workflows", json=_one_step(f"b-{n}", f"tenant B, workflow {n}"))
    r.raise_for_status()
    await _until_done(b, r.json()["id"])
    return (time.perf_counter() - t0) * 1000


async def _completed(a: httpx.AsyncClient) -> int:
    page = await a.get("/workflows", params={"status": "completed", "limit": 1})
    return int(page.json()["total"])


async def _measure(url: str, admin: str, flood: int, samples: int, fill: int) -> dict[str, Any]:
    """B idle, then B while A's flood runs (from when A has `fill` workflows in)."""
    api = url + "/api/v1"
    async with httpx.AsyncClient(
        base_url=api, headers={"Authorization": f"Bearer {admin}"}, timeout=60
    ) as c:
        tokens = {}
        for user in ("tenant-a", "tenant-b"):
            made = await c.post("/tokens", json={"user_uuid": user})
            made.raise_for_status()
            tokens[user] = made.json()["token"]

    def client(user: str) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=64)
        headers = {"Authorization": f"Bearer {tokens[user]}"}
        return httpx.AsyncClient(base_url=api, headers=headers, timeout=300, limits=limits)

    async with client("tenant-a") as a, client("tenant-b") as b:
        say(f"warm-up: {WARMUP} of B's workflows")
        for n in range(WARMUP):
            await _b_latency(b, n)
        say(f"idle: {samples} of B's one-step workflows, one at a time")
        idle = [await _b_latency(b, WARMUP + n) for n in range(samples)]

        say(f"flood: tenant A creates {flood} one-step workflows at once (slow model)")
        t0 = time.perf_counter()
        answered = 0
        filled = asyncio.Event()

        async def create(n: int) -> httpx.Response:
            nonlocal answered
            r = await a.post("/workflows", json=_one_step(f"a-{n}", f"{SLOW_MARK.decode()} a {n}"))
            answered += 1
            if answered >= fill:
                filled.set()
            return r

        creating = asyncio.gather(*(create(n) for n in range(flood)))
        # B starts once A has enough workflows in to fill every slot, while the rest of the
        # flood is still being created.
        await filled.wait()
        say(f"{answered} of A's workflows created; B's workflows while the flood runs")
        loaded: list[float] = []
        done_a = 0
        while len(loaded) < samples:
            loaded.append(await _b_latency(b, 1000 + len(loaded)))
            done_a = await _completed(a)
            if done_a >= flood:
                break
        backlog_at_end = flood - done_a
        made = await creating
        created_s = time.perf_counter() - t0
        refused = [r for r in made if r.status_code != 200]
        if refused:
            raise RuntimeError(f"{len(refused)} of A's creates refused: {refused[0].text}")
        while True:  # the flood's end, polled over HTTP (nothing local to wait on)
            if await _completed(a) >= flood:
                break
            await asyncio.sleep(0.5)
        flood_s = time.perf_counter() - t0
    return {
        "idle": sorted(idle),
        "loaded": sorted(loaded),
        "created_s": created_s,
        "flood_s": flood_s,
        "a_backlog_after_b": backlog_at_end,
    }


def _run_service(args: argparse.Namespace, fifo: bool) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        upstream = _start_upstream(stack, workdir, args.slow_s)
        providers = {
            "openai": {
                "base_url": f"{upstream}/v1",
                "api_key": UPSTREAM_KEY,
                "models": [_upstream.MODEL],
            }
        }
        settings = {
            "ORCH_AGENT_WORKERS": str(args.agent_workers),
            "ORCH_WORKFLOW_SHARDS": str(args.shards),
            "ORCH_AGENT_WORKER_MAX_RUNNING": str(args.max_running),
            "ORCH_AGENT_WORKER_TENANT_SHARE": "1" if fifo else str(args.tenant_share),
            "ORCH_WORKFLOW_MAX_LIVE_PER_USER": str(args.flood + 100),
        }
        if fifo:
            # Before issue 29: every call the worker's Ray concurrency admits runs at once,
            # the others wait in Ray's queue in arrival order.
            settings["ORCH_AGENT_WORKER_CONCURRENCY"] = str(args.max_running)
        env = {
            **os.environ,
            **BENCH_ENV,
            "ORCH_PROVIDERS": json.dumps(providers),
            "ORCH_DEFAULT_MODEL": _upstream.MODEL,
            **settings,
        }
        service = start_serve(stack, workdir, env)
        got = run_async(
            lambda: _measure(
                service.url,
                service.admin_token,
                args.flood,
                args.samples,
                min(args.flood, args.max_running * args.agent_workers),
            )
        )
        got["settings"] = settings
        return got


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--flood", type=int, default=500, help="A's workflows at once (500)")
    parser.add_argument("--samples", type=int, default=10, help="B's workflows per phase (10)")
    parser.add_argument(
        "--slow-s", type=float, default=10.0, help="model latency of A's tasks (10 s)"
    )
    parser.add_argument("--max-running", type=int, default=64, help="agent_worker_max_running (64)")
    parser.add_argument(
        "--tenant-share", type=float, default=0.5, help="agent_worker_tenant_share (0.5)"
    )
    parser.add_argument("--agent-workers", type=int, default=2, help="AgentWorker actors")
    parser.add_argument("--shards", type=int, default=2, help="WorkflowShard actors")
    parser.add_argument(
        "--fifo", action="store_true", help="also measure the pre-issue-29 configuration"
    )


def _summary(got: dict[str, Any]) -> dict[str, Any]:
    idle, loaded = got["idle"], got["loaded"]
    p50_idle, p50_loaded = percentile(idle, 50), percentile(loaded, 50)
    return {
        "b_idle_ms_p50": round(p50_idle, 1),
        "b_idle_ms_max": round(idle[-1], 1),
        "b_loaded_ms_p50": round(p50_loaded, 1),
        "b_loaded_ms_max": round(loaded[-1], 1),
        "b_loaded_samples": len(loaded),
        "ratio_p50": round(p50_loaded / p50_idle, 2),
        "ratio_max": round(loaded[-1] / idle[-1], 2),
        "flood_created_s": round(got["created_s"], 1),
        "flood_done_s": round(got["flood_s"], 1),
        "a_backlog_when_b_sampling_ended": got["a_backlog_after_b"],
        "settings": got["settings"],
    }


@benchmark("fairness", "one tenant's flood against another tenant's latency", _arguments, 1)
def fairness(args: argparse.Namespace) -> Result:
    load0 = os.getloadavg()
    runs = {"fair": _summary(_run_service(args, fifo=False))}
    if args.fifo:
        runs["fifo"] = _summary(_run_service(args, fifo=True))
    load1 = os.getloadavg()
    data: dict[str, Any] = {
        "flood": args.flood,
        "slow_s": args.slow_s,
        "load_average_before_after": [round(load0[0], 2), round(load1[0], 2)],
        **runs,
    }
    rows = [["tenant B, one-step workflow", "idle p50", "flood p50", "flood max", "x p50"]]
    for name, run in runs.items():
        label = "fair admission" if name == "fair" else "before (one FIFO queue)"
        rows.append(
            [
                label,
                f"{run['b_idle_ms_p50']:.0f} ms",
                f"{run['b_loaded_ms_p50']:.0f} ms",
                f"{run['b_loaded_ms_max']:.0f} ms",
                f"{run['ratio_p50']:.2f}",
            ]
        )
    text = (
        format_table(rows)
        + f"\nflood: {args.flood} of tenant A's one-step workflows, model {args.slow_s:g} s each;"
        + " B measured from when A's first workflows could fill every slot"
        + "".join(
            f"\n{name}: flood created in {run['flood_created_s']} s, done in "
            f"{run['flood_done_s']} s; {run['b_loaded_samples']} B samples under it"
            for name, run in runs.items()
        )
        + f"\nload average (1 min) before/after: {load0[0]:.1f}/{load1[0]:.1f}"
    )
    return Result(data, text)
