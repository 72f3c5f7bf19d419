"""`coldstart`: `orchestrator serve` from the command to the first `200 OK` of
`GET /api/v1/ready`, on a fresh data directory (embedded Postgres initialised, migrations,
Ray started, Serve deployed) and again on the same directory (a restart), against the
baseline of starting the Python interpreter and importing the service's modules, measured
in the same run. `--json` keys: `cold_start_s` (fresh), `restart_s`, `import_s`."""

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

TARGET_S = 15.0  # issue 17: fresh data directory
RESTART_TARGET_S = 12.0
READY_TIMEOUT_S = 300.0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=1, help="fresh starts to time (default 1)")


def _time_to_ready(workdir: Path, data_dir: Path, label: str) -> float:
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
                    return time.monotonic() - t0
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f}s:\n{child.log_tail()}")
            time.sleep(0.05)
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


@benchmark("coldstart", "orchestrator serve to /ready: fresh and restart", _arguments)
def coldstart(args: argparse.Namespace) -> Result:
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        imports = _import_baseline()
        say(f"baseline: interpreter + imports {imports:.2f}s")
        fresh: list[float] = []
        data_dir = workdir / "data-0"
        for i in range(max(1, args.runs)):
            data_dir = workdir / f"data-{i}"
            fresh.append(_time_to_ready(workdir, data_dir, f"fresh-{i}"))
            say(f"fresh start {i + 1}: {fresh[-1]:.1f}s")
        restart = _time_to_ready(workdir, data_dir, "restart")
        say(f"restart: {restart:.1f}s")
    data: dict[str, Any] = {
        "cold_start_s": round(min(fresh), 2),
        "cold_start_runs_s": [round(x, 2) for x in fresh],
        "restart_s": round(restart, 2),
        "import_s": round(imports, 2),
        "target_s": TARGET_S,
        "target_met": min(fresh) <= TARGET_S,
        "restart_target_s": RESTART_TARGET_S,
        # The machine is shared: the 1-minute load average, to read the figures against.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    rows = [
        ("measure", "seconds", "target / baseline"),
        ("cold start (fresh data dir)", f"{data['cold_start_s']}", f"<= {TARGET_S:g}"),
        ("restart (same data dir)", f"{data['restart_s']}", f"<= {RESTART_TARGET_S:g}"),
        ("interpreter + imports (baseline)", f"{data['import_s']}", ""),
    ]
    text = "coldstart: orchestrator serve to GET /api/v1/ready\n" + format_table(rows)
    return Result(data, text + f"\nload average {data['load_average_1m']}")
