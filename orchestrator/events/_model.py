"""What the store holds and hands out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.auth import Principal
from orchestrator.errors import BadRequest, Conflict, ErrorCode, Forbidden


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. `aggregate_id` defaults to the type's aggregate key in `data`."""

    type: str
    data: dict[str, Any]
    user_uuid: str | None = None
    aggregate_id: str | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """A committed event, upcast to its type's current version."""

    position: int
    id: str
    type: str
    version: int
    aggregate_id: str
    seq: int
    timestamp: int
    data: dict[str, Any] = field(hash=False)
    user_uuid: str | None = None

    def wire(self) -> dict[str, Any]:
        """The event as the API shows it (SPEC part 2), plus its global position."""
        return {
            "id": self.id,
            "type": self.type,
            "version": self.version,
            "aggregate_id": self.aggregate_id,
            "seq": self.seq,
            "timestamp": self.timestamp,
            "data": self.data,
            "position": self.position,
            # Whose event it is (SPEC part 1: results belong to the right user); None: system.
            "user_uuid": self.user_uuid,
        }


@dataclass(frozen=True, slots=True)
class EventQuery:
    """A page of the store: GET /events."""

    aggregate: str | None = None  # None: every aggregate
    user_uuid: str | None = None  # None: every owner (admins only)
    types: tuple[str, ...] = ()
    from_seq: int = 0  # events whose per-aggregate seq is at least this (any aggregate)
    from_position: int = 0  # the global cursor: events at or after this position
    limit: int = 100
    offset: int = 0
    count_limit: int = 10_000  # `total` is exact up to this many, an estimate above


@dataclass(frozen=True, slots=True)
class EventPage:
    """What `EventStore.page` found: the page, and how many match in all (`total_exact`
    False: the planner's estimate, past `EventQuery.count_limit`)."""

    events: list[Event]
    total: int
    total_exact: bool = True


def owner_scope(principal: Principal, requested: str | None) -> str | None:
    """Whose events `principal` reads: admins anyone's (`requested`, None for every
    tenant), others only their own (asking for another tenant's is a 403)."""
    if principal.is_admin:
        return requested
    if requested is not None and requested != principal.user_uuid:
        raise Forbidden("the user_uuid filter is admin only")
    return principal.user_uuid


class SeqConflict(Conflict):
    """`expected_seq` did not match the aggregate's last seq."""

    default_code = ErrorCode.SEQ_CONFLICT


class EventRejected(BadRequest):
    """Unknown type, invalid data, or a pre-commit hook said no."""

    default_code = ErrorCode.EVENT_REJECTED
