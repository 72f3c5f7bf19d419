"""`gateway`: the latency and throughput cost of the model gateway.

Three targets answer the same OpenAI chat completion: the loopback upstream called directly
(`_upstream`, its own process), `POST /api/v1/chat/completions` of `orchestrator serve`
(HAProxy -> Serve replica -> our FastAPI app -> the upstream), and the same FastAPI app under
one plain uvicorn process against the same Postgres and Redis. Per target: non-streaming
latency at concurrency 1 (p50/p99), streaming time to first token at concurrency 1, and
non-streaming throughput at `--concurrency` (32). uvicorn - direct is our app's cost;
serve - uvicorn is what Serve and HAProxy add on top.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import (
    BENCH_ENV,
    BENCH_RATE_LIMIT_PER_MINUTE,
    DEFAULT_REPLICAS,
    GENERATORS,
    UVICORN_START_TIMEOUT_S,
    WARMUP_S,
    Child,
    Generator,
    Load,
    Result,
    benchmark,
    format_table,
    free_port,
    host_busy_pct,
    host_cpu_times,
    make_workdir,
    percentile,
    pick_generator,
    replicas_argument,
    replicas_argv,
    run_async,
    say,
    start_serve,
    start_uvicorn_app,
    uvicorn_command,
    wait_for_http,
)
from benchmarks._upstream import MODEL, REPLY_TEXT

ROUTE = "/api/v1/chat/completions"
UPSTREAM_ROUTE = "/v1/chat/completions"
UPSTREAM_KEY = "bench"
TARGET_P50_ADDED_MS = 1.0  # at concurrency 1
TARGET_P99_ADDED_MS = 5.0  # at concurrency 1
TARGET_TTFT_ADDED_MS = 2.0  # p50
TTFT_WARMUP_S = 1.0
STREAM_TIMEOUT_S = 10.0
REQUEST: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 16,
}
STREAM_REQUEST: dict[str, Any] = {
    **REQUEST,
    "stream": True,
    "stream_options": {"include_usage": True},
}
TARGETS = ("direct", "uvicorn", "serve")


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    token: str


@dataclass(frozen=True)
class Streams:
    """Sequential streaming requests against one target."""

    count: int
    errors: int
    ttft_ms: list[float]  # sorted: send to the first `data:` frame carrying content
    whole_ms: list[float]  # sorted: send to the end of the stream
    elapsed_s: float
    client_cpu_s: float


def _gateway_arguments(parser: argparse.ArgumentParser) -> None:
    replicas_argument(parser, "; uvicorn always runs one process")
    parser.add_argument(
        "--no-haproxy", action="store_true", help="use the standard Serve proxy instead of HAProxy"
    )


def start_upstream(stack: contextlib.ExitStack, workdir: Path) -> str:
    """The loopback OpenAI-format upstream in its own uvicorn process; its base URL."""
    port = free_port()
    upstream = Child(
        "upstream",
        uvicorn_command("benchmarks._upstream:app", port),
        workdir / "upstream.log",
        {**os.environ, "BENCH_UPSTREAM_KEY": UPSTREAM_KEY},
    )
    stack.callback(upstream.stop)
    upstream.start()
    base_url = f"http://127.0.0.1:{port}"
    wait_for_http(upstream, f"{base_url}/health", UVICORN_START_TIMEOUT_S)
    return base_url


def _content_of(payload: str) -> str:
    """The text a `chat.completion.chunk` carries ("" for role, finish and usage chunks)."""
    chunk = json.loads(payload)
    return "".join(
        str((choice.get("delta") or {}).get("content") or "")
        for choice in chunk.get("choices") or []
    )


def _check_target(target: Target) -> None:
    """One non-streaming and one streaming call: both must carry the upstream's reply."""
    import httpx

    headers = {"Authorization": f"Bearer {target.token}"}
    with httpx.Client(headers=headers, timeout=30) as http:
        response = http.post(target.url, json=REQUEST)
        if response.status_code != 200:
            raise RuntimeError(
                f"{target.name}: POST {target.url} answered {response.status_code}: "
                f"{response.text[:500]}"
            )
        text = response.json()["choices"][0]["message"]["content"]
        if text != REPLY_TEXT:
            raise RuntimeError(f"{target.name}: answered {text!r}, not {REPLY_TEXT!r}")
        with http.stream("POST", target.url, json=STREAM_REQUEST) as stream:
            if stream.status_code != 200:
                stream.read()
                raise RuntimeError(
                    f"{target.name}: streaming POST {target.url} answered "
                    f"{stream.status_code}: {stream.text[:500]}"
                )
            payloads = [
                line[5:].strip() for line in stream.iter_lines() if line.startswith("data:")
            ]
    if not payloads or payloads[-1] != "[DONE]":
        raise RuntimeError(f"{target.name}: the stream did not end with data: [DONE]")
    chunks = [json.loads(p) for p in payloads[:-1]]
    streamed = "".join(_content_of(p) for p in payloads[:-1])
    if streamed != REPLY_TEXT:
        raise RuntimeError(f"{target.name}: streamed {streamed!r}, not {REPLY_TEXT!r}")
    if not any(c.get("usage") for c in chunks):
        raise RuntimeError(f"{target.name}: no usage chunk despite include_usage")


