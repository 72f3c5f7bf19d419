"""`workflow-engine`: what the workflow engine itself costs per step (embedded Postgres, no
Ray, no HTTP, an agent that answers at once in this process).

A step's orchestration is its claim check, the step's start (with its task.created), the
result's record (with its events), and the reload of the workflow: each a transaction.
Measured one workflow at a time (`--sequential`, 20 x 5 steps) as the time between one
step's dispatch and the next one's (the last: until the workflow's `done` NOTIFY reached
the waiter), and with `--workflows` (100) 5-step workflows started at once: steps/s from
the first start to the last completion, and the step times under that load. The baseline,
measured beside it, is one plain single-row INSERT commit on the same server: the ratio says
how many commits a step costs. Nothing lost: every workflow must end `completed` with each
of its steps completed exactly once (else the benchmark fails).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
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

STEPS = 5
TARGET_OVERHEAD_P50_MS = 3.0
TARGET_STEPS_PER_S = 500.0
TARGET_LOADED_P99_MS = 250.0
BASELINE_COMMITS = 500


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workflows", type=int, default=100, help="started at once (100)")
    parser.add_argument("--sequential", type=int, default=20, help="run one by one (20)")


class _Instant:
    """The agent runtime answering at once; remembers when each step was dispatched."""

    def __init__(self) -> None:
        self.marks: dict[str, list[float]] = collections.defaultdict(list)

    async def run(self, task: Any) -> Any:
        from orchestrator.agents import TaskResult

        self.marks[task.workflow_id].append(time.perf_counter())
        return TaskResult(task.task_id, "completed", "ok", None, 0, "bench")


async def _commit_ms(pool: Any) -> list[float]:
    await pool.execute("CREATE TABLE IF NOT EXISTS bench_commits (id bigserial, v text)")
    out = []
    for i in range(BASELINE_COMMITS + 50):
        t0 = time.perf_counter()
        await pool.execute("INSERT INTO bench_commits (v) VALUES ($1)", "x")
        if i >= 50:
            out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


async def _run(url: str, sequential: int, concurrent: int) -> dict[str, Any]:
    from orchestrator.config import Settings
    from orchestrator.db import connect
    from orchestrator.events import EventStore
    from orchestrator.runtime.supervisor import Supervisor
    from orchestrator.workflows import WorkflowEngine, WorkflowSpec, WorkflowStore

    db = await connect(url, min_size=4, max_size=16)
    agent = _Instant()
    settings = Settings.load(environ={}, database_url=url)
    store = WorkflowStore(db.pool, EventStore(db.pool))
    engine = WorkflowEngine(store, agent, settings, supervisor=Supervisor("bench"))
    spec = WorkflowSpec.parse(
        "bench", [{"name": f"s{i}", "prompt": f"step {i}"} for i in range(STEPS)]
    )

    async def one(wid: str) -> list[float]:
        await engine.start(wid)
        await engine.wait(wid, within=600)
        done = time.perf_counter()
        marks = agent.marks[wid] + [done]
        return [(b - a) * 1000 for a, b in itertools.pairwise(marks)]

    try:
        say("baseline: plain single-row INSERT commits")
        commits = await _commit_ms(db.pool)
        say("warm-up: 3 workflows")
        for _ in range(3):
            await one(await store.create(spec, "bench"))
        say(f"sequential: {sequential} workflows of {STEPS} steps, one at a time")
        single: list[float] = []
        for _ in range(sequential):
            single += await one(await store.create(spec, "bench"))
        say(f"concurrent: {concurrent} workflows of {STEPS} steps at once")
        ids = [await store.create(spec, "bench") for _ in range(concurrent)]
        t0 = time.perf_counter()
        loaded_lists = await asyncio.gather(*(one(wid) for wid in ids))
        elapsed = time.perf_counter() - t0
        lost = await _lost(db.pool, ids)
    finally:
        await engine.shutdown()
        await db.close()
    loaded = [ms for times in loaded_lists for ms in times]
    return {
        "commits": commits,
        "single": sorted(single),
        "loaded": sorted(loaded),
        "elapsed": elapsed,
        "lost": lost,
    }


async def _lost(pool: Any, ids: list[str]) -> dict[str, Any]:
    """Workflows not completed, or whose steps did not complete exactly once each."""
    rows = await pool.fetch(
        "SELECT w.id, w.status, (SELECT count(*) FROM events e WHERE e.aggregate_id = w.id"
        " AND e.type = 'workflow.step_completed') AS steps FROM workflows w"
        " WHERE w.id = ANY($1::text[])",
        ids,
    )
    bad = {r["id"]: (r["status"], r["steps"]) for r in rows}
    return {wid: got for wid, got in bad.items() if got != ("completed", STEPS)} | {
        wid: "missing" for wid in ids if wid not in bad
    }


@benchmark(
    "workflow-engine",
    "workflow engine cost per step (no Ray, no HTTP) vs a plain INSERT commit",
    _arguments,
    duration_s=1,
)
def workflow_engine(args: argparse.Namespace) -> Result:
    from orchestrator.runtime import EmbeddedPostgres

    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        pg = EmbeddedPostgres(workdir / "pg")
        stack.callback(pg.stop)
        say(f"starting embedded Postgres in {pg.pgdata}")
        url = pg.start()
        got = run_async(lambda: _run(url, args.sequential, args.workflows))
    if got["lost"]:
        raise SystemExit(f"bench: workflows lost or steps duplicated: {got['lost']}")
    commit = percentile(got["commits"], 50)
    single, loaded = got["single"], got["loaded"]
    steps = args.workflows * STEPS
    data = {
        "insert_commit_p50_ms": round(commit, 3),
        "step_overhead_p50_ms": round(percentile(single, 50), 2),
        "step_overhead_p99_ms": round(percentile(single, 99), 2),
        "step_x_commit": round(percentile(single, 50) / commit, 1),
        "steps_per_s": round(steps / got["elapsed"], 1),
        "concurrent_workflows": args.workflows,
        "loaded_step_ms_p50": round(percentile(loaded, 50), 2),
        "loaded_step_ms_p99": round(percentile(loaded, 99), 2),
        "elapsed_s": round(got["elapsed"], 2),
        "lost": 0,
        "target_step_overhead_p50_ms": TARGET_OVERHEAD_P50_MS,
        "target_steps_per_s": TARGET_STEPS_PER_S,
        "target_loaded_step_p99_ms": TARGET_LOADED_P99_MS,
    }
    rows = [
        ["", "p50 ms", "p99 ms"],
        [
            "plain INSERT commit (baseline)",
            f"{commit:.2f}",
            f"{percentile(got['commits'], 99):.2f}",
        ],
        [
            "step, one workflow at a time",
            f"{data['step_overhead_p50_ms']:.2f}",
            f"{data['step_overhead_p99_ms']:.2f}",
        ],
        [
            f"step, {args.workflows} workflows at once",
            f"{data['loaded_step_ms_p50']:.2f}",
            f"{data['loaded_step_ms_p99']:.2f}",
        ],
    ]

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    text = (
        format_table(rows)
        + f"\nstep = {data['step_x_commit']}x a plain commit"
        + f"\n{steps} steps in {got['elapsed']:.2f}s: {data['steps_per_s']} steps/s, nothing lost"
        + f"\ntargets: overhead p50 <= {TARGET_OVERHEAD_P50_MS} ms"
        + f" ({verdict(data['step_overhead_p50_ms'] <= TARGET_OVERHEAD_P50_MS)}),"
        + f" >= {TARGET_STEPS_PER_S:.0f} steps/s"
        + f" ({verdict(data['steps_per_s'] >= TARGET_STEPS_PER_S)}),"
        + f" loaded p99 <= {TARGET_LOADED_P99_MS:.0f} ms"
        + f" ({verdict(data['loaded_step_ms_p99'] <= TARGET_LOADED_P99_MS)})"
    )
    return Result(data, text)
