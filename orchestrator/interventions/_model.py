"""What an intervention is: a person's decision a workflow step waits for (issue 32), who may
decide it, and what deciding gives back. Plain values; the store (_store.py) reads and
writes them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from orchestrator.auth import Principal

__all__ = [
    "ID_PATTERN",
    "KINDS",
    "MAX_TEXT",
    "PLATFORMS",
    "STATUSES",
    "Decided",
    "Decider",
    "Intervention",
    "Kind",
    "Resume",
    "Status",
]

Status = Literal["pending", "approved", "rejected", "expired"]
STATUSES: tuple[str, ...] = ("pending", "approved", "rejected", "expired")
Kind = Literal["tool", "approval"]
KINDS: tuple[str, ...] = ("tool", "approval")
# Where a decision came from: the API, a channel platform's button, or the service itself.
Via = Literal["api", "slack", "telegram", "teams", "webhook", "timeout", "cancel"]
PLATFORMS: tuple[str, ...] = ("slack", "telegram", "teams", "webhook")
ID_PATTERN = re.compile(r"iv-[0-9]{1,18}")
MAX_TEXT = 2000  # a decision's note or reason
MAX_QUESTION = 4000


@dataclass(frozen=True, slots=True)
class Decider:
    """Who decides: an API caller (`user_uuid`, `is_admin`: `Decider.of(principal)`), or a
    platform user pressing a button in a channel (`Decider.on_platform`), whom the channel's
    `approvers` admitted before the store is asked."""

    user_uuid: str | None = None
    is_admin: bool = False
    platform: str | None = None
    platform_user: str | None = None
    channel_id: str | None = None

    @classmethod
    def of(cls, principal: Principal) -> Decider:
        return cls(user_uuid=principal.user_uuid, is_admin=principal.is_admin)

    @classmethod
    def on_platform(cls, platform: str, platform_user: str, channel_id: str) -> Decider:
        if platform not in PLATFORMS:
            raise ValueError(f"unknown platform {platform!r}")
        return cls(platform=platform, platform_user=platform_user, channel_id=channel_id)

    @property
    def via(self) -> str:
        return self.platform or "api"

    @property
    def label(self) -> str:
        """As events name a decider: `user:<uuid>` or `<platform>:<platform user id>`."""
        if self.platform is not None:
            return f"{self.platform}:{self.platform_user}"
        return f"user:{self.user_uuid}"

    def record(self) -> dict[str, Any]:
        """As `interventions.decided_by` holds it (and the API shows it)."""
        if self.platform is not None:
            return {
                "platform": self.platform,
                "platform_user": self.platform_user,
                "channel_id": self.channel_id,
            }
        return {"user_uuid": self.user_uuid}


def decider_label(decided_by: dict[str, Any] | None) -> str | None:
    """`Decider.label` of a stored `decided_by` (None: nobody, e.g. an expiry)."""
    if not decided_by:
        return None
    if decided_by.get("platform"):
        return f"{decided_by['platform']}:{decided_by.get('platform_user')}"
    return f"user:{decided_by.get('user_uuid')}"


@dataclass(frozen=True, slots=True)
class Intervention:
    """One intervention as stored, less its sealed checkpoint (`Resume` carries that).
    `deciders`: who decides besides admins (the owner, or an approval step's approvers);
    `arguments`: the tool call's, secrets masked."""

    id: str  # "iv-<n>"
    kind: Kind
    status: Status
    user_uuid: str  # the workflow's owner
    deciders: tuple[str, ...]
    workflow_id: str
    step: str
    task_id: str  # the step attempt's key: the aggregate of its events
    seq: int  # 1, 2, ... within the attempt
    question: str
    expires_at: int  # Unix ms
    created_at: int
    tool: str | None = None
    arguments: dict[str, Any] | None = field(default=None, hash=False)
    notify_channel: str | None = None
    decided_at: int | None = None
    decided_by: dict[str, Any] | None = field(default=None, hash=False)
    via: str | None = None
    note: str | None = None
    reason: str | None = None
    interaction_id: str | None = None
    resumed_at: int | None = None

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @property
    def decided_by_label(self) -> str | None:
        return decider_label(self.decided_by)

    def visible_to(self, principal: Principal) -> bool:
        return (
            principal.is_admin
            or principal.user_uuid == self.user_uuid
            or principal.user_uuid in self.deciders
        )

    def wire(self) -> dict[str, Any]:
        """As the API shows it (orchestrator.wire.Intervention): never the checkpoint, nor
        a platform's interaction id."""
        return {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "user_uuid": self.user_uuid,
            "workflow_id": self.workflow_id,
            "step": self.step,
            "task_id": self.task_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "question": self.question,
            "deciders": list(self.deciders),
            "notify_channel": self.notify_channel,
            "expires_at": self.expires_at,
            "created_at": self.created_at,
            "decided_at": self.decided_at,
            "decided_by": self.decided_by,
            "via": self.via,
            "note": self.note,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class Decided:
    """What `decide` did. `replayed`: the same platform interaction again, nothing written;
    `woke`: the decision released a parked workflow (its `waiting_for`): start it."""

    intervention: Intervention
    replayed: bool = False
    woke: bool = False


@dataclass(frozen=True, slots=True)
class Resume:
    """A decided intervention taken for its continuation (`take_resume`), with the sealed
    conversation its tool call stopped in (None for an approval step)."""

    intervention: Intervention
    checkpoint: bytes | None = field(default=None, repr=False)
