"""The model gateway: which upstream serves a model, in what order, and how failures are
survived (per-provider circuit breakers, retries before the first byte, fallback).

Order for a model (SPEC part 4: "local inference is the default; remote providers are the
fallback"): a local instance serving it; providers that list it (or `<provider>/<model>`
naming one); providers that list no models but whose kind serves such names (`claude-*` ->
anthropic...); then the same for each of `fallback_models[model]`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx

from orchestrator.config import PROVIDER_KINDS, Settings
from orchestrator.errors import BadRequest, ErrorCode, NotFound, ServiceUnavailable
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import _params
from orchestrator.providers._breaker import BreakerState, CircuitBreaker
from orchestrator.providers._client import UpstreamClient, upstream_client
from orchestrator.providers._count import estimate_tokens
from orchestrator.providers._registry import build_adapter, configured_providers
from orchestrator.providers._types import (
    ChatRequest,
    ChatResponse,
    Embeddings,
    EmbedRequest,
    MessageStart,
    ProviderAdapter,
    ProviderConfig,
    ProviderError,
    StreamEvent,
)
from orchestrator.runtime.backoff import Backoff

__all__ = ["Gateway", "LocalTarget", "Route", "RoutedStream"]

log = logging.getLogger("orchestrator.gateway")

T = TypeVar("T")

LOCAL_PROVIDER = "local"
LOCAL_REFRESH_S = 1.0
MAX_RETRY_SLEEP_S = 10.0

# Model-name prefixes a provider kind serves, for providers configured without a model list.
KIND_PREFIXES: dict[str, tuple[str, ...]] = {
    "openai": ("gpt-", "chatgpt-", "o1", "o3", "o4", "text-embedding-"),
    "anthropic": ("claude-",),
    "gemini": ("gemini-", "gemma-"),
    "zhipu": ("glm-",),
    "deepseek": ("deepseek-",),
    "qwen": ("qwen", "qwq-"),
    # Azure serves deployments (named by their owner): configure `models` or `deployments`
    # for other names.
    "azure_openai": ("gpt-", "o1", "o3", "o4", "text-embedding-"),
    "vertex": ("gemini-", "claude-", "text-embedding-", "text-multilingual-embedding-"),
    "bedrock": (
        "anthropic.",
        "amazon.",
        "meta.",
        "mistral.",
        "cohere.",
        "ai21.",
        "us.",
        "eu.",
        "apac.",
        "arn:aws:bedrock:",
    ),
}


class LocalTarget(Protocol):
    """A local inference instance that is ready to serve (see orchestrator.inference)."""

    @property
    def id(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def base_url(self) -> str: ...
    @property
    def api_key(self) -> str: ...  # its server's key: `Authorization: Bearer` on each call
    @property
    def tools(self) -> bool | None: ...  # whether its server takes tools (None: unknown)


LocalSource = Callable[[], Awaitable[Sequence[LocalTarget]]]


@dataclass(frozen=True, slots=True)
class Route:
    provider: str  # metric label and health name: the provider's name, or "local"
    breaker_key: str  # the provider's name, or the instance id
    adapter: ProviderAdapter
    model: str  # the model name the upstream knows
    # Whether the upstream takes `tools`: False only for a local server that said it takes
    # none (a hosted provider's models are taken to; one that does not answers a 400).
    tools: bool = True


@dataclass
class RoutedStream:
    """A stream whose first content has arrived (so the caller can still answer with an
    error status before that), with the route that serves it. `aclose()` must be called
    when the caller is done, even if it never iterated (a client that left before the
    body started): it settles the route's breaker and closes the upstream."""

    route: Route
    events: AsyncIterator[StreamEvent]
    settle: Callable[[], Awaitable[None]] | None = None

    async def aclose(self) -> None:
        await _aclose(self.events)  # runs the stream's own ending if it started
        if self.settle is not None:
            await self.settle()  # idempotent: a no-op when the stream settled itself


