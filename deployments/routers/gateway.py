"""SPEC part 4: POST /chat/completions (OpenAI format), POST /messages (Anthropic Messages
format), GET /providers/health[/<provider>]. Either endpoint reaches any configured model:
the request is decoded into the internal conversation, routed by the gateway, and the answer
encoded back into the caller's format."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from deployments.deps import CurrentUser, ModelGateway, principal_of, services_of
from deployments.errors import request_id_of
from deployments.json_route import JsonRoute
from orchestrator._json import dumps
from orchestrator.auth import Principal
from orchestrator.errors import BadGateway, BadRequest, OrchestratorError
from orchestrator.providers import (
    BlockDelta,
    ChatRequest,
    MessageEnd,
    ProviderError,
    Route,
    RoutedStream,
    StreamEvent,
)
from orchestrator.providers import _anthropic_format as anthropic_format
from orchestrator.providers import _openai_format as openai_format
from orchestrator.providers import _params as provider_params
from orchestrator.runtime.supervisor import cancel_and_wait
from orchestrator.services import ApiServices

router = APIRouter(tags=["inference"])

DROPPED_HEADER = "X-Orchestrator-Dropped-Params"
# Who counted a /messages/count_tokens answer: "provider" (its own endpoint) or "estimate".
TOKEN_COUNT_HEADER = "X-Orchestrator-Token-Count"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
log = logging.getLogger("orchestrator.gateway")


class _JsonResponse(JSONResponse):
    """JSONResponse encoded with orjson (same compact UTF-8 bytes, several times faster)."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


class _SseResponse(StreamingResponse):
    """An SSE response that runs `on_close` however it ends: finished, failed, or the
    client gone (even before the body started, when the body's own cleanup never runs)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
        )
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()


JsonBody = Annotated[dict[str, Any], Body()]


# The model endpoints: JsonRoutes (deployments/json_route.py), added to the app's own router
# ahead of every other route (`add_model_routes`). Each reaches the context and the caller
# through the functions the dependencies call.


async def chat_completions(body: JsonBody, request: Request) -> Response:
    """OpenAI chat completions; `stream: true` answers SSE `data: <chunk>` ... `data: [DONE]`."""
    services, principal = services_of(request), principal_of(request)
    chat = _with_default_model(openai_format.decode_request(body), services)
    include_usage = openai_format.wants_usage(body)
    call = _Call(services, principal, _request_id(request), chat)
    if not chat.stream:
        response = await call.complete()
        return _JsonResponse(
            openai_format.encode_response(response, chat.model), headers=call.dropped_header()
        )
    await call.open_stream()
    encoder = openai_format.ChunkEncoder(chat.model, include_usage)

    def frames(event: StreamEvent) -> Iterable[bytes]:
        return (openai_format.sse_data(chunk) for chunk in encoder.feed(event))

    def error_frame(exc: OrchestratorError) -> bytes:
        return openai_format.sse_data(
            openai_format.encode_error(exc.message, status=exc.status_code, code=exc.code)
        )

    stream = call.sse(
        frames, heartbeat=b": heartbeat\n\n", error=error_frame, done=openai_format.SSE_DONE
    )
    return _SseResponse(stream, lambda: call.close(stream), call.dropped_header())


async def messages(body: JsonBody, request: Request) -> Response:
    """Anthropic Messages; `stream: true` answers the real event sequence (message_start,
    content_block_start/delta/stop, message_delta, message_stop)."""
    services, principal = services_of(request), principal_of(request)
    chat = _with_default_model(_decode_messages(body, request), services)
    call = _Call(services, principal, _request_id(request), chat)
    if not chat.stream:
        response = await call.complete()
        return _JsonResponse(
            anthropic_format.encode_response(response, chat.model), headers=call.dropped_header()
        )
    await call.open_stream()
    encoder = anthropic_format.EventEncoder(chat.model)

    def frames(event: StreamEvent) -> Iterable[bytes]:
        return (anthropic_format.sse_event(name, data) for name, data in encoder.feed(event))

    stream = call.sse(
        frames,
        heartbeat=anthropic_format.sse_event("ping", {"type": "ping"}),
        error=anthropic_format.error_event,
        done=b"",
    )
    return _SseResponse(stream, lambda: call.close(stream), call.dropped_header())


def _decode_messages(body: dict[str, Any], request: Request, *, count: bool = False) -> ChatRequest:
    """A Messages body with the caller's `anthropic-beta` header and `?beta=true`, which an
    Anthropic upstream receives as they came."""
    return anthropic_format.decode_request(
        body,
        beta_header=request.headers.get("anthropic-beta"),
        beta_query=request.query_params.get("beta") == "true",
        count=count,
    )


async def count_tokens(body: JsonBody, request: Request) -> Response:
    """Anthropic's `POST /messages/count_tokens`: `{input_tokens}` of the prompt, counted by
    the model's provider where it has a counting endpoint, else estimated; the
    `X-Orchestrator-Token-Count` header says which ("provider" or "estimate")."""
    services = services_of(request)
    principal_of(request)  # the caller is authenticated as for /messages
    chat = _with_default_model(_decode_messages(body, request, count=True), services)
    count, source = await services.gateway.count_tokens(chat)
    return _JsonResponse({"input_tokens": count}, headers={TOKEN_COUNT_HEADER: source})


MODEL_ENDPOINTS: tuple[tuple[str, Callable[..., Awaitable[Response]]], ...] = (
    ("/chat/completions", chat_completions),
    ("/messages", messages),
    ("/messages/count_tokens", count_tokens),
)


def add_model_routes(
    router: APIRouter,
    prefix: str,
    endpoints: Iterable[tuple[str, Callable[..., Awaitable[Response]]]] = MODEL_ENDPOINTS,
) -> None:
    """The model endpoints (these, and `POST /responses` from responses.py) on `router` (the
    app's own: a JsonRoute sees the dependencies that apply to it only there), under
    `prefix`, first of its routes: a request's route is found by trying them in order (by
    FastAPI, and by Serve on every request for its metrics), and these are on every model
    call's path."""
    others = len(router.routes)
    for path, endpoint in endpoints:
        router.add_api_route(
            prefix + path,
            endpoint,
            methods=["POST"],
            tags=["inference"],
            route_class_override=JsonRoute,
        )
    router.routes[:] = router.routes[others:] + router.routes[:others]


