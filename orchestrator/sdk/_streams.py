"""Reading the frames of the API's three streams into models: /sync-events, streamed chat
completions (OpenAI chunks up to `[DONE]`) and streamed messages (Anthropic events)."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import ValidationError

from orchestrator.sdk._base import ApiError, SseFrame, stream_error
from orchestrator.wire import ChatCompletionChunk, Event, MessageStreamEvent

__all__ = ["chat_chunk", "event_position", "message_event", "sync_event"]

M = TypeVar("M", ChatCompletionChunk, Event, MessageStreamEvent)


def _object(frame: SseFrame) -> dict[str, object]:
    try:
        data = json.loads(frame.data)
    except json.JSONDecodeError as exc:
        raise ApiError(
            200, "invalid_response", f"not JSON in a stream: {frame.data[:200]!r}"
        ) from exc
    if not isinstance(data, dict):
        raise ApiError(200, "invalid_response", f"not an object in a stream: {frame.data[:200]!r}")
    return data


def _valid(cls: type[M], data: object) -> M:
    try:
        return cls.model_validate(data, extra="allow")
    except ValidationError as exc:
        raise ApiError(200, "invalid_response", f"not a valid {cls.__name__}: {exc}") from exc


def sync_event(frame: SseFrame) -> Event | None:
    """The event of a /sync-events frame; None for a frame without data. An `event: error`
    frame raises (its code says why the server ended the stream)."""
    if frame.event == "error":
        raise stream_error(frame, 200)
    if not frame.data:
        return None
    return _valid(Event, _object(frame))


def event_position(frame: SseFrame, event: Event) -> int:
    """What to send back as Last-Event-ID: the frame's `id`, else the event's position."""
    return int(frame.id) if frame.id and frame.id.isdigit() else event.position


def chat_chunk(frame: SseFrame) -> ChatCompletionChunk | None:
    """A chunk, or None at `[DONE]`; an error chunk raises."""
    if frame.data.strip() == "[DONE]":
        return None
    data = _object(frame)
    if "error" in data:
        raise stream_error(frame, 200)
    return _valid(ChatCompletionChunk, data)


def message_event(frame: SseFrame) -> MessageStreamEvent | None:
    """An Anthropic stream event (None for a frame without data); `error` events raise."""
    if not frame.data:
        return None
    data = _object(frame)
    if data.get("type") == "error" or frame.event == "error":
        raise stream_error(frame, 200)
    return _valid(MessageStreamEvent, data)
