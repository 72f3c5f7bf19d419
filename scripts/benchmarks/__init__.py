"""The benchmarks run by scripts/bench.py: `_common` (shared infrastructure), one module per
benchmark (each registers itself with `@benchmark`), `_upstream` (the gateway benchmark's
loopback OpenAI-format server, run in its own process).

Kept free of imports: the children the benchmarks start (uvicorn serving
`benchmarks._common:uvicorn_app` or `benchmarks._upstream:app`) import this package too."""
