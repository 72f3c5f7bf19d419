"""`telemetry`: what request telemetry costs per request, in-process (no HTTP, no Ray).

Measured over `--requests` (200,000) calls each: the request metrics as the RequestRecords
layer (deployments/layers/records.py) records them (a counter, the SLO's per-second buckets
and the per-route duration histogram), and the access line (`access_log: true`) formatted
as JSON and as text into a file behind a 1,000-record MemoryHandler, as Serve's
throughput-optimized replicas write it. The baseline, measured beside them, is the counter
and SLO buckets alone (what the request middleware recorded before the histogram): ratios
are against it.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import Result, benchmark, format_table, say

ROUTES = ("/api/v1/whoami", "/api/v1/workflows/{workflow_id}", "/api/v1/chat/completions")


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=200_000, help="calls per measure")


def _per_call_us(fn: Callable[[int], None], n: int) -> float:
    fn(0)  # warm
    started = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - started) / n * 1e6


@benchmark(
    "telemetry",
    "per-request cost of request metrics and the JSON access line vs the counter alone",
    _arguments,
    duration_s=1,
)
def telemetry(args: argparse.Namespace) -> Result:
    from orchestrator.observability import JsonFormatter, MetricsRecorder, log_access
    from orchestrator.observability._recorder import bucket_index

    n = args.requests
    counts: dict[tuple[str, str, int], int] = {}
    seconds: dict[int, list[int]] = {}

    def baseline(i: int) -> None:
        key = ("GET", ROUTES[i % 3], 200)
        counts[key] = counts.get(key, 0) + 1
        slot = seconds.setdefault(int(time.time()), [0] * 26)
        slot[bucket_index(0.012)] += 1

    recorder = MetricsRecorder("bench")

    def metrics(i: int) -> None:
        recorder.http_request("GET", ROUTES[i % 3], 200 if i % 10 else 404, 0.012)

    def access_line(formatter: logging.Formatter, path: Path) -> Callable[[int], None]:
        logger = logging.getLogger(f"bench.access.{path.name}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        target = logging.FileHandler(path)
        target.setFormatter(formatter)
        logger.addHandler(logging.handlers.MemoryHandler(1000, target=target))

        def log(i: int) -> None:
            log_access(
                request_id=f"req-{i}",
                user="alice",
                method="GET",
                route=ROUTES[i % 3],
                status=200,
                duration_ms=12.0,
                logger=logger,
            )

        return log

    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        say(f"telemetry: {n} calls per measure")
        base_us = _per_call_us(baseline, n)
        metrics_us = _per_call_us(metrics, n)
        json_us = _per_call_us(access_line(JsonFormatter(), Path(tmp) / "json.log"), n)
        text_fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        text_us = _per_call_us(access_line(text_fmt, Path(tmp) / "text.log"), n)
    data = {
        "requests": n,
        "baseline_counter_us": round(base_us, 3),
        "metrics_with_histogram_us": round(metrics_us, 3),
        "access_line_json_us": round(json_us, 3),
        "access_line_text_us": round(text_us, 3),
        "metrics_x_baseline": round(metrics_us / base_us, 2),
        "access_json_x_baseline": round(json_us / base_us, 1),
    }
    rows = [
        ["per request", "us", "x baseline"],
        ["counter + SLO buckets (baseline)", f"{base_us:.2f}", "1.0"],
        [
            "request metrics with the route histogram",
            f"{metrics_us:.2f}",
            f"{metrics_us / base_us:.1f}",
        ],
        ["access line, JSON", f"{json_us:.2f}", f"{json_us / base_us:.1f}"],
        ["access line, text", f"{text_us:.2f}", f"{text_us / base_us:.1f}"],
    ]
    return Result(data, format_table(rows))
