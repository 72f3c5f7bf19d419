"""SPEC part 4 "Events": the store read API and the live stream (SSE)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from deployments.deps import BIGINT_MAX, Config, CurrentUser, Events, Feed, Offset, Position
from orchestrator import wire
from orchestrator.auth import Principal
from orchestrator.errors import BadRequest, field_error
from orchestrator.events import CATALOG, EventQuery, Fanout, StreamFilter, SubscriberTooSlow
from orchestrator.events import stream_name as to_stream_name

router = APIRouter(tags=["events"])

# Filters accept store names (`workflow.step_started`) and stream names (`workflow:step:started`).
_TYPE_NAMES = {name: name for name in CATALOG} | {to_stream_name(n): n for n in CATALOG}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


def _names(field: str) -> dict[str, Any]:
    return {"fields": [field_error(field, "invalid")]}


def _types(type_: str | None, types: str | None) -> tuple[str, ...]:
    names = [n.strip() for n in f"{type_ or ''},{types or ''}".split(",") if n.strip()]
    unknown = [n for n in names if n not in _TYPE_NAMES]
    if unknown:
        raise BadRequest(f"unknown event type(s): {', '.join(unknown)}", extra=_names("types"))
    return tuple(dict.fromkeys(_TYPE_NAMES[n] for n in names))


def _wants_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


def _last_event_id(header: str | None, query: int | None) -> int | None:
    if header is None or header == "":
        return query
    try:
        value = int(header)
    except ValueError:
        raise BadRequest("Last-Event-ID must be an event position (an integer)") from None
    if value < 0:
        raise BadRequest("Last-Event-ID must not be negative")
    return value


async def _sse(
    fanout: Fanout, flt: StreamFilter, after: int | None, caller: Principal, ping_s: float
) -> AsyncIterator[bytes]:
    # Registered before the first byte: whatever commits after the client sees `connected`
    # is on this stream. Its chunks are whole frames, encoded once per replica and written
    # several at a time when they piled up (pings included: see Fanout). `flt` was admitted
    # before the 200 (Fanout.admit), so opening cannot be refused here.
    stream = await fanout.open(flt, after, caller, ping_s=ping_s)
    try:
        # `retry` makes EventSource clients reconnect fast; they resend Last-Event-ID.
        yield b"retry: 1000\n: connected\n\n"
        async for chunk in stream:
            yield chunk
    except SubscriberTooSlow as exc:
        body = json.dumps({"error": exc.message, "code": "subscriber_too_slow"})
        yield f"event: error\ndata: {body}\n\n".encode()
    finally:
        await stream.aclose()


async def _stream_response(
    fanout: Feed,
    settings: Config,
    events: Events,
    caller: Principal,
    aggregate: str,
    user_uuid: str | None,
    types: tuple[str, ...],
    after: int | None,
    from_seq: int,
) -> StreamingResponse:
    """Everything that can refuse the stream happens here, before its `200`: the filters
    (400), the tenant (403), the event bus (503)."""
    agg = None if aggregate == "all" else aggregate
    if after is None and from_seq > 0 and agg is not None:
        # No cursor: start at the aggregate's first event with seq >= from_seq. Across all
        # aggregates from_seq only filters (a start there is a cursor: from_position).
        after = await events.position_before(agg, from_seq)
    flt = StreamFilter(user_uuid=user_uuid, aggregate=agg, types=frozenset(types), min_seq=from_seq)
    flt = await fanout.admit(flt, caller, wait_s=settings.sse_start_timeout_s)
    return StreamingResponse(
        _sse(fanout, flt, after, caller, settings.sse_ping_interval_s),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


def _cursor(last_event_id: int | None, from_position: int | None) -> int | None:
    """Where a stream resumes (the position it starts after): Last-Event-ID (header or
    query) first, else `from_position` (inclusive, as on the page)."""
    if last_event_id is not None:
        return last_event_id
    return None if from_position is None else max(0, from_position - 1)


AggregateQ = Annotated[str, Query(min_length=1, max_length=256)]
UserQ = Annotated[str | None, Query(max_length=128)]
TypeQ = Annotated[str | None, Query(alias="type", max_length=2000)]
TypesQ = Annotated[str | None, Query(max_length=2000)]
LastIdHeader = Annotated[str | None, Header(alias="Last-Event-ID")]
LastIdQ = Annotated[int | None, Query(ge=0, le=BIGINT_MAX)]
# The global cursor (issue 33): a position, inclusive; `from_seq` is a per-aggregate seq.
FromPositionQ = Annotated[int | None, Query(ge=0, le=BIGINT_MAX)]


@router.get("/events", response_model=wire.EventPage)
async def list_events(
    request: Request,
    response: Response,
    fanout: Feed,
    settings: Config,
    events: Events,
    caller: CurrentUser,
    aggregate: AggregateQ = "all",
    user_uuid: UserQ = None,
    from_seq: Position = 0,
    from_position: FromPositionQ = None,
    limit: Annotated[int | None, Query(ge=1)] = None,
    offset: Offset = 0,
    type_: TypeQ = None,
    types: TypesQ = None,
    last_event_id: LastIdQ = None,
    last_event_id_header: LastIdHeader = None,
) -> Any:
    wanted = _types(type_, types)
    if _wants_stream(request):
        after = _cursor(_last_event_id(last_event_id_header, last_event_id), from_position)
        return await _stream_response(
            fanout, settings, events, caller, aggregate, user_uuid, wanted, after, from_seq
        )
    limit = limit or settings.events_limit
    if limit > settings.events_max_limit:
        raise BadRequest(
            f"limit must be at most {settings.events_max_limit}", extra=_names("limit")
        )
    query = EventQuery(
        aggregate=None if aggregate == "all" else aggregate,
        user_uuid=user_uuid,
        types=wanted,
        from_seq=from_seq,
        from_position=from_position or 0,
        limit=limit,
        offset=offset,
        count_limit=settings.events_total_exact_max,
    )
    found = await events.page(query, caller)
    if not found.total_exact:  # the body keeps the SPEC's shape; the header says "estimate"
        response.headers["X-Total-Estimated"] = "true"
    data = [wire.Event(**e.wire()) for e in found.events]
    return wire.EventPage(data=data, total=found.total, offset=offset, limit=limit)


@router.get("/sync-events")
async def sync_events(
    fanout: Feed,
    settings: Config,
    events: Events,
    caller: CurrentUser,
    aggregate: AggregateQ = "all",
    user_uuid: UserQ = None,
    from_seq: Position = 0,
    from_position: FromPositionQ = None,
    type_: TypeQ = None,
    types: TypesQ = None,
    last_event_id: LastIdQ = None,
    last_event_id_header: LastIdHeader = None,
) -> StreamingResponse:
    wanted = _types(type_, types)
    after = _cursor(_last_event_id(last_event_id_header, last_event_id), from_position)
    return await _stream_response(
        fanout, settings, events, caller, aggregate, user_uuid, wanted, after, from_seq
    )