def _request_id(request: Request) -> str:
    return request_id_of(request) or ""


# Where providers live and what they answered (URLs, upstream error text) is for admins:
# users see whether each provider is configured, reachable and its breaker.
ADMIN_ONLY_HEALTH = frozenset({"base_url", "last_error", "probe_error"})


def _for(caller: Principal, health: dict[str, Any]) -> dict[str, Any]:
    if caller.is_admin:
        return health
    return {k: v for k, v in health.items() if k not in ADMIN_ONLY_HEALTH}


@router.get("/providers/health")
async def providers_health(gateway: ModelGateway, caller: CurrentUser) -> dict[str, Any]:
    """Every provider kind: configured, reachable (a real probe, cached), breaker, last
    error. `healthy` counts configured providers that are reachable with a closed breaker.
    Base URLs and error texts are shown to admins only."""
    providers = {k: _for(caller, v) for k, v in (await gateway.health()).items()}
    healthy = sum(
        1
        for p in providers.values()
        if p["configured"] and p["reachable"] and p["breaker"] != "open"
    )
    configured = sum(1 for p in providers.values() if p["configured"])
    return {"ok": True, "providers": providers, "configured": configured, "healthy": healthy}


@router.get("/providers/health/{provider}")
async def provider_health(
    provider: str, gateway: ModelGateway, caller: CurrentUser
) -> dict[str, Any]:
    result = await gateway.health(provider)
    return {"ok": True, "provider": provider, **_for(caller, result[provider])}


def _with_default_model(chat: ChatRequest, services: ApiServices) -> ChatRequest:
    if chat.model:
        return chat
    if services.settings.default_model:
        return chat.with_model(services.settings.default_model)
    raise BadRequest(
        "model is required", extra={"fields": [{"field": "model", "message": "required"}]}
    )