def _is_content(event: StreamEvent) -> bool:
    return not isinstance(event, MessageStart)


# Kinds whose requests are signed over their exact path (SigV4: Bedrock's model ids hold
# ':', percent-encoded as the AWS SDKs send them). aiohttp re-quotes a URL's path (%3A
# becomes ':'), so what arrives is not what was signed: these go through httpx's own pool,
# which sends the path byte for byte.
EXACT_PATH_KINDS = frozenset({"bedrock"})


class Gateway:
    def __init__(
        self,
        settings: Settings,
        recorder: MetricsRecorder,
        local: LocalSource | None = None,
        *,
        http: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._settings = settings
        self._recorder = recorder
        self._local_source = local
        self._sleep = sleep
        # Retries on one route: exact doublings (a peer's Retry-After is compared with them).
        self._retry_backoff = Backoff(
            base=settings.provider_retry_backoff_s, cap=MAX_RETRY_SLEEP_S, jitter=0
        )
        self._own_http = http is None
        self._http = http or upstream_client(settings)
        self._exact_http: httpx.AsyncClient | None = None
        self.configs: dict[str, ProviderConfig] = {
            c.name: c for c in configured_providers(settings)
        }
        self._adapters: dict[str, ProviderAdapter] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._breaker_labels: dict[str, str] = {}
        self._local: list[LocalTarget] = []
        self._local_at = 0.0
        self._local_lock = asyncio.Lock()
        self._local_adapters: dict[str, ProviderAdapter] = {}
        self._aliases: dict[str, str] = {}
        self._probes: dict[str, tuple[float, dict[str, Any]]] = {}
        for config in self.configs.values():
            alias = config.extra.get("alias")
            if alias:
                self._aliases[str(alias)] = config.name
        for name in self.configs:
            self.breaker(name)  # export every configured provider's state from the start

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()
        if self._exact_http is not None:
            await self._exact_http.aclose()

    # --- adapters and breakers ---------------------------------------------------------------
    def _client_for(self, config: ProviderConfig) -> httpx.AsyncClient:
        if config.kind not in EXACT_PATH_KINDS or not self._own_http:
            return self._http  # a client given by the caller is used as it is
        if self._exact_http is None:
            self._exact_http = UpstreamClient(
                timeout=self._http.timeout,
                limits=httpx.Limits(max_connections=200, keepalive_expiry=30.0),
                trust_env=False,
            )
        return self._exact_http

    def adapter(self, name: str) -> ProviderAdapter:
        adapter = self._adapters.get(name)
        if adapter is None:
            config = self.configs[name]
            adapter = self._adapters[name] = build_adapter(config, self._client_for(config))
        return adapter

    def breaker(self, key: str, label: str | None = None) -> CircuitBreaker:
        breaker = self._breakers.get(key)
        if breaker is None:
            metric = label or key
            self._breaker_labels[key] = metric
            breaker = self._breakers[key] = CircuitBreaker(
                self._settings.breaker_failure_threshold,
                self._settings.breaker_cooldown_s,
                on_change=lambda _: self._export_breaker(metric),
                trial_lease_s=self._settings.provider_timeout_s,
            )
            self._export_breaker(metric)
        return breaker

    def _export_breaker(self, label: str) -> None:
        """One gauge per label: the worst state among its breakers (every local instance
        has its own breaker, all labelled `local`)."""
        labels = self._breaker_labels
        states = [int(b.recorded_state) for k, b in self._breakers.items() if labels[k] == label]
        self._recorder.circuit_breaker(label, max(states, default=int(BreakerState.CLOSED)))

    def _local_adapter(self, target: LocalTarget) -> ProviderAdapter:
        key = f"{target.id}@{target.base_url}"
        adapter = self._local_adapters.get(key)
        if adapter is None:
            config = ProviderConfig(
                name=LOCAL_PROVIDER,
                kind="local",
                base_url=target.base_url.rstrip("/"),
                api_key=target.api_key or None,
                timeout_s=self._settings.provider_timeout_s,
                connect_timeout_s=self._settings.provider_connect_timeout_s,
            )
            adapter = self._local_adapters[key] = build_adapter(config, self._http)
        return adapter

    async def local_targets(self) -> list[LocalTarget]:
        """Ready local instances, re-read at most once a second (one indexed query)."""
        if self._local_source is None:
            return []
        now = time.monotonic()
        if now - self._local_at < LOCAL_REFRESH_S:
            return self._local
        async with self._local_lock:
            if time.monotonic() - self._local_at >= LOCAL_REFRESH_S:
                try:
                    self._local = list(await self._local_source())
                except Exception as exc:  # noqa: BLE001 - asyncpg, OS, timeouts alike
                    # The database is down: keep serving with what we knew.
                    log.warning("cannot refresh local instances: %s", exc)
                self._local_at = time.monotonic()
        return self._local

    # --- routing -----------------------------------------------------------------------------
    @property
    def http(self) -> httpx.AsyncClient:
        """The upstream HTTP client (pooled connections), for other callers of providers."""
        return self._http

    async def routes(self, model: str, *, fallback: bool = True) -> list[Route]:
        """Who serves `model`, in order; with `fallback`, then who serves each of its
        `fallback_models`."""
        if not model:
            raise BadRequest(
                "model is required", extra={"fields": [{"field": "model", "message": "required"}]}
            )
        out: list[Route] = []
        seen: set[tuple[str, str]] = set()
        fallbacks = self._settings.fallback_models.get(model, ()) if fallback else ()
        for candidate in (model, *fallbacks):
            for route in await self._routes_for(candidate):
                key = (route.breaker_key, route.model)
                if key not in seen:
                    seen.add(key)
                    out.append(route)
        if not out:
            raise NotFound(
                f"model {model!r} is not served by a local instance or a configured provider "
                "(GET /api/v1/models lists what is)",
                code=ErrorCode.MODEL_NOT_FOUND,
            )
        return out

    async def takes_tools(self, model: str) -> bool | None:
        """Whether every route that serves `model` takes tools (an agent step offers them
        only then: a call failing over to a route that takes none would fail); None when
        nothing serves the model now."""
        try:
            routes = await self.routes(model)
        except NotFound:
            return None
        return all(route.tools for route in routes)

    async def context_window(self, model: str) -> int | None:
        """The smallest context window of the local servers serving `model` (tokens); None
        when none does (a provider's model, or nothing ready)."""
        sizes = [
            size
            for t in await self.local_targets()
            if t.model == model and isinstance(size := getattr(t, "ctx_size", None), int)
        ]
        return min(sizes) if sizes else None

    async def _routes_for(self, model: str) -> list[Route]:
        out = [
            Route(LOCAL_PROVIDER, t.id, self._local_adapter(t), t.model, t.tools is not False)
            for t in await self.local_targets()
            if t.model == model
        ]
        prefix, sep, rest = model.partition("/")
        if sep and rest:
            name = self._aliases.get(prefix, prefix)
            if name in self.configs:
                return [*out, Route(name, name, self.adapter(name), rest)]
        listed = [c for c in self.configs.values() if model in c.models]
        by_kind = [
            c
            for c in self.configs.values()
            if not c.models and model.startswith(KIND_PREFIXES.get(c.kind, ()) or ("\0",))
        ]
        out.extend(Route(c.name, c.name, self.adapter(c.name), model) for c in listed + by_kind)
        return out

    # --- calls -------------------------------------------------------------------------------
    def _fit(self, request: ChatRequest, route: Route) -> ChatRequest:
        """`request` for `route`: its model name, and only the optional fields the route's
        provider declares (400 naming the others unless `drop_unsupported_params`)."""
        routed = request.with_model(route.model)
        if not request.params:
            return routed
        drop = self._settings.drop_unsupported_params
        kept = _params.fit(
            request.params, route.adapter, route.provider, drop=drop, model=route.model
        )
        if "user" in request.params and "user" not in kept:
            routed = dataclasses.replace(routed, user=None)  # the caller's, dropped
        return dataclasses.replace(routed, params=kept)

    async def complete(self, request: ChatRequest) -> tuple[ChatResponse, Route]:
        async def call(route: Route) -> ChatResponse:
            return await route.adapter.complete(self._fit(request, route))

        return await self._with_failover(request.model, call)

    async def open_stream(self, request: ChatRequest) -> RoutedStream:
        """Start streaming: retries and fallback happen until the first event arrives;
        after that, an upstream failure is raised from the returned iterator."""

        async def call(route: Route) -> RoutedStream:
            started = time.perf_counter()
            upstream = route.adapter.stream(self._fit(request, route))
            # Read up to the first content (a block, or the end): an upstream that fails
            # right after message_start can still be retried or fall back.
            head: list[StreamEvent] = []
            try:
                while not head or not _is_content(head[-1]):
                    head.append(await anext(upstream))
            except StopAsyncIteration as exc:
                await _aclose(upstream)
                raise ProviderError(
                    f"{route.provider}: empty stream", provider=route.provider, retryable=True
                ) from exc
            except BaseException:
                await _aclose(upstream)
                raise
            settlement = _Settlement(self.breaker(route.breaker_key, route.provider), upstream)
            events = self._rest(route, head, upstream, started, settlement)
            return RoutedStream(route, events, settlement.release)

        stream, _ = await self._with_failover(request.model, call, settle=False)
        return stream

    async def _rest(
        self,
        route: Route,
        head: list[StreamEvent],
        upstream: AsyncIterator[StreamEvent],
        started: float,
        settlement: _Settlement,
    ) -> AsyncIterator[StreamEvent]:
        try:
            for event in head:
                yield event
            async for event in upstream:
                yield event
            settlement.success()
        except ProviderError as exc:
            if _provider_fault(exc):
                settlement.failure(exc.message)
            raise
        finally:
            await settlement.release()
            self._recorder.provider_latency(route.provider, time.perf_counter() - started)

    async def count_tokens(self, request: ChatRequest) -> tuple[int, str]:
        """The prompt of `request` in tokens, and who counted: "provider" (the first route
        whose provider has a counting endpoint, when it answers) or "estimate" (ours:
        `_count.estimate_tokens`). A count the provider refuses as a bad request is that
        400; one it cannot give (unreachable, 5xx, breaker open) falls back to the estimate."""
        routes = await self.routes(request.model)
        route = routes[0]
        counter = getattr(route.adapter, "count_tokens", None)
        if counter is None or not self.breaker(route.breaker_key, route.provider).allow():
            return estimate_tokens(request), "estimate"
        breaker = self.breaker(route.breaker_key, route.provider)
        try:
            count = await counter(request.with_model(route.model))
        except ProviderError as exc:
            if _provider_fault(exc) or exc.upstream_status in (404, 405):
                # No counting endpoint there after all (a 404), or the provider is failing:
                # a count is no model call, it does not judge the provider.
                breaker.release()
                log.info("count_tokens by %s failed, estimating: %s", route.provider, exc)
                return estimate_tokens(request), "estimate"
            breaker.release()
            raise exc.to_http() from exc
        except BaseException:
            breaker.release()
            raise
        breaker.release()
        return int(count), "provider"

    async def embed(self, request: EmbedRequest) -> tuple[Embeddings, Route]:
        """Embeddings from the first route of `request.model` that answers, with the same
        retries, breakers and error mapping as chat. No `fallback_models`: another model's
        vectors live in another space. An answer of the wrong shape or count is the
        provider's fault (a 200 that is no valid answer)."""

        async def call(route: Route) -> Embeddings:
            routed = dataclasses.replace(request, model=route.model)
            try:
                out = await route.adapter.embed(routed)
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise _malformed(route, repr(exc)) from exc
            if len(out.vectors) != len(request.texts):
                raise _malformed(route, f"{len(out.vectors)} vectors for {len(request.texts)}")
            return out

        return await self._with_failover(request.model, call, fallback=False)

    async def _with_failover(
        self,
        model: str,
        call: Callable[[Route], Awaitable[T]],
        *,
        settle: bool = True,
        fallback: bool = True,
    ) -> tuple[T, Route]:
        """Try each route in order. On a route: skip it while its breaker is open; retry a
        retryable failure with backoff (the upstream's Retry-After wins); move on after a
        failure that is the provider's fault or a 404 (it does not serve the model). A
        failure that is the request's fault (400, 413, 422) is raised at once.
        `settle=False`: a success is recorded by the caller (a stream, when it ends)."""
        routes = await self.routes(model, fallback=fallback)
        last: ProviderError | None = None
        skipped_retry_in: list[float] = []
        for route in routes:
            breaker = self.breaker(route.breaker_key, route.provider)
            attempt = 0
            while True:
                if not breaker.allow():
                    skipped_retry_in.append(breaker.retry_in_s)
                    break
                started = time.perf_counter()
                try:
                    result = await call(route)
                except ProviderError as exc:
                    last = exc
                    if settle:
                        self._recorder.provider_latency(
                            route.provider, time.perf_counter() - started
                        )
                    if _provider_fault(exc):
                        breaker.failure(exc.message)
                    else:
                        breaker.release()
                    if exc.upstream_status == 404:
                        break  # this upstream lacks the model: try the next
                    if not _provider_fault(exc):
                        raise exc.to_http() from exc
                    delay = self._retry_delay(exc, attempt)
                    if not exc.retryable or delay is None:
                        break
                    attempt += 1
                    log.info(
                        "retrying %s (%s) in %.2fs: %s", route.provider, model, delay, exc.message
                    )
                    await self._sleep(delay)
                    continue
                except BaseException:
                    breaker.release()
                    raise
                if settle:
                    breaker.success()
                    self._recorder.provider_latency(route.provider, time.perf_counter() - started)
                return result, route
        if last is not None:
            raise last.to_http() from last
        raise _unavailable(model, min(skipped_retry_in, default=self._settings.breaker_cooldown_s))

    def _retry_delay(self, exc: ProviderError, attempt: int) -> float | None:
        """Seconds to wait before the next attempt on the same route; None: no more."""
        if attempt >= self._settings.provider_retries:
            return None
        delay = self._retry_backoff.delay(attempt + 1)
        if exc.retry_after is not None:
            if exc.retry_after > MAX_RETRY_SLEEP_S:
                return None  # not worth holding the caller: fall back instead
            delay = max(delay, float(exc.retry_after))
        return delay

    # --- health ------------------------------------------------------------------------------
    def provider_names(self) -> list[str]:
        """Every provider kind (configured or not), custom adapters, and `local`."""
        return [*PROVIDER_KINDS, *(n for n in self.configs if n not in PROVIDER_KINDS), "local"]

    def summary(self) -> tuple[int, int]:
        """(configured providers, healthy ones) without probing: healthy = breaker not open
        and the last probe, if any, reached it. Cheap enough for every /health call."""
        healthy = 0
        for name in self.configs:
            probe = self._probes.get(name)
            if probe is not None and not probe[1]["reachable"]:
                continue
            breaker = self._breakers.get(name)
            if breaker is None or breaker.state is not BreakerState.OPEN:
                healthy += 1
        return len(self.configs), healthy

    async def health(self, name: str | None = None) -> dict[str, dict[str, Any]]:
        """Per provider: configured, reachable (a real probe, cached for
        `provider_health_ttl_s`; None when not configured), breaker state, last error."""
        names = self.provider_names()
        if name is not None:
            if name not in names:
                raise NotFound(f"unknown provider {name!r}; known: {', '.join(names)}")
            names = [name]
        results = await asyncio.gather(*(self._health_of(n) for n in names))
        return dict(zip(names, results, strict=True))

    async def _health_of(self, name: str) -> dict[str, Any]:
        if name == LOCAL_PROVIDER:
            targets = await self.local_targets()
            return {
                "configured": bool(targets),
                "reachable": bool(targets) or None,
                "instances": len(targets),
                "models": sorted({t.model for t in targets}),
                **self._breaker_view(*(t.id for t in targets)),
            }
        config = self.configs.get(name)
        if config is None:
            return {
                "configured": False,
                "reachable": None,
                "breaker": "closed",
                "breaker_state": 0,
                "last_error": None,
            }
        probe = await self._probe(name)
        return {
            "configured": True,
            "kind": config.kind,
            "base_url": config.base_url,
            "models": list(config.models),
            **probe,
            **self._breaker_view(name),
        }

    async def _probe(self, name: str) -> dict[str, Any]:
        ttl = self._settings.provider_health_ttl_s
        cached = self._probes.get(name)
        now = time.monotonic()
        if cached is not None and now - cached[0] < ttl:
            return cached[1]
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._settings.provider_connect_timeout_s + 1.0):
                await self.adapter(name).probe()
        except ProviderError as exc:
            result: dict[str, Any] = {"reachable": False, "probe_error": exc.message}
        except TimeoutError:
            result = {"reachable": False, "probe_error": f"{name}: probe timed out"}
        else:
            result = {"reachable": True, "probe_error": None}
        result["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
        result["checked_at"] = int(time.time() * 1000)
        self._probes[name] = (time.monotonic(), result)
        return result

    def _breaker_view(self, *keys: str) -> dict[str, Any]:
        """The worst breaker among `keys` (a provider, or each local instance)."""
        breakers = [self._breakers[k] for k in keys if k in self._breakers]
        if not breakers:
            return {"breaker": "closed", "breaker_state": 0, "last_error": None}
        worst = max(breakers, key=lambda b: int(b.state))
        errors = [b.last_error for b in breakers if b.last_error]
        return {
            "breaker": worst.state.name.lower(),
            "breaker_state": int(worst.state),
            "last_error": errors[-1] if errors else None,
        }


class _Settlement:
    """The one outcome of a streamed call for its breaker, told once: success, failure, or
    (anything else: the caller went away) release. Closes the upstream."""

    def __init__(self, breaker: CircuitBreaker, upstream: AsyncIterator[StreamEvent]) -> None:
        self._breaker = breaker
        self._upstream = upstream
        self._told = False
        self._closed = False

    def success(self) -> None:
        if not self._told:
            self._told = True
            self._breaker.success()

    def failure(self, error: str) -> None:
        if not self._told:
            self._told = True
            self._breaker.failure(error)

    async def release(self) -> None:
        if not self._told:
            self._told = True
            self._breaker.release()
        if not self._closed:
            self._closed = True
            await _aclose(self._upstream)


def _provider_fault(exc: ProviderError) -> bool:
    """Does this failure say something about the provider's health (counts for its breaker
    and justifies trying elsewhere)? A 4xx other than 401/403/408/429 is about the request;
    0 (unreachable, timeout) and a 200 that is no valid answer are the provider's."""
    s = exc.upstream_status
    return s in (0, 200) or s >= 500 or s in (401, 403, 408, 429)


async def _aclose(iterator: AsyncIterator[Any]) -> None:
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


def _malformed(route: Route, detail: str) -> ProviderError:
    return ProviderError(
        f"{route.provider}: malformed embeddings answer: {detail}",
        provider=route.provider,
        upstream_status=200,
    )


def _unavailable(model: str, retry_in: float) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"every provider of model {model!r} is failing (circuit breakers open); "
        f"retry in {max(1, round(retry_in))} s",
        code=ErrorCode.CIRCUIT_OPEN,
        headers={"Retry-After": str(max(1, round(retry_in)))},
    )
