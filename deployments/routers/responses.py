"""OpenAI's Responses API (issue 34): `POST /responses` (a model endpoint, mounted with the
others by `add_model_routes`), `GET` and `DELETE /responses/{id}`, and
`GET /responses/{id}/input_items`.

A request is decoded (orchestrator/providers/_responses_format), its `previous_response_id`
chain read back from the store, and the conversation routed by the gateway exactly as chat
completions are (`gateway._Call`: the same routing, provider field tables, dropped-params
header, inference records, heartbeats and mid-stream errors). With `store` not false the
answer is saved before its last event goes out, so a caller chaining on it finds it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from deployments.deps import CurrentUser, StoredResponses, principal_of, services_of
from deployments.routers.gateway import (
    DROPPED_HEADER,
    JsonBody,
    _Call,
    _JsonResponse,
    _request_id,
    _SseResponse,
    _with_default_model,
)
from orchestrator.errors import ServiceUnavailable, ValidationFailed
from orchestrator.providers import _responses_format as responses_format
from orchestrator.providers._responses_format.request import INCLUDE_HONOURED

router = APIRouter(tags=["inference"])
log = logging.getLogger("orchestrator.gateway")

HEARTBEAT = b": heartbeat\n\n"
# The provider tables' names (chat completions') of fields a Responses request sets under
# other names: a 400 or the dropped-params header names them as the caller wrote them.
CALLER_NAMES = {
    "reasoning_effort": "reasoning.effort",
    "response_format": "text.format",
    "verbosity": "text.verbosity",
}
_INTERNAL = re.compile(r"\b(" + "|".join(CALLER_NAMES) + r")\b")


def _as_sent(text: str) -> str:
    return _INTERNAL.sub(lambda m: CALLER_NAMES[m.group(1)], text)


@contextlib.contextmanager
def _caller_names() -> Iterator[None]:
    """A field the provider does not honour (a 400 from its table) named as sent."""
    try:
        yield
    except ValidationFailed as exc:
        fields = exc.extra.get("fields")
        if not isinstance(fields, list):
            raise
        renamed = [{**f, "field": _as_sent(str(f.get("field", "")))} for f in fields]
        extra = {**exc.extra, "fields": renamed}
        raise ValidationFailed(_as_sent(exc.message), code=exc.code, extra=extra) from None


def _dropped(call: _Call, req: responses_format.ResponsesRequest) -> dict[str, str] | None:
    """What was dropped: hosted tools and include values (decoding), then the fields the
    provider's table does not honour, named as sent."""
    header = call.dropped_header()
    names = [*req.dropped, *(_as_sent(header[DROPPED_HEADER]).split(",") if header else ())]
    return {DROPPED_HEADER: ",".join(names)} if names else None


async def create_response(body: JsonBody, request: Request) -> Response:
    """OpenAI Responses; `stream: true` answers its typed SSE events (response.created ...
    response.completed)."""
    services, principal = services_of(request), principal_of(request)
    req = responses_format.decode_request(body, drop=services.settings.drop_unsupported_params)
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        history = await services.responses.history(principal.user_uuid, req.previous_response_id)
    chat = _with_default_model(responses_format.conversation(req, history), services)
    call = _Call(services, principal, _request_id(request), chat)
    response_id = responses_format.item_id("resp")
    created_at = int(time.time())

    async def save(answer: dict[str, Any]) -> None:
        if req.store:
            await services.responses.save(
                principal.user_uuid,
                answer,
                req.items,
                instructions=req.instructions,
                previous_response_id=req.previous_response_id,
                client_metadata=req.client_metadata,
            )

    if not chat.stream:
        with _caller_names():
            response = await call.complete()
        answer = responses_format.encode_response(
            response, req, id=response_id, model=chat.model, created_at=created_at
        )
        await save(answer)
        return _JsonResponse(answer, headers=_dropped(call, req))
    with _caller_names():
        await call.open_stream()
    encoder = responses_format.EventEncoder(
        req, id=response_id, model=chat.model, created_at=created_at
    )
    events = call.sse(
        lambda event: (encoder.frames(event),),
        heartbeat=HEARTBEAT,
        error=encoder.error_frames,
        done=b"",
    )
    stream = _saved_then_ended(events, encoder, save)
    return _SseResponse(stream, lambda: call.close(stream), _dropped(call, req))


async def _saved_then_ended(
    events: AsyncIterator[bytes],
    encoder: responses_format.EventEncoder,
    save: Callable[[dict[str, Any]], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The stream's frames; once it ended, the response saved, then its last event (a
    failed save is an `error` and `response.failed` instead)."""
    async with contextlib.aclosing(events) as frames:  # type: ignore[type-var]
        async for frame in frames:
            yield frame
    if encoder.final is None:
        return
    try:
        await save(encoder.final)
    except Exception as exc:  # noqa: BLE001 - reported in the stream, the answer is lost
        log.warning("response %s not stored: %r", encoder.id, exc)
        yield encoder.error_frames(ServiceUnavailable("the response could not be stored"))
        return
    yield encoder.terminal_frame()


MODEL_ENDPOINTS: tuple[tuple[str, Callable[..., Awaitable[Response]]], ...] = (
    ("/responses", create_response),
)


def _check_include(request: Request) -> None:
    """`include` (as `include[]=...`, the SDKs' form, or `include=...`): what we keep."""
    names = request.query_params.getlist("include[]") + request.query_params.getlist("include")
    for i, name in enumerate(names):
        if name not in INCLUDE_HONOURED:
            raise ValidationFailed(
                f"invalid request: include[{i}]: {name!r} is not supported",
                extra={"fields": [{"field": f"include[{i}]", "message": "not supported"}]},
            )


@router.get("/responses/{response_id}")
async def get_response(
    response_id: str, request: Request, store: StoredResponses, caller: CurrentUser
) -> Response:
    """A stored response (404 when missing, expired, deleted or another owner's)."""
    _check_include(request)
    if request.query_params.get("stream") in ("true", "1"):  # OpenAI's resume of a stream
        raise ValidationFailed(
            "invalid request: stream: a stored response cannot be streamed again",
            extra={"fields": [{"field": "stream", "message": "not supported"}]},
        )
    return _JsonResponse(await store.get(caller.user_uuid, response_id))


@router.delete("/responses/{response_id}")
async def delete_response(
    response_id: str, store: StoredResponses, caller: CurrentUser
) -> Response:
    await store.delete(caller.user_uuid, response_id)
    return _JsonResponse(responses_format.deleted_body(response_id))


@router.get("/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    store: StoredResponses,
    caller: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
    after: str | None = None,
    before: str | None = None,
) -> Response:
    """The response's input items, OpenAI's list object and cursor paging."""
    _check_include(request)
    page = await store.input_items(
        caller.user_uuid, response_id, limit=limit, order=order, after=after, before=before
    )
    return _JsonResponse(page.body())


__all__ = ["MODEL_ENDPOINTS", "router"]
