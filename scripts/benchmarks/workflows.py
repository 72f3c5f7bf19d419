"""`workflows`: what orchestrating a workflow step costs.

`orchestrator serve` (HAProxy, Serve, WorkflowShard and AgentWorker actors, embedded Postgres)
runs 5-step workflows against the loopback OpenAI-format upstream (`_upstream`, its own
process), which answers at once. A step's time is the gap between consecutive step
completions in the workflow's events (the first from `workflow.started`); its orchestration
overhead is that time minus one direct call to the model (measured in the same run, p50): the
engine's transitions and their events, the actor hops to the shard and the worker, the agent
loop and the gateway. Overhead is measured one workflow at a time (`--sequential`, 20), and
throughput with `--workflows` (100) created at once: steps/s from the first create to the
last completion, with the step times under that load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import time
from typing import Any

import httpx

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
from benchmarks._upstream import MODEL
from benchmarks.gateway import REQUEST, UPSTREAM_KEY, UPSTREAM_ROUTE, start_upstream

STEPS = 5
TARGET_P50_MS = 3.0
TARGET_STEPS_PER_S = 500.0
TARGET_LOADED_P99_MS = 250.0
BASELINE_CALLS = 300


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workflows", type=int, default=100, help="created at once (100)")
    parser.add_argument("--sequential", type=int, default=20, help="run one by one (20)")
    parser.add_argument("--agent-workers", type=int, default=2, help="AgentWorker actors")
    parser.add_argument("--shards", type=int, default=2, help="WorkflowShard actors")


def _body(n: int) -> dict[str, Any]:
    return {
        "name": f"bench-{n}",
        "steps": [{"name": f"s{i}", "prompt": f"step {i} of workflow {n}"} for i in range(STEPS)],
    }


async def _baseline(upstream: str) -> list[float]:
    """Direct model calls, one at a time (ms)."""
    out = []
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {UPSTREAM_KEY}"}) as c:
        for i in range(BASELINE_CALLS + 20):
            t0 = time.perf_counter()
            r = await c.post(upstream + UPSTREAM_ROUTE, json=REQUEST)
            r.raise_for_status()
            if i >= 20:  # warm-up
                out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


async def _step_times(c: httpx.AsyncClient, wid: str) -> list[float]:
    r = await c.get("/events", params={"aggregate": wid, "limit": 200})
    events = r.json()["data"]
    marks = [e["timestamp"] for e in events if e["type"] == "workflow.started"]
    marks += [e["timestamp"] for e in events if e["type"] == "workflow.step_completed"]
    if len(marks) != STEPS + 1:
        raise RuntimeError(f"{wid}: expected {STEPS} completed steps, events: {events}")
    return [float(b - a) for a, b in itertools.pairwise(marks)]


async def _wait(c: httpx.AsyncClient, wid: str) -> None:
    while True:
        status = (await c.get(f"/workflows/{wid}")).json()["status"]
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise RuntimeError(f"{wid} ended {status}")
        await asyncio.sleep(0.02)


async def _measure(url: str, token: str, sequential: int, concurrent: int) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=120
    ) as c:
        say("warm-up: 3 workflows")
        for n in range(3):
            wid = (await c.post("/workflows", json=_body(n))).json()["id"]
            await _wait(c, wid)
        say(f"sequential: {sequential} workflows of {STEPS} steps, one at a time")
        single: list[float] = []
        for n in range(sequential):
            wid = (await c.post("/workflows", json=_body(n))).json()["id"]
            await _wait(c, wid)
            single += await _step_times(c, wid)
        say(f"concurrent: {concurrent} workflows of {STEPS} steps at once")
        t0 = time.perf_counter()
        made = await asyncio.gather(
            *(c.post("/workflows", json=_body(n)) for n in range(concurrent))
        )
        ids = [r.json()["id"] for r in made]
        # One poller for all (100 pollers would load the service more than the workflows).
        while True:
            page = await c.get("/workflows", params={"limit": concurrent})
            states = {w["id"]: w["status"] for w in page.json()["data"]}
            if any(states.get(i) in ("failed", "cancelled") for i in ids):
                raise RuntimeError(f"a workflow did not complete: {states}")
            if all(states.get(i) == "completed" for i in ids):
                break
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - t0
        loaded: list[float] = []
        for wid in ids:
            loaded += await _step_times(c, wid)
    return {"single": sorted(single), "loaded": sorted(loaded), "elapsed": elapsed}


def serve_with_instant_model(
    stack: contextlib.ExitStack, keep: bool, **env_extra: str
) -> tuple[str, Service]:
    """The loopback upstream (its own process) and `orchestrator serve` using it as the
    default model for agent tasks; the upstream's URL and the service."""
    workdir = make_workdir(stack, keep)
    upstream = start_upstream(stack, workdir)
    providers = {
        "openai": {"base_url": f"{upstream}/v1", "api_key": UPSTREAM_KEY, "models": [MODEL]}
    }
    env = {
        **os.environ,
        **BENCH_ENV,
        "ORCH_PROVIDERS": json.dumps(providers),
        "ORCH_DEFAULT_MODEL": MODEL,
        **env_extra,
    }
    return upstream, start_serve(stack, workdir, env)


