#!/usr/bin/env python3
"""Benchmarks of the service, one subcommand each.

    python scripts/bench.py ingress [--json] [--duration S] [--concurrency C]
    python scripts/bench.py events [--json] [--duration S] [--subscribers 100,1000] [--append-only]
                              [--horizon [--horizon-idle 10,50,200]]
    python scripts/bench.py gateway [--json] [--duration S] [--concurrency C]
    python scripts/bench.py workflows [--json] [--workflows 100] [--sequential 20]
    python scripts/bench.py workflow-engine [--json] [--workflows 100] [--sequential 20]
    python scripts/bench.py scheduler [--json] [--jobs 1000] [--interval-ms 20000]
    python scripts/bench.py memory [--json] [--entries 100000] [--queries 300] [--store-only]
    python scripts/bench.py coldstart [--json] [--runs 1]
    python scripts/bench.py telemetry [--json] [--requests 200000]
    python scripts/bench.py mixed [--json] [--duration 15] [--alone]
    python scripts/bench.py fairness [--json] [--flood 500] [--slow-s 10] [--fifo]
    python scripts/bench.py dispatch [--json] [--calls 500] [--concurrency 32]
    python scripts/bench.py haproxy-balance [--json] [--heavy 3] [--trials 3] [--modes ...]
    python scripts/bench.py all [--report bench-report.json] [--skip a,b]

`ingress` starts `orchestrator serve` (Ray Serve, HAProxy unless --no-haproxy) and, next to
it, plain uvicorn serving the same FastAPI app against the same Postgres and Redis; then it
loads both with the same generator on the same authenticated route and compares them.

`events` measures the event store's append throughput directly (embedded Postgres, no
HTTP) against plain autocommit INSERTs on the same disk, then the SSE delivery latency of
`orchestrator serve` to 100 and 1,000 concurrent `GET /api/v1/sync-events` streams. With
`--horizon` it measures only what one horizon read (the bound every follower read stops at)
costs with 10, 50 and 200 idle connections open and 16 writers appending.

`gateway` measures the latency the model gateway adds: `POST /api/v1/chat/completions`
(non-streaming latency at concurrency 1, streaming time to first token, throughput at
concurrency 32) against calling the same loopback OpenAI-format upstream directly, through
`orchestrator serve` and through the same app under plain uvicorn.

`workflows` runs 5-step workflows through `orchestrator serve` against an instant loopback
model: orchestration overhead per step (step time minus a direct model call, p50/p99) one
workflow at a time, and steps/s with 100 workflows created at once.

`workflow-engine` measures the same without Ray and HTTP: the engine driving 5-step workflows
over embedded Postgres with an agent that answers at once in-process (each step's claim
check and transactions), against a plain single-row INSERT commit beside it; nothing lost.

`scheduler` creates 1,000 `every` jobs through the API and measures how late each dispatch
is against the slot it was due at (p50/p99).

`memory` loads 100,000 entries x 384 dimensions into pgvector and measures top-10 vector
search (p50/p99, recall@10 against exact neighbours, against an exact scan) and store
throughput as the API stores (entry + event + Redis cache; the local embedder filling behind,
no embedder, an embedding given) against single-row INSERT commits interleaved with it.

`coldstart` times `orchestrator serve` to the first 200 of `GET /api/v1/ready`, on a fresh
data directory and on a restart, against importing the service's modules.

`telemetry` measures in-process what request telemetry costs per request: the request metrics
(counter, SLO buckets, per-route histogram) and the access line as JSON and as text into a
buffered file, against the counter and SLO buckets alone.

`fairness` measures tenant B's one-step workflow latency through `orchestrator serve` while
idle and while tenant A's 500 one-step workflows on a slow model are in flight (issue 29);
`--fifo` adds the configuration before fair admission, in the same run.

`dispatch` measures an agent task's hand-off from an actor to a worker as an actor call and
as a Serve DeploymentHandle call (latency p50/p99 sequentially, calls/s at `--concurrency`):
why the AgentWorker pool is actors (docs/design-notes.md).

`haproxy-balance` starts `orchestrator serve` with 2 API replicas twice, with HAProxy's
connection affinity and without it, loads it with 16 keep-alive clients of unequal load (a
few back to back, the rest paced) and reads each replica's request count from HAProxy's stats:
whether keeping a connection on its replica skews the replicas' load (docs/design-notes.md).

`mixed` runs workflows, chat completions, memory writes/reads and a live event stream at once
on one service (with `--alone`, each alone first, for the ratio); `all` runs every benchmark
and `mixed`, and writes one JSON report.

Progress goes to stderr; the result table (or, with --json, exactly one JSON object) goes to
stdout. The benchmarks live in the `benchmarks` package next to this file (found because
Python puts the script's directory first on sys.path). To add one, write a module there with
a function `(args) -> Result` registered with `@benchmark(...)` and import it below.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

# Run by the project's venv (which scripts/serve and scripts/test create) whatever
# `python3` is first on PATH: the benchmarks import the service.
_VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
if _VENV_PYTHON.exists() and Path(sys.prefix).resolve() != _VENV_PYTHON.parents[1].resolve():
    os.execv(str(_VENV_PYTHON), [str(_VENV_PYTHON), __file__, *sys.argv[1:]])

from benchmarks._common import BENCHMARKS, GENERATORS, say  # noqa: E402 (after the venv re-exec)

# Imported for their `@benchmark` registrations, in the order the subcommands are listed.
for _module in (
    "ingress",
    "events",
    "gateway",
    "workflows",
    "workflow_engine",
    "scheduler",
    "memory",
    "coldstart",
    "telemetry",
    "fairness",
    "dispatch",
    "haproxy_balance",
    "suite",
):
    importlib.import_module(f"benchmarks.{_module}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    common.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds per measurement (default: "
        + ", ".join(f"{b.name} {b.duration_s:g}" for b in BENCHMARKS.values())
        + ")",
    )
    common.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="concurrent connections (default: "
        + ", ".join(f"{b.name} {b.concurrency}" for b in BENCHMARKS.values())
        + ")",
    )
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
    if args.concurrency is None:
        args.concurrency = BENCHMARKS[args.benchmark].concurrency
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
