"""`ingress`: Ray Serve ingress vs plain uvicorn on the same app and the same route."""

from __future__ import annotations

import argparse
import contextlib
import os

from benchmarks._common import (
    BENCH_ENV,
    BENCH_RATE_LIMIT_PER_MINUTE,
    DEFAULT_REPLICAS,
    GENERATORS,
    WARMUP_S,
    Load,
    Result,
    benchmark,
    format_table,
    make_workdir,
    pick_generator,
    replicas_argument,
    replicas_argv,
    say,
    start_serve,
    start_uvicorn_app,
)

ROUTE = "/api/v1/whoami"


def _ingress_arguments(parser: argparse.ArgumentParser) -> None:
    replicas_argument(parser, "; uvicorn always runs one process")
    parser.add_argument(
        "--no-haproxy", action="store_true", help="use the standard Serve proxy instead of HAProxy"
    )


@benchmark(
    "ingress", "Ray Serve ingress vs plain uvicorn on GET /api/v1/whoami", _ingress_arguments
)
def ingress(args: argparse.Namespace) -> Result:
    generator = pick_generator(args.generator)
    load = GENERATORS[generator]
    with contextlib.ExitStack() as stack:
        workdir = make_workdir(stack, args.keep)
        env = {**os.environ, **BENCH_ENV}
        extra = replicas_argv(args)
        if args.no_haproxy:
            extra.append("--no-haproxy")
        service = start_serve(stack, workdir, env, extra)
        proxy, token = service.proxy, service.admin_token
        serve_url = service.url + ROUTE

        uvicorn_url = start_uvicorn_app(stack, workdir, service, env) + ROUTE

        targets = {"serve": serve_url, "uvicorn": uvicorn_url}
        for name, url in targets.items():
            _check_route(name, url, token)
            say(f"warming up {name} ({WARMUP_S:.0f}s)")
            load(url, token, args.concurrency, WARMUP_S, workdir)
        results: dict[str, Load] = {}
        for name, url in targets.items():
            say(
                f"loading {name} with {generator}: {args.concurrency} connections, "
                f"{args.duration:g}s"
            )
            results[name] = load(url, token, args.concurrency, args.duration, workdir)
    return _ingress_result(results, generator, proxy, args)


def _check_route(name: str, url: str, token: str) -> None:
    import httpx

    response = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if response.status_code != 200:
        raise RuntimeError(f"{name}: GET {url} answered {response.status_code}: {response.text}")


def _ingress_result(
    results: dict[str, Load], generator: str, proxy: str, args: argparse.Namespace
) -> Result:
    serve, plain = results["serve"], results["uvicorn"]
    ratio = serve.rps / plain.rps if plain.rps else None
    note = (
        "per-token rate limit on in both targets, with a budget of "
        f"{BENCH_RATE_LIMIT_PER_MINUTE:,} a minute"
    )
    data = {
        "serve_rps": round(serve.rps, 1),
        "uvicorn_rps": round(plain.rps, 1),
        "ratio": round(ratio, 3) if ratio is not None else None,
        "p50_ms": round(serve.p50_ms, 3),
        "p99_ms": round(serve.p99_ms, 3),
        "uvicorn_p50_ms": round(plain.p50_ms, 3),
        "uvicorn_p99_ms": round(plain.p99_ms, 3),
        "serve_errors": serve.errors,
        "uvicorn_errors": plain.errors,
        "generator": generator,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "route": f"GET {ROUTE}",
        "replicas": args.replicas or DEFAULT_REPLICAS,
        "serve_proxy": proxy,
        "cpus": os.cpu_count(),
        "rate_limit_per_minute": BENCH_RATE_LIMIT_PER_MINUTE,
        "note": note,
    }
    rows = [("target", "req/s", "p50 ms", "p99 ms", "errors")] + [
        (name, f"{r.rps:.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}", str(r.errors))
        for name, r in results.items()
    ]
    table = format_table(rows)
    proxy_name = {"haproxy": "HAProxy", "standard": "standard Serve"}.get(proxy, proxy)
    text = (
        f"ingress: GET {ROUTE} with the admin token; {generator}, {args.concurrency} "
        f"connections, {args.duration:g}s per target; "
        f"Serve: {args.replicas or DEFAULT_REPLICAS} replica(s), "
        f"{proxy_name} proxy; {os.cpu_count()} CPUs\n{note}\n\n{table}\n\n"
        f"ratio serve/uvicorn: {'n/a' if ratio is None else f'{ratio:.3f}'}"
    )
    if proxy == "standard" and not args.no_haproxy:
        text += "\nNOTE: HAProxy was asked for but the service fell back to the standard proxy"
    if serve.errors or plain.errors:
        text += "\nWARNING: some requests failed (errors column); their time is not in req/s"
    return Result(data, text)