class _StreamClient:
    """A bare HTTP/1.1 client for the streaming runs: one keep-alive connection, one fixed
    POST, the chunked SSE body read frame by frame. httpx measured ~1.5 ms of client time
    per stream here, and a client that busy competes for the CPUs with what it measures."""

    def __init__(self, url: str, token: str, body: bytes) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.request = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def stream(self) -> float | None:
        """Send the request and read the whole answer; the time of the first `data:` frame
        carrying content, or None when the answer was not a complete 200 stream with it."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.reader, self.writer
        assert reader is not None
        writer.write(self.request)
        status = int((await reader.readline()).split()[1])
        headers: dict[bytes, bytes] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if headers.get(b"transfer-encoding") != b"chunked":
            await reader.readexactly(int(headers.get(b"content-length", b"0")))
            return None
        first: float | None = None
        done = False
        pending = b""
        while size := int((await reader.readline()).split(b";")[0], 16):
            pending += (await reader.readexactly(size + 2))[:-2]
            *frames, pending = pending.split(b"\n\n")
            for frame in frames:
                if not frame.startswith(b"data:"):
                    continue  # a heartbeat comment
                payload = frame[5:].strip()
                if payload == b"[DONE]":
                    done = True
                elif first is None and _content_of(payload.decode()):
                    first = time.perf_counter()
        await reader.readline()  # the CRLF after the last chunk
        if headers.get(b"connection") == b"close":
            await self.close()
        return first if status == 200 and done else None


async def _streams(target: Target, duration_s: float) -> Streams:
    """Streaming requests back to back on one keep-alive connection for `duration_s`."""
    client = _StreamClient(target.url, target.token, json.dumps(STREAM_REQUEST).encode())
    ttft: list[float] = []
    whole: list[float] = []
    count = errors = 0
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + duration_s
    try:
        while (t0 := time.perf_counter()) < deadline:
            count += 1
            try:
                first = await asyncio.wait_for(client.stream(), STREAM_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError):
                await client.close()  # the connection's state is unknown: start afresh
                first = None
            if first is None:
                errors += 1
            else:
                ttft.append((first - t0) * 1000)
                whole.append((time.perf_counter() - t0) * 1000)
    finally:
        await client.close()
    return Streams(
        count=count,
        errors=errors,
        ttft_ms=sorted(ttft),
        whole_ms=sorted(whole),
        elapsed_s=time.perf_counter() - start,
        client_cpu_s=time.process_time() - cpu0,
    )


@benchmark(
    "gateway",
    "added latency of POST /api/v1/chat/completions vs calling the upstream directly",
    _gateway_arguments,
    duration_s=5.0,
    concurrency=32,
)
def gateway(args: argparse.Namespace) -> Result:
    generator = pick_generator(args.generator)
    load: Generator = GENERATORS[generator]
    body = json.dumps(REQUEST)
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        upstream_url = start_upstream(stack, workdir)
        providers = {
            "openai": {
                "base_url": f"{upstream_url}/v1",
                "api_key": UPSTREAM_KEY,
                "models": [MODEL],
            }
        }
        env = {**os.environ, **BENCH_ENV, "ORCH_PROVIDERS": json.dumps(providers)}
        extra = replicas_argv(args)
        if args.no_haproxy:
            extra.append("--no-haproxy")
        service = start_serve(stack, workdir, env, extra)
        baseline: list[Child] = []
        uvicorn_url = start_uvicorn_app(stack, workdir, service, env, baseline)
        (uvicorn_child,) = baseline

        def alone(target: Target) -> contextlib.AbstractContextManager[None]:
            """While another target is measured, the uvicorn baseline is stopped: idle, it
            still follows the event feed (every measured call adds an event) and runs its
            timers, on the same two cores. (The service cannot be stopped: its idle actors
            run while uvicorn is measured, which bounds uvicorn's single process less than
            the host bounds the service.)"""
            return contextlib.nullcontext() if target.name == "uvicorn" else uvicorn_child.paused()

        targets = [
            Target("direct", upstream_url + UPSTREAM_ROUTE, UPSTREAM_KEY),
            Target("uvicorn", uvicorn_url + ROUTE, service.admin_token),
            Target("serve", service.url + ROUTE, service.admin_token),
        ]
        for target in targets:
            _check_target(target)
            say(f"warming up {target.name} ({WARMUP_S:.0f}s + {TTFT_WARMUP_S:.0f}s streaming)")
            load(target.url, target.token, args.concurrency, WARMUP_S, workdir, body)
            run_async(functools.partial(_streams, target, TTFT_WARMUP_S))

        # Phase by phase, each target in turn: drift on a shared host hits all three alike.
        latency: dict[str, Load] = {}
        for target in targets:
            say(f"c=1 non-streaming: {target.name} with {generator}, {args.duration:g}s")
            with alone(target):
                latency[target.name] = load(
                    target.url, target.token, 1, args.duration, workdir, body
                )
        streams: dict[str, Streams] = {}
        for target in targets:
            say(f"c=1 streaming (TTFT): {target.name}, {args.duration:g}s")
            with alone(target):
                streams[target.name] = run_async(functools.partial(_streams, target, args.duration))
        loaded: dict[str, Load] = {}
        busy: dict[str, float | None] = {}
        for target in targets:
            say(
                f"c={args.concurrency} non-streaming: {target.name} with {generator}, "
                f"{args.duration:g}s"
            )
            with alone(target):
                host0 = host_cpu_times()
                loaded[target.name] = load(
                    target.url, target.token, args.concurrency, args.duration, workdir, body
                )
                busy[target.name] = host_busy_pct(host0)
    return _gateway_result(latency, streams, loaded, busy, generator, service.proxy, args)


def _num(value: float) -> float | None:
    """Rounded for JSON; None for a figure not measured (NaN: no successful sample)."""
    return None if math.isnan(value) else round(value, 3)


def _diff(a: float, b: float) -> float | None:
    return _num(a - b)


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _pct(cpu_s: float, elapsed_s: float) -> str:
    return f"{cpu_s / elapsed_s:.0%}" if elapsed_s else "n/a"


def _gateway_result(
    latency: dict[str, Load],
    streams: dict[str, Streams],
    loaded: dict[str, Load],
    busy: dict[str, float | None],
    generator: str,
    proxy: str,
    args: argparse.Namespace,
) -> Result:
    n = args.concurrency
    cpus = os.cpu_count() or 1
    replicas = args.replicas or DEFAULT_REPLICAS
    proxy_name = {"haproxy": "HAProxy", "standard": "standard Serve"}.get(proxy, proxy)
    labels = {
        "direct": "direct upstream",
        "uvicorn": "uvicorn (our app)",
        "serve": f"serve (Serve + {proxy_name} proxy)",
    }
    ttft = {k: (percentile(s.ttft_ms, 50), percentile(s.ttft_ms, 99)) for k, s in streams.items()}

    data: dict[str, Any] = {
        # the headline: through `orchestrator serve` against the upstream directly
        "p50_added_ms": _diff(latency["serve"].p50_ms, latency["direct"].p50_ms),
        "p99_added_ms": _diff(latency["serve"].p99_ms, latency["direct"].p99_ms),
        "ttft_added_ms": _diff(ttft["serve"][0], ttft["direct"][0]),
        "ttft_p99_added_ms": _diff(ttft["serve"][1], ttft["direct"][1]),
        "throughput_ratio": _ratio(loaded["serve"].rps, loaded["direct"].rps),
        # our app alone (plain uvicorn) against the upstream directly
        "app_p50_added_ms": _diff(latency["uvicorn"].p50_ms, latency["direct"].p50_ms),
        "app_p99_added_ms": _diff(latency["uvicorn"].p99_ms, latency["direct"].p99_ms),
        "app_ttft_added_ms": _diff(ttft["uvicorn"][0], ttft["direct"][0]),
        "app_throughput_ratio": _ratio(loaded["uvicorn"].rps, loaded["direct"].rps),
        # Serve + its proxy on top of the app
        "ingress_p50_added_ms": _diff(latency["serve"].p50_ms, latency["uvicorn"].p50_ms),
        "ingress_p99_added_ms": _diff(latency["serve"].p99_ms, latency["uvicorn"].p99_ms),
        "ingress_ttft_added_ms": _diff(ttft["serve"][0], ttft["uvicorn"][0]),
        "ingress_throughput_ratio": _ratio(loaded["serve"].rps, loaded["uvicorn"].rps),
    }
    for name in TARGETS:
        lat, st, ld, host = latency[name], streams[name], loaded[name], busy[name]
        data |= {
            f"{name}_p50_ms": round(lat.p50_ms, 3),
            f"{name}_p99_ms": round(lat.p99_ms, 3),
            f"{name}_requests": lat.requests,
            f"{name}_ttft_p50_ms": _num(ttft[name][0]),
            f"{name}_ttft_p99_ms": _num(ttft[name][1]),
            f"{name}_stream_p50_ms": _num(percentile(st.whole_ms, 50)),
            f"{name}_streams": st.count,
            f"{name}_rps": round(ld.rps, 1),
            f"{name}_loaded_p50_ms": round(ld.p50_ms, 3),
            f"{name}_loaded_p99_ms": round(ld.p99_ms, 3),
            f"{name}_errors": lat.errors + st.errors + ld.errors,
            f"{name}_loaded_client_cpu_pct": round(100 * ld.client_cpu_s / ld.duration_s, 1)
            if ld.duration_s
            else None,
            f"{name}_loaded_host_busy_pct": None if host is None else round(host, 1),
        }
    data |= {
        "generator": generator,
        "concurrency": n,
        "duration_s": args.duration,
        "route": f"POST {ROUTE}",
        "model": MODEL,
        "replicas": replicas,
        "serve_proxy": proxy,
        "cpus": cpus,
        "rate_limit_per_minute": BENCH_RATE_LIMIT_PER_MINUTE,
    }

    c1_rows = [("c=1, non-streaming", "requests", "p50 ms", "p99 ms", "errors", "client CPU")]
    c1_rows += [
        (
            labels[k],
            str(r.requests),
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            str(r.errors),
            _pct(r.client_cpu_s, r.duration_s),
        )
        for k, r in latency.items()
    ]
    stream_rows = [
        (
            "c=1, streaming",
            "streams",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "whole p50 ms",
            "errors",
            "client CPU",
        )
    ]
    stream_rows += [
        (
            labels[k],
            str(s.count),
            f"{ttft[k][0]:.2f}",
            f"{ttft[k][1]:.2f}",
            f"{percentile(s.whole_ms, 50):.2f}",
            str(s.errors),
            _pct(s.client_cpu_s, s.elapsed_s),
        )
        for k, s in streams.items()
    ]
    direct_rps = loaded["direct"].rps
    loaded_rows = [
        (
            f"c={n}, non-streaming",
            "req/s",
            "x direct",
            "p50 ms",
            "p99 ms",
            "errors",
            "client CPU",
            "host busy",
        )
    ]
    loaded_rows += [
        (
            labels[k],
            f"{r.rps:.0f}",
            f"{r.rps / direct_rps:.3f}" if direct_rps else "n/a",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            str(r.errors),
            _pct(r.client_cpu_s, r.duration_s),
            "n/a" if busy[k] is None else f"{busy[k]:.0f}%",
        )
        for k, r in loaded.items()
    ]

    def ratio_text(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    added_rows = [
        (
            "added (difference of percentiles)",
            "c=1 p50 ms",
            "c=1 p99 ms",
            "TTFT p50 ms",
            f"c={n} req/s ratio",
        ),
    ]
    for label, key in (
        ("our app (uvicorn - direct)", "app_"),
        (f"Serve + {proxy_name} (serve - uvicorn)", "ingress_"),
        ("total (serve - direct)", ""),
    ):
        added_rows.append(
            (
                label,
                _signed(data[f"{key}p50_added_ms"]),
                _signed(data[f"{key}p99_added_ms"]),
                _signed(data[f"{key}ttft_added_ms"]),
                ratio_text(data[f"{key}throughput_ratio"]),
            )
        )

    note = (
        f"What is measured: the same chat completion (model {MODEL!r}, a fixed "
        f"{len(REPLY_TEXT)}-character reply) asked of the loopback upstream directly, of our "
        f"FastAPI app under one plain uvicorn process, and of `orchestrator serve` "
        f"({replicas} replica(s), {proxy_name} proxy), both of which decode the request, "
        f"authenticate the bearer, route the model, call the same upstream over HTTP "
        f"keep-alive, encode the answer back and record the call. Added latency is the "
        f"difference of the percentiles of separate runs, not a percentile of per-request "
        f"differences, so the p99 figures are noisy. TTFT is the time from sending the "
        f"request to the first `data:` frame whose delta carries content; the upstream "
        f"writes its whole reply at once, so it is close to the whole stream's time. "
        f"Non-streaming load: {generator}; streaming: a bare asyncio HTTP/1.1 client on one "
        f"keep-alive connection. The client, the upstream, uvicorn and the service share "
        f"the host's {cpus} CPUs (client CPU: the client's CPU time over the run; host "
        f"busy: all CPUs); the uvicorn process is stopped (SIGSTOP) while the other targets "
        f"are measured; the per-token rate limit is on, with a budget of "
        f"{BENCH_RATE_LIMIT_PER_MINUTE:,} requests a minute that no run reaches."
    )
    data["note"] = note

    verdicts = []
    for key, limit, what in (
        ("p50_added_ms", TARGET_P50_ADDED_MS, "p50 added at c=1"),
        ("p99_added_ms", TARGET_P99_ADDED_MS, "p99 added at c=1"),
        ("ttft_added_ms", TARGET_TTFT_ADDED_MS, "TTFT added (p50)"),
    ):
        value, app = data[key], data[f"app_{key}"]
        met = value is not None and value <= limit
        data[f"target_{key}_met"] = met
        verdicts.append(
            f"{what} <= {limit:g} ms: {'met' if met else 'NOT met'} "
            f"({'n/a' if value is None else f'{value:.2f} ms'}; "
            f"our app alone {'n/a' if app is None else f'{app:.2f} ms'})"
        )

    text = (
        f"gateway: POST {ROUTE} vs POST {UPSTREAM_ROUTE} of the upstream directly; "
        f"{args.duration:g}s per measurement; Serve: {replicas} replica(s), {proxy_name} "
        f"proxy; {cpus} CPUs\n\n"
        f"{format_table(c1_rows)}\n\n{format_table(stream_rows)}\n\n"
        f"{format_table(loaded_rows)}\n\n{format_table(added_rows)}\n\n"
        f"{note}\n\n" + "\n".join(verdicts)
    )
    if proxy == "standard" and not args.no_haproxy:
        text += "\nNOTE: HAProxy was asked for but the service fell back to the standard proxy"
    if any(data[f"{name}_errors"] for name in TARGETS):
        text += "\nWARNING: some requests failed (errors columns); they are not in the figures"
    return Result(data, text)
