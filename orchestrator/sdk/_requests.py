"""What the methods of both clients build their requests from: the typed dicts of the bodies
they take (`StepSpec`, `ScheduleOptions`), path segments escaped so an id or a key can never
reach another route, bodies and queries without the arguments left out, and the requests
that take more than a line. Nothing here does I/O, and nothing here is generated: _async/
and _sync/ both import it, so it is written once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict
from urllib.parse import quote

from orchestrator.sdk._base import IDEMPOTENCY_HEADER, Call, model_of, no_body
from orchestrator.wire import ChatCompletion, Message, MessageTokenCount

__all__ = [
    "ScheduleOptions",
    "Scope",
    "StepRetry",
    "StepSpec",
    "as_dict",
    "as_list",
    "chat_body",
    "chat_completion_call",
    "comma_list",
    "given",
    "http_tool_body",
    "idempotency",
    "mcp_server_body",
    "memory_path",
    "message_call",
    "message_count_call",
    "seg",
    "sync_events_call",
]

Scope = Literal["user", "global"]


class StepRetry(TypedDict, total=False):
    """A task step's `retry` (issue 32): attempts 1-10, waits in ms (doubling, jittered)."""

    max_attempts: int
    backoff_ms: int
    max_backoff_ms: int


class StepSpec(TypedDict, total=False):
    """One workflow step as POST /workflows and templates take it (SPEC part 4)."""

    name: str
    prompt: str
    mode: str
    tools: list[str]
    timeout: float
    condition: str
    type: Literal["branch", "spawn"]
    conditions: dict[str, Any]
    workflows: list[dict[str, Any]]
    compensate: str | dict[str, Any]
    retry: StepRetry


class ScheduleOptions(TypedDict, total=False):
    """`opts` of a scheduled job."""

    mode: Literal["build", "plan", "explore", "review", "general", "coordinate"]
    tools: list[str]
    timeout: float
    tz: str
    overlap: Literal["skip", "allow", "queue"]


def seg(value: str | int) -> str:
    """One path segment, escaped (`/` included)."""
    return quote(str(value), safe="")


def memory_path(agent_id: str, *rest: str) -> str:
    """`/memory/<agent_id>/...`, each segment escaped."""
    return "/memory/" + "/".join(seg(p) for p in (agent_id, *rest))


def given(**fields: Any) -> dict[str, Any]:
    """A body or query without the fields left out (None)."""
    return {k: v for k, v in fields.items() if v is not None}


def idempotency(key: str | None) -> dict[str, str] | None:
    """The headers of a creating POST sent under `key` (the service answers a retry with
    the first answer; the clients then also retry it after a read timeout)."""
    return None if key is None else {IDEMPOTENCY_HEADER: key}


def comma_list(items: Sequence[str] | None) -> str | None:
    return None if items is None else ",".join(items)


def as_list(items: Sequence[Any] | None) -> list[Any] | None:
    return None if items is None else list(items)


def as_dict(mapping: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if mapping is None else dict(mapping)


def mcp_server_body(
    name: str | None,
    url: str | None,
    headers: Mapping[str, str] | None,
    command: str | None,
    args: Sequence[str] | None,
    env: Mapping[str, str] | None,
    shared: bool | None,
) -> dict[str, Any]:
    """POST and PUT /mcp/servers: the fields given."""
    return given(
        name=name,
        url=url,
        headers=as_dict(headers),
        command=command,
        args=as_list(args),
        env=as_dict(env),
        shared=shared,
    )


def http_tool_body(
    name: str | None,
    description: str | None,
    parameters: Mapping[str, Any] | None,
    method: str | None,
    url: str | None,
    headers: Mapping[str, str] | None,
) -> dict[str, Any]:
    """POST and PUT /tools/http: the fields given."""
    return given(
        name=name,
        description=description,
        parameters=as_dict(parameters),
        method=method,
        url=url,
        headers=as_dict(headers),
    )


def chat_body(
    model: str | None,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int | None,
    temperature: float | None,
    tools: Sequence[Mapping[str, Any]] | None,
    extra_body: Mapping[str, Any] | None,
    stream: bool,
) -> dict[str, Any]:
    """POST /chat/completions and /messages: `extra_body` first, the named fields over it."""
    body: dict[str, Any] = {**(extra_body or {}), "messages": [dict(m) for m in messages]}
    body.update(
        given(
            model=model,
            max_tokens=max_tokens,
            temperature=temperature,
            tools=None if tools is None else [dict(t) for t in tools],
        )
    )
    if stream:
        body["stream"] = True
    return body


def chat_completion_call(body: dict[str, Any]) -> Call[ChatCompletion]:
    return Call("POST", "/chat/completions", model_of(ChatCompletion), body=body)


def message_call(body: dict[str, Any]) -> Call[Message]:
    return Call("POST", "/messages", model_of(Message), body=body)


def message_count_call(body: dict[str, Any]) -> Call[MessageTokenCount]:
    return Call("POST", "/messages/count_tokens", model_of(MessageTokenCount), body=body)


def sync_events_call(
    aggregate: str,
    user_uuid: str | None,
    types: Sequence[str] | None,
    from_seq: int,
    last_event_id: int | None,
    from_position: int | None = None,
) -> Call[None]:
    """GET /sync-events, resuming after `last_event_id` when there is one (else from
    `from_position`). `from_seq` is a filter on each event's seq, so it is sent on every
    connection; with one aggregate and no cursor it is also where the stream starts."""
    params = given(aggregate=aggregate, user_uuid=user_uuid, types=comma_list(types))
    if from_seq:
        params["from_seq"] = from_seq
    if last_event_id is None and from_position is not None:
        params["from_position"] = from_position
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    return Call("GET", "/sync-events", no_body, params=params, headers=headers)
