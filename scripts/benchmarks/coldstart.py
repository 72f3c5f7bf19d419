"""`coldstart`: `orchestrator serve` from the command to the first `200 OK` of
`GET /api/v1/ready`, on a fresh data directory (embedded Postgres initialised, migrations,
Ray started, Serve deployed) and again on the same directory (a restart), against the
baseline of starting the Python interpreter and importing the service's modules, measured
in the same run. Also when the service says its actors run (the application RUNNING: they
start once the API serves), which /ready does not wait for. `--json` keys: `cold_start_s`
(fresh), `restart_s`, `import_s`, `cold_start_actors_s`, `restart_actors_s`."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks._common import (
    BENCH_ENV,
    Child,
    Result,
    benchmark,
    format_table,
    free_port,
    make_workdir,
    say,
)
from deployments.launcher import ACTORS_RUNNING

TARGET_S = 15.0  # issue 17: fresh data directory
RESTART_TARGET_S = 12.0
READY_TIMEOUT_S = 300.0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=1, help="fresh starts to time (default 1)")


ACTORS_TIMEOUT_S = 120.0
POLL_S = 0.05


def _actors_running(child: Child, started: float) -> float | None:
    """Seconds from the command to the service's "actors running" line, as seen by polling
    its log (to within POLL_S); None: not said within ACTORS_TIMEOUT_S."""
    deadline = time.monotonic() + ACTORS_TIMEOUT_S
    while time.monotonic() < deadline and child.exited() is None:
        with contextlib.suppress(OSError):
            if ACTORS_RUNNING in child.log_path.read_text(errors="replace"):
                return time.monotonic() - started
        time.sleep(POLL_S)
    return None


def _time_to_ready(workdir: Path, data_dir: Path, label: str) -> tuple[float, float | None]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
    child = Child(
        f"orchestrator serve ({label})", argv, workdir / f"{label}.log", {**env, **BENCH_ENV}
    )
    t0 = time.monotonic()
    child.start()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/ready"
        while True:
            if child.exited() is not None:
                raise RuntimeError(f"serve exited before it was ready:\n{child.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1).status_code == 200:
                    ready = time.monotonic() - t0
                    return ready, _actors_running(child, t0)
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f}s:\n{child.log_tail()}")
            time.sleep(POLL_S)
    finally:
        child.stop()


def _import_baseline() -> float:
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import deployments.app, orchestrator.cli"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return time.monotonic() - t0


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@benchmark("coldstart", "orchestrator serve to /ready: fresh and restart", _arguments)
def coldstart(args: argparse.Namespace) -> Result:
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        imports = _import_baseline()
        say(f"baseline: interpreter + imports {imports:.2f}s")
        fresh: list[float] = []
        fresh_actors: list[float | None] = []
        data_dir = workdir / "data-0"
        for i in range(max(1, args.runs)):
            data_dir = workdir / f"data-{i}"
            ready, actors = _time_to_ready(workdir, data_dir, f"fresh-{i}")
            fresh.append(ready)
            fresh_actors.append(actors)
            say(f"fresh start {i + 1}: {ready:.1f}s (actors running: {_s(actors)})")
        restart, restart_actors = _time_to_ready(workdir, data_dir, "restart")
        say(f"restart: {restart:.1f}s (actors running: {_s(restart_actors)})")
    data: dict[str, Any] = {
        "cold_start_s": round(max(fresh), 2),
        "cold_start_runs_s": [round(x, 2) for x in fresh],
        "cold_start_actors_s": _round(max((a for a in fresh_actors if a), default=None)),
        "restart_s": round(restart, 2),
        "restart_actors_s": _round(restart_actors),
        "import_s": round(imports, 2),
        "target_s": TARGET_S,
        "target_met": max(fresh) <= TARGET_S,
        "restart_target_s": RESTART_TARGET_S,
        "restart_target_met": restart <= RESTART_TARGET_S,
        # The machine is shared: the 1-minute load average, to read the figures against.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    rows = [
        ("measure", "to /ready s", "target / baseline", "to actors running s"),
        (
            "cold start (fresh data dir; slowest run)",
            f"{data['cold_start_s']}",
            f"<= {TARGET_S:g}",
            _s(data["cold_start_actors_s"]),
        ),
        (
            "restart (same data dir)",
            f"{data['restart_s']}",
            f"<= {RESTART_TARGET_S:g}",
            _s(data["restart_actors_s"]),
        ),
        ("interpreter + imports (baseline)", f"{data['import_s']}", "", ""),
    ]
    text = "coldstart: orchestrator serve to GET /api/v1/ready\n" + format_table(rows)
    return Result(data, text + f"\nload average {data['load_average_1m']}")