class _Call:
    """One gateway call and its `inference.*` record."""

    def __init__(
        self, services: ApiServices, principal: Principal, request_id: str, chat: ChatRequest
    ) -> None:
        self.services = services
        self.principal = principal
        self.chat = chat
        self.request_id = request_id
        self.started = time.perf_counter()
        self.provider = ""
        self.routed: RoutedStream | None = None
        self.route: Route | None = None
        self.opening: asyncio.Future[RoutedStream] | None = None
        self.body_started = False
        services.inference_log.request(
            request_id=request_id,
            user_uuid=principal.user_uuid,
            model=chat.model,
            stream=chat.stream,
            messages=len(chat.messages),
        )

    async def complete(self) -> Any:
        try:
            response, route = await self.services.gateway.complete(self.chat)
        except OrchestratorError as exc:
            self._error(exc)
            raise
        self.provider = route.provider
        self.route = route
        self.services.inference_log.complete(
            request_id=self.request_id,
            user_uuid=self.principal.user_uuid,
            model=self.chat.model,
            provider=route.provider,
            tokens_in=response.usage.input_tokens,
            tokens_out=response.usage.output_tokens,
            duration_ms=self._elapsed_ms(),
            finish_reason=response.stop_reason,
            stream=False,
        )
        return response

    def dropped_header(self) -> dict[str, str] | None:
        """`X-Orchestrator-Dropped-Params` naming the optional fields the serving provider
        does not honour and `drop_unsupported_params` dropped (they are never dropped
        silently). A stream still opening when its headers go out cannot name them; with
        the setting off such fields are a 400 instead."""
        route = self.routed.route if self.routed is not None else self.route
        if route is None or not self.chat.params:
            return None
        dropped = provider_params.unsupported(route.adapter, self.chat.params)
        return {DROPPED_HEADER: ",".join(dropped)} if dropped else None

    async def open_stream(self) -> None:
        """Open the upstream stream. Answered within `stream_heartbeat_s`: errors become an
        HTTP status; else the SSE response starts with heartbeats while it opens, and a
        later failure is an error frame."""
        opening = asyncio.ensure_future(self.services.gateway.open_stream(self.chat))
        try:
            done, _ = await asyncio.wait(
                {opening}, timeout=self.services.settings.stream_heartbeat_s
            )
        except BaseException:  # the client left while it opened: stop it, or close what opened
            await cancel_and_wait([opening])
            if not opening.cancelled() and opening.exception() is None:
                with contextlib.suppress(Exception):
                    await opening.result().aclose()
            raise
        if not done:
            self.opening = opening
            return
        try:
            self.routed = opening.result()
        except OrchestratorError as exc:
            self._error(exc)
            raise
        self.provider = self.routed.route.provider

    async def sse(
        self,
        frames: Callable[[StreamEvent], Iterable[bytes]],
        *,
        heartbeat: bytes,
        error: Callable[[OrchestratorError], bytes],
        done: bytes,
    ) -> AsyncIterator[bytes]:
        """The SSE body: frames for each event, a heartbeat while the upstream is silent,
        an error frame (never a silent end) when the upstream fails mid-stream."""
        self.body_started = True
        interval = self.services.settings.stream_heartbeat_s
        end: MessageEnd | None = None
        tokens_out = 0
        ttft_s: float | None = None
        finished = False
        try:
            if self.routed is None:
                assert self.opening is not None
                while not (await asyncio.wait({self.opening}, timeout=interval))[0]:
                    yield heartbeat
                self.routed = self.opening.result()
                self.provider = self.routed.route.provider
            async with contextlib.aclosing(_batches(self.routed.events, interval)) as batches:
                async for batch in batches:
                    if batch is None:
                        yield heartbeat
                        continue
                    out: list[bytes] = []
                    for event in batch:
                        if isinstance(event, MessageEnd):
                            end = event
                        elif isinstance(event, BlockDelta):
                            tokens_out += 1  # deltas seen; the exact count comes with the end
                            if ttft_s is None:
                                ttft_s = time.perf_counter() - self.started
                        out.extend(frames(event))
                    if out:
                        yield b"".join(out)  # one write (through every layer) per batch
            if done:
                yield done
            finished = True
        except (asyncio.CancelledError, GeneratorExit):
            raise  # the client went away
        except Exception as exc:
            if isinstance(exc, ProviderError):
                mapped = exc.to_http()
            elif isinstance(exc, OrchestratorError):
                mapped = exc
            else:
                log.exception("stream %s failed", self.request_id)
                mapped = BadGateway(f"the upstream stream failed: {type(exc).__name__}")
            self._error(mapped, interrupted=True, tokens_out=tokens_out)
            finished = True
            yield error(mapped)
        finally:
            if end is not None and finished:
                self.services.inference_log.complete(
                    request_id=self.request_id,
                    user_uuid=self.principal.user_uuid,
                    model=self.chat.model,
                    provider=self.provider,
                    tokens_in=end.usage.input_tokens,
                    tokens_out=end.usage.output_tokens,
                    duration_ms=self._elapsed_ms(),
                    finish_reason=end.stop_reason,
                    stream=True,
                    ttft_s=ttft_s,
                )
            elif not finished:
                self._error(
                    OrchestratorError("client disconnected"),
                    interrupted=True,
                    tokens_out=tokens_out,
                )

    async def close(self, body: AsyncIterator[bytes]) -> None:
        """However the response ended: the body's own cleanup, then the upstream stream's
        (which settles its breaker even if nobody ever read from it)."""
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        if not self.body_started:
            self._error(OrchestratorError("client disconnected"), interrupted=True)
        opening = self.opening
        if opening is not None and self.routed is None:
            if not opening.done():
                opening.cancel()
            with contextlib.suppress(BaseException):
                self.routed = await opening
        if self.routed is not None:
            await self.routed.aclose()

    def _error(
        self, exc: OrchestratorError, *, interrupted: bool = False, tokens_out: int = 0
    ) -> None:
        self.services.inference_log.error(
            request_id=self.request_id,
            user_uuid=self.principal.user_uuid,
            model=self.chat.model,
            error=exc.message,
            status_code=exc.status_code,
            interrupted=interrupted,
            tokens_out=tokens_out,
        )

    def _elapsed_ms(self) -> int:
        return int((time.perf_counter() - self.started) * 1000)


