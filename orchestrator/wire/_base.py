"""The base of every wire model, and the marker of fields a view leaves out."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ApiModel"]  # left_out_when_none: for the wire modules only


class ApiModel(BaseModel):
    """Base of every request and answer body both sides share: immutable.

    Unknown fields are dropped where the server validates what it sends (a handler cannot
    leak a field its model does not name); the SDK reads answers with `extra="allow"`, so a
    field added by a newer server is kept as an attribute, not refused.
    """

    model_config = ConfigDict(frozen=True)


def left_out_when_none(value: object) -> bool:
    """`Field(exclude_if=...)` of a field a view sends only when it has a value (a step's
    result before it completes, a job's detail-view fields in a list)."""
    return value is None
