"""`dispatch`: what it costs to hand an agent task to a worker, as an actor call (how the
workflow shards, the scheduler and the channel hubs reach the AgentWorkers) and as a call
through a Serve DeploymentHandle (what a Serve deployment of the workers would cost).

Issue 31 asked whether the AgentWorker pool should become a Serve deployment (Serve's
routing, backpressure, drain, autoscaling and rolling update instead of ours). Both calls
are made from an actor (as a shard makes them) to a worker whose `run` answers at once, with
a task-sized payload: sequentially (the hop's latency, per workflow step) and with
`--concurrency` calls in flight (throughput). docs/design-notes.md has the decision.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from benchmarks._common import Result, benchmark, format_table, percentile, say

PAYLOAD_BYTES = 2_048  # about an AgentTask: instructions, tools, ids
SEQUENTIAL_CALLS = 500


def _dispatch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--calls", type=int, default=SEQUENTIAL_CALLS, help="sequential calls per path"
    )


@benchmark(
    "dispatch",
    "agent task hand-off: actor call vs Serve DeploymentHandle call (from an actor)",
    _dispatch_arguments,
    duration_s=5.0,
    concurrency=32,
)
def dispatch(args: argparse.Namespace) -> Result:
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0, max_concurrency=10_000)
        class Worker:
            async def run(self, task: dict[str, Any]) -> str:
                return str(task["id"])

        @serve.deployment(
            name="Worker",
            num_replicas=1,
            max_ongoing_requests=10_000,
            ray_actor_options={"num_cpus": 0},
        )
        class WorkerDeployment:
            async def run(self, task: dict[str, Any]) -> str:
                return str(task["id"])

        @ray.remote(num_cpus=0)
        class Caller:
            async def measure(
                self, actor: Any, calls: int, concurrency: int, duration_s: float
            ) -> dict[str, dict[str, float]]:
                handle = serve.get_deployment_handle("Worker", app_name="dispatch")
                paths = {
                    "actor call": lambda task: actor.run.remote(task),
                    "Serve handle": lambda task: handle.run.remote(task),
                }
                out: dict[str, dict[str, float]] = {}
                for name, call in paths.items():
                    out[name] = await _measure(call, calls, concurrency, duration_s)
                return out

        worker = Worker.remote()
        serve.run(WorkerDeployment.bind(), name="dispatch", route_prefix=None)
        say(f"measuring {args.calls} sequential calls and c={args.concurrency} per path")
        caller = Caller.remote()
        measured = caller.measure.remote(worker, args.calls, args.concurrency, args.duration)
        figures = ray.get(measured)
    finally:
        serve.shutdown()
        ray.shutdown()
    rows = [["path", "p50 ms", "p99 ms", f"calls/s c={args.concurrency}"]]
    for name, f in figures.items():
        rows.append([name, f"{f['p50_ms']:.2f}", f"{f['p99_ms']:.2f}", f"{f['per_s']:.0f}"])
    return Result({"benchmark": "dispatch", "paths": figures}, format_table(rows))


async def _measure(call: Any, calls: int, concurrency: int, duration_s: float) -> dict[str, float]:
    pad = "x" * PAYLOAD_BYTES
    for i in range(20):  # warm: the first calls resolve the handle and open connections
        await call({"id": i, "pad": pad})
    latencies: list[float] = []
    for i in range(calls):
        started = time.perf_counter()
        await call({"id": i, "pad": pad})
        latencies.append((time.perf_counter() - started) * 1000)
    latencies.sort()
    done = 0
    deadline = time.monotonic() + duration_s

    async def client() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            await call({"id": done, "pad": pad})
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "per_s": done / (time.monotonic() - started),
    }