async def _batches(
    events: AsyncIterator[StreamEvent], interval_s: float
) -> AsyncGenerator[list[StreamEvent] | None, None]:
    """The events in batches: everything that arrived since the last batch (a burst from
    the upstream becomes one write), or None whenever `interval_s` passes without one (a
    heartbeat). One task reads the upstream for the whole stream, so a heartbeat never
    cancels a pending read, and nothing is created per event. Closing this generator stops
    the reader (the caller then closes `events`: RoutedStream.aclose)."""
    loop = asyncio.get_running_loop()
    buffer: list[StreamEvent] = []
    ended: list[BaseException] = []  # StopAsyncIteration, or the upstream's failure
    waiter: asyncio.Future[None] | None = None

    def wake() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read() -> None:
        try:
            async for event in events:
                buffer.append(event)
                wake()
            ended.append(StopAsyncIteration())
        except Exception as exc:  # noqa: BLE001 - handed to the consumer after the buffer
            ended.append(exc)
        finally:
            wake()

    reader = loop.create_task(read(), name="gateway-stream-reader")
    try:
        while True:
            if not buffer and not ended:
                waiter = loop.create_future()
                timer = loop.call_later(interval_s, wake)
                try:
                    await waiter
                finally:
                    timer.cancel()
                    waiter = None
                if not buffer and not ended:
                    yield None
                    continue
            if buffer:
                batch = buffer[:]
                buffer.clear()
                yield batch
                continue
            if isinstance(ended[0], StopAsyncIteration):
                return
            raise ended[0]
    finally:
        await cancel_and_wait([reader])


__all__ = ["MODEL_ENDPOINTS", "add_model_routes", "router"]
