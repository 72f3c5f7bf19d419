# Generated from orchestrator/sdk/_async/_operations.py by scripts/unasync_sdk.py: do not edit.
"""Operations, tokens and events: health, readiness, metrics, SLO, who the caller is, API
tokens, and the event store's pages and live stream."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import closing
from typing import Any

import httpx

from orchestrator.sdk import _streams
from orchestrator.sdk._base import ApiError, Call, SseParser, model_of, reconnect_delay, text_of
from orchestrator.sdk._requests import comma_list, given, seg, sync_events_call
from orchestrator.sdk._sync._core import SyncCore, offset_pages
from orchestrator.wire import Event, EventPage, Health, Slo, TokenCreated, TokenRevoked, WhoAmI

__all__ = ["SyncOperations"]


class SyncOperations(SyncCore):
    def health(self) -> Health:
        """Service health; returned (not raised) when degraded: check `.status`."""
        return self._send(Call("GET", "/health", model_of(Health), answers=frozenset({503})))

    def ready(self) -> str:
        return self._send(Call("GET", "/ready", text_of))

    def metrics(self) -> str:
        """Prometheus text exposition."""
        return self._send(Call("GET", "/metrics", text_of))

    def slo(self) -> Slo:
        return self._send(Call("GET", "/slo", model_of(Slo)))

    def whoami(self) -> WhoAmI:
        return self._send(Call("GET", "/whoami", model_of(WhoAmI)))

    def create_token(
        self,
        user_uuid: str,
        admin: bool = False,
        description: str = "",
        *,
        expires_in: int | None = None,
        expires_at: int | None = None,
    ) -> TokenCreated:
        """Issue a token for `user_uuid` (admin only); it expires `expires_in` seconds from
        now or at `expires_at` (Unix ms), never when neither is given."""
        body: dict[str, Any] = {"user_uuid": user_uuid, "admin": admin, "description": description}
        body |= given(expires_in=expires_in, expires_at=expires_at)
        return self._send(Call("POST", "/tokens", model_of(TokenCreated), body=body))

    def revoke_token(self, prefix: str) -> TokenRevoked:
        return self._send(Call("DELETE", f"/tokens/{seg(prefix)}", model_of(TokenRevoked)))

    # --- events --------------------------------------------------------------------------

    def events(
        self,
        aggregate: str = "all",
        *,
        user_uuid: str | None = None,
        types: Sequence[str] | None = None,
        from_seq: int = 0,
        from_position: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> EventPage:
        """One page of stored events, oldest first; `iter_events` walks them all. `from_seq`
        keeps events whose per-aggregate `seq` is at least it; `from_position` is the global
        cursor (the last event's `position` + 1 is the next page)."""
        params = given(
            aggregate=aggregate,
            user_uuid=user_uuid,
            types=comma_list(types),
            from_seq=from_seq or None,
            from_position=from_position or None,
            limit=limit,
            offset=offset or None,
        )
        return self._send(Call("GET", "/events", model_of(EventPage), params=params))

    def iter_events(
        self,
        aggregate: str = "all",
        *,
        user_uuid: str | None = None,
        types: Sequence[str] | None = None,
        from_seq: int = 0,
        from_position: int = 0,
        page_size: int = 100,
    ) -> Iterator[Event]:
        """Every stored event that matches, oldest first, a page at a time."""

        def fetch(offset: int) -> list[Event]:
            page = self.events(
                aggregate,
                user_uuid=user_uuid,
                types=types,
                from_seq=from_seq,
                from_position=from_position,
                limit=page_size,
                offset=offset,
            )
            return page.data

        return offset_pages(fetch, page_size)

    def sync_events(
        self,
        aggregate: str = "all",
        *,
        user_uuid: str | None = None,
        types: Sequence[str] | None = None,
        from_seq: int = 0,
        from_position: int | None = None,
        last_event_id: int | None = None,
        reconnect: bool = True,
    ) -> Generator[Event, None]:
        """Live events (GET /sync-events), from `from_position` (a global position,
        inclusive) or after `last_event_id` when given, else from now (or, for one aggregate,
        from its `from_seq`). When the server ends or drops the stream, it reconnects with
        Last-Event-ID set to the last event seen, so no event is missed or repeated; after
        `max_retries` failed connections in a row the error is raised. `reconnect=False`
        stops at the end of the first stream instead. On the stream an event's `type` is its
        stream name (colon style for workflow types: `workflow:step:started`)."""
        last, failures, parser = last_event_id, 0, SseParser()
        while True:
            call = sync_events_call(aggregate, user_uuid, types, from_seq, last, from_position)
            try:
                with closing(self._sse(call, parser)) as frames:
                    for frame in frames:
                        failures = 0
                        event = _streams.sync_event(frame)
                        if event is not None:
                            last = _streams.event_position(frame, event)
                            yield event
            except ApiError as exc:
                # Dropped for lagging behind: resume from the last event seen.
                if exc.code != "subscriber_too_slow":
                    raise
            except httpx.TransportError:
                failures += 1
                if not reconnect or failures > self.max_retries:
                    raise
            if not reconnect:
                return
            time.sleep(reconnect_delay(self.retry, parser, failures))