@benchmark("workflows", "orchestration overhead per workflow step", _arguments, duration_s=1)
def workflows(args: argparse.Namespace) -> Result:
    with contextlib.ExitStack() as stack:
        upstream, service = serve_with_instant_model(
            stack,
            args.keep,
            ORCH_AGENT_WORKERS=str(args.agent_workers),
            ORCH_WORKFLOW_SHARDS=str(args.shards),
        )
        say(f"baseline: {BASELINE_CALLS} direct model calls")
        base = run_async(lambda: _baseline(upstream))
        got = run_async(
            lambda: _measure(service.url, service.admin_token, args.sequential, args.workflows)
        )
    model_ms = percentile(base, 50)
    single, loaded = got["single"], got["loaded"]
    steps = args.workflows * STEPS
    data = {
        "model_call_p50_ms": round(model_ms, 3),
        "step_ms_p50": percentile(single, 50),
        "step_ms_p99": percentile(single, 99),
        "step_overhead_p50_ms": round(percentile(single, 50) - model_ms, 2),
        "step_overhead_p99_ms": round(percentile(single, 99) - model_ms, 2),
        "steps_per_s": round(steps / got["elapsed"], 1),
        "concurrent_workflows": args.workflows,
        "loaded_step_ms_p50": percentile(loaded, 50),
        "loaded_step_ms_p99": percentile(loaded, 99),
        "elapsed_s": round(got["elapsed"], 2),
        "target_step_overhead_p50_ms": TARGET_P50_MS,
        "target_steps_per_s": TARGET_STEPS_PER_S,
        "target_loaded_step_p99_ms": TARGET_LOADED_P99_MS,
        "lost": 0,  # else _step_times or the poller raised: every step completed once
        "overhead_x_model_call": round((percentile(single, 50) - model_ms) / model_ms, 1),
    }
    rows = [
        ["", "p50 ms", "p99 ms"],
        ["direct model call (baseline)", f"{model_ms:.2f}", f"{percentile(base, 99):.2f}"],
        [
            "step, one workflow at a time",
            f"{data['step_ms_p50']:.1f}",
            f"{data['step_ms_p99']:.1f}",
        ],
        [
            "overhead per step (step - model call)",
            f"{data['step_overhead_p50_ms']:.1f}",
            f"{data['step_overhead_p99_ms']:.1f}",
        ],
        [
            f"step, {args.workflows} workflows at once",
            f"{data['loaded_step_ms_p50']:.1f}",
            f"{data['loaded_step_ms_p99']:.1f}",
        ],
    ]
    text = (
        format_table(rows)
        + f"\n{steps} steps in {got['elapsed']:.2f}s: {data['steps_per_s']} steps/s"
        + f"\ntarget: overhead p50 <= {TARGET_P50_MS} ms"
        + f" ({'met' if data['step_overhead_p50_ms'] <= TARGET_P50_MS else 'not met'}),"
        + f" >= {TARGET_STEPS_PER_S:.0f} steps/s"
        + f" ({'met' if data['steps_per_s'] >= TARGET_STEPS_PER_S else 'not met'}),"
        + f" loaded p99 <= {TARGET_LOADED_P99_MS:.0f} ms"
        + f" ({'met' if data['loaded_step_ms_p99'] <= TARGET_LOADED_P99_MS else 'not met'});"
        + " nothing lost (each workflow completed, each step once)"
    )
    return Result(data, text)
